package corral

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNewFromEnvCAFile defends against a client that either cannot reach
// a TLS server with a private CA or silently trusts a certificate it was
// not told to: with CORRAL_CA_FILE holding the server's CA, NewFromEnv's
// client lists over https (and sends the key); without it the
// certificate is refused before any request reaches the handler; a
// missing file or one without a PEM certificate fails NewFromEnv naming
// the file.
func TestNewFromEnvCAFile(t *testing.T) {
	var got []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"sandboxes":[]}`))
	}))
	defer srv.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CORRAL_URL", srv.URL)
	t.Setenv("CORRAL_API_KEY", "e2b_"+strings.Repeat("a", 40))
	ctx := context.Background()

	t.Setenv(CAFileEnv, "")
	c, err := NewFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.List(ctx, ListOptions{}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("list without the CA: %v, want a certificate error", err)
	}
	if len(got) != 0 {
		t.Errorf("the handler saw %d requests without a trusted certificate", len(got))
	}

	t.Setenv(CAFileEnv, ca)
	if c, err = NewFromEnv(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.List(ctx, ListOptions{}); err != nil {
		t.Errorf("list with CORRAL_CA_FILE: %v", err)
	}
	if len(got) != 1 {
		t.Errorf("handler saw %d requests, want 1", len(got))
	}

	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{filepath.Join(dir, "missing.pem"), notPEM} {
		t.Setenv(CAFileEnv, f)
		if _, err := NewFromEnv(); err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("CORRAL_CA_FILE=%s: %v, want an error naming the file", f, err)
		}
	}
}
