package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/api"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	corral "github.com/corralhq/corral/sdk/go"
)

// keyServer is the real API server over a real SQLite store (no
// sandboxes: the key routes need none) whose admin key is returned.
func keyServer(t *testing.T) (string, string) {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	admin := store.NewKeyValue()
	if err := st.AddAPIKey(context.Background(), "admin", admin, "", store.RoleAdmin); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.Config{}, new(sandbox.Manager), st, slog.New(slog.NewTextHandler(io.Discard, nil))))
	t.Cleanup(func() { srv.Close(); st.Close() })
	return srv.URL, admin
}

// TestCLIKeys: `corral key create` prints id, team, role and name lines
// and the key last (or one JSON object); `key ls` lists ids and never a
// value; `key revoke` makes the key fail its next call (401); a member
// key is refused on the key commands (forbidden); bad input is a usage
// error (exit 2) with the server's message, an unknown id exit 1.
func TestCLIKeys(t *testing.T) {
	url, admin := keyServer(t)
	t.Setenv("CORRAL_URL", url)
	t.Setenv("CORRAL_API_KEY", admin)

	out, errOut, code := runCLI(t, "key", "create", "--team", "research", "--name", "ci")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 0 || len(lines) != 5 {
		t.Fatalf("key create: %d %q %q", code, out, errOut)
	}
	member := lines[4]
	id := strings.TrimSpace(strings.TrimPrefix(lines[0], "id:"))
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(member) || id != store.KeyID(store.HashKey(member)) ||
		lines[1] != "team: research" || lines[2] != "role: member" || lines[3] != "name: ci" {
		t.Fatalf("key create printed %q", out)
	}

	out, _, code = runCLI(t, "key", "create", "--team", "ops", "--role", "admin", "--json")
	var nk corral.NewKey
	if code != 0 || json.Unmarshal([]byte(out), &nk) != nil || nk.Role != "admin" || nk.Team != "ops" || !strings.HasPrefix(nk.Key, "e2b_") || nk.ID == "" {
		t.Fatalf("key create --json: %d %q", code, out)
	}

	for _, c := range []struct {
		args       []string
		code       int
		msg        string
		mustHave   []string
		mustNotHas []string
	}{
		{[]string{"key", "ls"}, 0, "", []string{"ID", store.KeyID(store.HashKey(admin))}, []string{id, nk.ID}},
		{[]string{"key", "ls", "--team", "research"}, 0, "", []string{id}, []string{nk.ID}},
		{[]string{"key", "ls", "--team", "all"}, 0, "", []string{id, nk.ID, "research", "ops"}, nil},
		{[]string{"key", "create"}, 2, "--team is required", nil, nil},
		{[]string{"key", "create", "--team", "all"}, 2, "reserved", nil, nil},
		{[]string{"key", "create", "--team", "x", "--role", "root"}, 2, "role", nil, nil},
		{[]string{"key", "revoke"}, 2, "key id", nil, nil},
		{[]string{"key", "revoke", "0123456789abcdef"}, 1, "not found", nil, nil},
	} {
		out, errOut, code := runCLI(t, c.args...)
		if code != c.code || !strings.Contains(errOut, c.msg) {
			t.Errorf("%q: exit %d stderr %q; want %d containing %q", c.args, code, errOut, c.code, c.msg)
		}
		for _, s := range c.mustHave {
			if !strings.Contains(out, s) {
				t.Errorf("%q: output lacks %q:\n%s", c.args, s, out)
			}
		}
		for _, s := range append(c.mustNotHas, member[4:], nk.Key[4:], admin[4:]) {
			if strings.Contains(out, s) {
				t.Errorf("%q: output shows %q:\n%s", c.args, s, out)
			}
		}
	}

	// A member key may not manage keys.
	t.Setenv("CORRAL_API_KEY", member)
	if _, errOut, code := runCLI(t, "key", "ls"); code != 1 || !strings.Contains(errOut, "forbidden") {
		t.Fatalf("member key ls: exit %d %q; want 1 forbidden", code, errOut)
	}

	// Revocation: the revoked admin key fails its next call.
	t.Setenv("CORRAL_API_KEY", admin)
	out, errOut, code = runCLI(t, "key", "revoke", nk.ID)
	if code != 0 || !strings.Contains(out, nk.ID) || !strings.Contains(out, "revoked") {
		t.Fatalf("key revoke: %d %q %q", code, out, errOut)
	}
	t.Setenv("CORRAL_API_KEY", nk.Key)
	if _, errOut, code := runCLI(t, "key", "ls"); code != 1 || !strings.Contains(errOut, "unauthenticated") {
		t.Fatalf("revoked key: exit %d %q; want 1 unauthenticated", code, errOut)
	}
	t.Setenv("CORRAL_API_KEY", admin)
	out, _, code = runCLI(t, "key", "ls", "--team", "ops", "--json")
	var list []corral.KeyInfo
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].RevokedAt == nil {
		t.Fatalf("ls after revoke: %d %q", code, out)
	}
	// The last admin key stays.
	if _, errOut, code := runCLI(t, "key", "revoke", store.KeyID(store.HashKey(admin))); code != 1 || !strings.Contains(errOut, "last unrevoked admin key") {
		t.Fatalf("revoking the last admin key: exit %d %q", code, errOut)
	}
}
