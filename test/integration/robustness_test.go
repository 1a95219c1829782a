package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/cgroups"
	"github.com/corralhq/corral/internal/server"
	"github.com/corralhq/corral/test/testserver"
)

// TestBadInput: malformed, oversized or out-of-range requests get a 4xx
// JSON error with a stable code and change nothing.
func TestBadInput(t *testing.T) {
	need(t)
	id := create(t, nil)
	var before struct{ Sandboxes []sandboxJSON }
	call(t, "GET", "/v1/sandboxes?state=all", nil, &before)
	tests := []struct {
		name, method, path string
		body               any
		status             int
		code               string
	}{
		{"malformed json", "POST", "/v1/sandboxes", `{"template": `, 400, "invalid_json"},
		{"unknown field", "POST", "/v1/sandboxes", `{"tempalte": "base"}`, 400, "invalid_json"},
		{"trailing data", "POST", "/v1/sandboxes", `{} {}`, 400, "invalid_json"},
		{"negative memory", "POST", "/v1/sandboxes", `{"resources": {"memory_mb": -5}}`, 400, "invalid_argument"},
		{"absurd cpu", "POST", "/v1/sandboxes", `{"resources": {"cpu": 1000}}`, 400, "invalid_argument"},
		{"absurd pids", "POST", "/v1/sandboxes", `{"resources": {"pids": 100000000}}`, 400, "invalid_argument"},
		{"zero ttl", "POST", "/v1/sandboxes", `{"timeout": 0}`, 400, "invalid_argument"},
		{"unknown tier", "POST", "/v1/sandboxes", `{"tier": "huge"}`, 400, "invalid_argument"},
		{"unknown runtime", "POST", "/v1/sandboxes", `{"runtime": "docker"}`, 400, "invalid_argument"},
		{"unknown template", "POST", "/v1/sandboxes", `{"template": "nope"}`, 400, "invalid_argument"},
		{"template path", "POST", "/v1/sandboxes", `{"template": "../../etc"}`, 400, "invalid_argument"},
		{"bad env name", "POST", "/v1/sandboxes", `{"env": {"A=B": "x"}}`, 400, "invalid_argument"},
		{"network mode", "POST", "/v1/sandboxes", `{"network": "all"}`, 400, "invalid_argument"},
		{"oversized body", "POST", "/v1/sandboxes", `{"metadata": {"k": "` + strings.Repeat("x", 2<<20) + `"}}`, 413, "body_too_large"},
		{"unknown sandbox", "GET", "/v1/sandboxes/doesnotexist", nil, 404, "not_found"},
		{"kill unknown", "DELETE", "/v1/sandboxes/doesnotexist", nil, 404, "not_found"},
		{"exec unknown", "POST", "/v1/sandboxes/doesnotexist/exec", `{"command": "true"}`, 404, "not_found"},
		{"exec both forms", "POST", "/v1/sandboxes/" + id + "/exec", `{"command": "true", "cmd": ["true"]}`, 400, "invalid_argument"},
		{"exec bad user", "POST", "/v1/sandboxes/" + id + "/exec", `{"command": "true", "user": "nobody2"}`, 400, "invalid_argument"},
		{"exec negative timeout", "POST", "/v1/sandboxes/" + id + "/exec", `{"command": "true", "timeout": -1}`, 400, "invalid_argument"},
		{"exec missing cwd", "POST", "/v1/sandboxes/" + id + "/exec", `{"command": "true", "cwd": "/nonexistent"}`, 400, "invalid_argument"},
		{"timeout out of range", "POST", "/v1/sandboxes/" + id + "/timeout", `{"timeout": 1000000}`, 400, "invalid_argument"},
		{"unknown route", "GET", "/v1/nothing", nil, 404, "not_found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var e apiErr
			if got := call(t, tc.method, tc.path, tc.body, &e); got != tc.status || e.Code != tc.code {
				t.Fatalf("status %d code %q (%s); want %d %q", got, e.Code, e.Message, tc.status, tc.code)
			}
			if e.Message == "" || strings.Contains(e.Message, env.dataDir) {
				t.Fatalf("message %q is empty or leaks a host path", e.Message)
			}
		})
	}
	var after struct{ Sandboxes []sandboxJSON }
	call(t, "GET", "/v1/sandboxes?state=all", nil, &after)
	if len(after.Sandboxes) != len(before.Sandboxes) {
		t.Fatalf("bad requests changed the sandbox list: %d → %d", len(before.Sandboxes), len(after.Sandboxes))
	}
	// Without a key nothing is served.
	req, _ := http.NewRequest("GET", env.url+"/v1/sandboxes", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 401 {
		t.Fatalf("request without key: %v %v", resp.StatusCode, err)
	}
	req.Header.Set("X-API-Key", "e2b_0000000000000000000000000000000000000000")
	resp, _ = http.DefaultClient.Do(req)
	if resp.StatusCode != 401 {
		t.Fatalf("request with a wrong key: %d", resp.StatusCode)
	}
}

// TestLeak: many create/exec/kill cycles leave no mount, cgroup, runtime
// state, process or file behind.
func TestLeak(t *testing.T) {
	need(t)
	cycles := 200
	if testing.Short() {
		cycles = 20
	}
	// Start from a quiet host: sandboxes of earlier tests (some may still
	// be expiring) are killed first.
	var list struct{ Sandboxes []sandboxJSON }
	call(t, "GET", "/v1/sandboxes?team=all", nil, &list)
	for _, sb := range list.Sandboxes {
		call(t, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	}
	var snap map[string]int
	waitFor(t, "a host without sandboxes", 30*time.Second, func() bool {
		snap = hostSnapshot(t)
		return snap["sandbox cgroups"] == 0 && snap["processes of sandbox uids"] == 0
	})
	for i := 0; i < cycles; i++ {
		var sb sandboxJSON
		// Every other sandbox has a network: a veth pair, its nftables
		// rule and its proxy entry must go with it too.
		req := map[string]any{}
		if i%2 == 1 {
			req = map[string]any{"network": "allow", "allow": []string{"pypi.org"}}
		}
		if code := call(t, "POST", "/v1/sandboxes", req, &sb); code != 201 {
			t.Fatalf("cycle %d: create status %d", i, code)
		}
		if out := mustSh(t, sb.ID, "echo $((1+1))"); out != "2\n" {
			t.Fatalf("cycle %d: exec printed %q", i, out)
		}
		if code := call(t, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil); code != 200 {
			t.Fatalf("cycle %d: kill status %d", i, code)
		}
	}
	// Some counts are host-wide (zombies, links, netns): something else
	// on the host can move them for a moment. A leak stays; so the counts
	// get up to 30 s to come back before a difference is reported.
	after := hostSnapshot(t)
	for deadline := time.Now().Add(30 * time.Second); !maps.Equal(after, snap) && time.Now().Before(deadline); {
		time.Sleep(250 * time.Millisecond)
		after = hostSnapshot(t)
	}
	for what, n := range after {
		if n != snap[what] {
			t.Errorf("%s: %d before, %d after %d cycles", what, snap[what], n, cycles)
		}
	}
}

// hostSnapshot counts what sandboxes hold on the host.
func hostSnapshot(t *testing.T) map[string]int {
	t.Helper()
	count := func(script string) int {
		out, err := exec.Command("sh", "-c", script).Output()
		if err != nil {
			t.Fatalf("%s: %v", script, err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(out)))
		if err != nil {
			t.Fatalf("%s printed %q", script, out)
		}
		return n
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	running := countRunning(t)
	m := map[string]int{
		"mounts under the data dir": strings.Count(string(mounts), env.dataDir),
		"netns (ip netns)":          count("ip netns list | wc -l"),
		"links (ip link)":           count("ip -o link | wc -l"),
		"runc containers":           count("runc --root "+runcRoot(env.dataDir)+" list -q | wc -l") - running,
		"processes of sandbox uids": count(fmt.Sprintf("ps -eo uid= | awk '$1>=%d && $1<%d' | wc -l", env.srv.IDRange().Base, env.srv.IDRange().End())),
		"zombies":                   count("ps -eo stat= | grep -c '^Z' || true"),
		"sandbox nftables rules":    count("nft list chain inet " + nftTable() + " sandbox_antispoof | grep -c ' drop' || true"),
	}
	ents, _ := os.ReadDir(filepath.Join(env.dataDir, "sandboxes"))
	m["sandbox state dirs"] = len(ents) - running
	cg := 0
	for _, dir := range cgroups.Open("/corral").Dirs() {
		sub, _ := os.ReadDir(dir)
		for _, e := range sub {
			if e.IsDir() {
				cg++
			}
		}
	}
	m["sandbox cgroups"] = cg - running*len(cgroups.Open("/corral").Dirs())
	return m
}

// nftTable is the shared server's nftables table (see internal/server).
func nftTable() string {
	sum := sha256.Sum256([]byte(env.dataDir))
	return "corral_" + hex.EncodeToString(sum[:])[:5]
}

func countRunning(t *testing.T) int {
	var list struct{ Sandboxes []sandboxJSON }
	call(t, "GET", "/v1/sandboxes?team=all", nil, &list)
	return len(list.Sandboxes)
}

// TestRestartReconcile: the control plane survives its own restart: a
// sandbox that kept running is adopted, one whose record says running
// but whose runtime is gone is ended as orphaned, and runtime state with
// no record is reclaimed.
func TestRestartReconcile(t *testing.T) {
	need(t)
	ctx := context.Background()
	tmp := t.TempDir()
	for d := tmp; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o711) // sandbox root must traverse to its rootfs
	}
	data := filepath.Join(tmp, "data")
	ids, err := testserver.CopyIDFiles(filepath.Join(tmp, "etc"))
	if err != nil {
		t.Fatal(err)
	}
	open := func() (*server.Server, *httptest.Server) {
		s, err := server.Open(ctx, server.Config{DataDir: data, AgentBinary: env.bin, IDFiles: ids,
			Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		if err != nil {
			t.Fatal(err)
		}
		return s, httptest.NewServer(s.Handler)
	}
	req := func(hs *httptest.Server, key, method, path string, body any, out any) int {
		saveURL, saveKey := env.url, env.key
		env.url, env.key = hs.URL, key
		defer func() { env.url, env.key = saveURL, saveKey }()
		return call(t, method, path, body, out)
	}
	s1, h1 := open()
	var keep, lost, paused sandboxJSON
	req(h1, s1.AdminKey, "POST", "/v1/sandboxes", map[string]any{}, &keep)
	req(h1, s1.AdminKey, "POST", "/v1/sandboxes", map[string]any{}, &lost)
	req(h1, s1.AdminKey, "POST", "/v1/sandboxes", map[string]any{}, &paused)
	if code := req(h1, s1.AdminKey, "POST", "/v1/sandboxes/"+paused.ID+"/pause", nil, nil); code != 200 {
		t.Fatalf("pause before restart: %d", code)
	}
	req(h1, s1.AdminKey, "POST", "/v1/sandboxes/"+keep.ID+"/exec", map[string]any{"command": "echo kept > /tmp/state"}, nil)
	h1.Close()
	if err := s1.Close(ctx); err != nil { // sandboxes keep running
		t.Fatal(err)
	}
	// While the server is down, one sandbox's runtime disappears.
	if out, err := exec.Command("runc", "--root", runcRoot(data), "kill", lost.ID, "KILL").CombinedOutput(); err != nil {
		t.Fatalf("runc kill: %v %s", err, out)
	}
	waitFor(t, "the lost sandbox to stop", 10*time.Second, func() bool {
		out, _ := exec.Command("runc", "--root", runcRoot(data), "state", lost.ID).Output()
		return !strings.Contains(string(out), `"running"`)
	})
	s2, h2 := open()
	defer func() { h2.Close(); s2.Close(ctx) }()
	key := s2.AdminKey
	if key != s1.AdminKey {
		t.Fatal("admin key changed across restart")
	}
	var res execResult
	if code := req(h2, key, "POST", "/v1/sandboxes/"+keep.ID+"/exec", map[string]any{"command": "cat /tmp/state"}, &res); code != 200 || res.Stdout != "kept\n" {
		t.Fatalf("adopted sandbox: status %d %+v", code, res)
	}
	var got sandboxJSON
	req(h2, key, "GET", "/v1/sandboxes/"+lost.ID, nil, &got)
	if got.State != "ended" || got.EndReason != "orphaned" {
		t.Fatalf("lost sandbox record: %+v", got)
	}
	if _, err := os.Stat(filepath.Join(data, "sandboxes", lost.ID)); !os.IsNotExist(err) {
		t.Fatalf("state of the lost sandbox not reclaimed: %v", err)
	}
	if code := req(h2, key, "DELETE", "/v1/sandboxes/"+keep.ID, nil, nil); code != 200 {
		t.Fatalf("kill adopted: %d", code)
	}
	// A sandbox paused before the restart is adopted paused and resumes.
	req(h2, key, "GET", "/v1/sandboxes/"+paused.ID, nil, &got)
	if got.State != "paused" {
		t.Fatalf("paused sandbox after restart: %+v", got)
	}
	if code := req(h2, key, "POST", "/v1/sandboxes/"+paused.ID+"/resume", nil, &got); code != 200 || got.State != "running" {
		t.Fatalf("resume after restart: %d %+v", code, got)
	}
	if code := req(h2, key, "POST", "/v1/sandboxes/"+paused.ID+"/exec", map[string]any{"command": "echo ok"}, &res); code != 200 || res.Stdout != "ok\n" {
		t.Fatalf("exec after resume: %d %+v", code, res)
	}
	req(h2, key, "DELETE", "/v1/sandboxes/"+paused.ID, nil, nil)
	if cgroups.Open("/corral/" + keep.ID).Exists() {
		t.Fatal("cgroup of the adopted sandbox left after kill")
	}
}

// TestHealthz: the readiness probe needs no key and answers 200.
func TestHealthz(t *testing.T) {
	need(t)
	resp, err := http.Get(env.url + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /healthz: %v %v", resp, err)
	}
}
