package api_test

import (
	"io"
	"net/http"
	"net/url"
	"testing"

	"github.com/corralhq/corral/internal/runtime/runtimetest"
)

// TestFileDownloadsAreIsolated defends against a sandbox's file running
// as a page of the API's origin, which is the operator console's: an
// agent writes an HTML file with a script, and whichever route serves it
// — the native agent route, envd's header route, or a signed /files URL
// an operator might open in the browser — answers with CSP sandbox (an
// opaque origin, no script) and nosniff, while the bytes are unchanged.
func TestFileDownloadsAreIsolated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10)
	var sb e2bSandbox
	if st := e.call("POST", "/sandboxes", apiKey, map[string]any{}, &sb); st != http.StatusCreated {
		t.Fatalf("create: %d", st)
	}
	const page = `<html><script>fetch("/v1/sandboxes")</script><form>API key: <input name=k></form></html>`
	hdr := []string{"E2b-Sandbox-Id", sb.SandboxID, "X-Access-Token", sb.EnvdAccessToken, "Content-Type", "application/octet-stream"}
	if st := e.call("POST", "/files?path=/home/user/evil.html", "", page, nil, hdr...); st != http.StatusOK {
		t.Fatalf("upload: %d", st)
	}
	signed := "/files?path=/home/user/evil.html&username=user&signature=" + url.QueryEscape(runtimetest.Sign("/home/user/evil.html", "read", "user", sb.EnvdAccessToken, 0))
	cases := []struct {
		name, path string
		hdr        map[string]string
	}{
		{"native agent route", "/v1/sandboxes/" + sb.SandboxID + "/agent/files?path=/home/user/evil.html&username=user", map[string]string{"X-API-Key": apiKey}},
		{"envd header route", "/files?path=/home/user/evil.html&username=user", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "X-Access-Token": sb.EnvdAccessToken}},
		{"signed URL", signed, nil},
	}
	for _, c := range cases {
		req, _ := http.NewRequest("GET", e.srv.URL+c.path, nil)
		for k, v := range c.hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != page {
			t.Fatalf("%s: %d %q", c.name, resp.StatusCode, body)
		}
		if csp, ns := resp.Header.Get("Content-Security-Policy"), resp.Header.Get("X-Content-Type-Options"); csp != "sandbox; default-src 'none'" || ns != "nosniff" {
			t.Errorf("%s: Content-Security-Policy %q, X-Content-Type-Options %q: the file would run as a page of the API's origin", c.name, csp, ns)
		}
	}
}
