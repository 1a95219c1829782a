package integration

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// cliWithKey runs the corral binary against the server at url with key and
// returns stdout, stderr and the exit code.
func cliWithKey(t *testing.T, url, key string, args ...string) (string, string, int) {
	t.Helper()
	return cliAs(t, url, key, "", args...)
}

// statusWith answers the status of GET url+path with key.
func statusWith(t *testing.T, url, path, key string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", url+path, nil)
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestKeysSurviveRestart defends against a restart reviving a revoked
// admin key, end to end with the real binary: `corral serve` makes
// DATA/admin.key on first start; through the CLI an admin makes a second
// admin key and a member key, and revokes admin.key's key, which fails
// its very next request (401). After the server is stopped and started
// again on the same data dir (which adds admin.key to the store again)
// the revoked key still gets 401 and the log says admin.key is revoked,
// while the other keys work as before: the member key on its team's
// routes, refused (403) on the key routes.
func TestKeysSurviveRestart(t *testing.T) {
	need(t)
	tmp := t.TempDir()
	for d := tmp; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o711) // sandbox root must traverse to its rootfs
	}
	data := filepath.Join(tmp, "data")
	addr := freeAddr(t)
	args := []string{"--no-network", "--kill-on-shutdown", "--kill-grace", "1s"}
	var cur *serveProc
	t.Cleanup(func() {
		if cur != nil && cur.running() {
			_ = cur.signal(t, syscall.SIGTERM)
		}
		if t.Failed() && cur != nil {
			t.Logf("corral serve log (tail):\n%s", logTail(cur.log.String(), 60))
		}
	})
	cur = startServe(t, data, addr, args...)
	first := cur.key
	if !strings.HasPrefix(first, "e2b_") || len(first) != 44 {
		t.Fatalf("admin.key %q: want e2b_ + 40 hex", first)
	}
	out, errOut, code := cliWithKey(t, cur.url, first, "key", "ls", "--json")
	if code != 0 || !strings.Contains(out, `"team": "default"`) || !strings.Contains(out, `"role": "admin"`) || !strings.Contains(out, `"name": "admin"`) {
		t.Fatalf("first start's key list: %d %q %q; want admin.key as admin of team default", code, out, errOut)
	}
	newKey := func(team, role string) (id, key string) {
		out, errOut, code := cliWithKey(t, cur.url, first, "key", "create", "--team", team, "--role", role)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if code != 0 || len(lines) != 5 {
			t.Fatalf("key create --team %s --role %s: %d %q %q", team, role, code, out, errOut)
		}
		return strings.TrimSpace(strings.TrimPrefix(lines[0], "id:")), lines[4]
	}
	_, admin2 := newKey("ops", "admin")
	_, member := newKey("research", "member")

	out, _, code = cliWithKey(t, cur.url, first, "key", "ls")
	firstID := ""
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 3 && f[1] == "default" && f[3] == "admin" {
			firstID = f[0]
		}
	}
	if code != 0 || firstID == "" {
		t.Fatalf("key ls: %d %q", code, out)
	}
	if out, errOut, code := cliWithKey(t, cur.url, admin2, "key", "revoke", firstID); code != 0 || !strings.Contains(out, "revoked") {
		t.Fatalf("revoke admin.key's key: %d %q %q", code, out, errOut)
	}
	if s := statusWith(t, cur.url, "/v1/keys", first); s != 401 {
		t.Fatalf("the revoked admin key's next request: %d, want 401", s)
	}

	if err := cur.signal(t, syscall.SIGTERM); err != nil && !strings.Contains(err.Error(), "exit status 0") {
		t.Fatalf("corral serve exit: %v", err)
	}
	cur = startServe(t, data, addr, args...)
	if cur.key != first {
		t.Fatalf("admin.key changed across the restart")
	}
	if s := statusWith(t, cur.url, "/v1/keys", first); s != 401 {
		t.Fatalf("after a restart the revoked admin key answers %d, want 401: the restart revived it", s)
	}
	if !strings.Contains(cur.log.String(), "admin.key holds a revoked key") {
		t.Errorf("the restart's log does not say admin.key is revoked:\n%s", logTail(cur.log.String(), 20))
	}
	for _, c := range []struct {
		what, path, key string
		want            int
	}{
		{"second admin", "/v1/keys?team=all", admin2, 200},
		{"member on its team's list", "/v1/sandboxes", member, 200},
		{"member on the keys", "/v1/keys", member, 403},
	} {
		if s := statusWith(t, cur.url, c.path, c.key); s != c.want {
			t.Errorf("%s after the restart: GET %s = %d, want %d", c.what, c.path, s, c.want)
		}
	}
}
