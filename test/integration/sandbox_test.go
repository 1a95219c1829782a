package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/cgroups"
)

// TestUsersAndUserNamespace checks that code runs as uid 1000 by default,
// as root on request, that sudo works for user, and that sandbox root is
// an unprivileged host uid (the base of the server's uid range) through
// the user namespace.
func TestUsersAndUserNamespace(t *testing.T) {
	need(t)
	id := create(t, nil)
	tests := []struct {
		name, cmd string
		opts      map[string]any
		want      string
	}{
		{"default user", "id -un; id -u; pwd", nil, "user\n1000\n/home/user\n"},
		{"root on request", "id -u", map[string]any{"user": "root"}, "0\n"},
		{"passwordless sudo", "sudo -n id -u", nil, "0\n"},
		{"root maps to the range's base", "cat /proc/self/uid_map | tr -s ' ' | sed 's/^ //'", nil, fmt.Sprintf("0 %d 65536\n", env.srv.IDRange().Base)},
		{"python3 and python", "python3 -c 'print(1)'; python -c 'print(2)'", nil, "1\n2\n"},
		{"argv without shell", "", nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.cmd == "" {
				var res execResult
				if code := call(t, "POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": []string{"printf", "%s|", "a b", "$HOME"}}, &res); code != http.StatusOK {
					t.Fatalf("status %d", code)
				}
				if res.Stdout != "a b|$HOME|" {
					t.Fatalf("argv exec printed %q", res.Stdout)
				}
				return
			}
			if got := mustSh(t, id, tc.cmd, tc.opts); got != tc.want {
				t.Fatalf("%q printed %q, want %q", tc.cmd, got, tc.want)
			}
		})
	}
}

// TestWritableRootAndTmp checks that a sandbox writes to / and /tmp like a
// normal machine while the template stays untouched.
func TestWritableRootAndTmp(t *testing.T) {
	need(t)
	id := create(t, nil)
	mustSh(t, id, "echo hi > /tmp/a && echo root > /rootfile && cat /tmp/a /rootfile", map[string]any{"user": "root"})
	if out := mustSh(t, id, "cat /tmp/a /rootfile"); out != "hi\nroot\n" {
		t.Fatalf("read back %q", out)
	}
	other := create(t, nil)
	if res := sh(t, other, "test -e /rootfile"); res.ExitCode == 0 {
		t.Fatal("a file written in one sandbox is visible in another: the template was modified")
	}
	if !strings.Contains(mustSh(t, id, "ls /"), "rootfile") {
		t.Fatal("ls / does not list the new file")
	}
}

// TestLimitsApplied: the requested limits are in the sandbox's cgroup on
// the host (cgroup v1 or v2) and in its rlimits; swap equals memory.
func TestLimitsApplied(t *testing.T) {
	need(t)
	id := create(t, map[string]any{"resources": map[string]any{"cpu": 0.5, "memory_mb": 128, "pids": 100, "nofile": 2048}})
	g := cgroups.Open("/corral/" + id)
	read := func(controller, name string) string {
		p := filepath.Join(cgroups.Root, controller, g.Path, name)
		if cgroups.Unified() {
			p = filepath.Join(cgroups.Root, g.Path, name)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	want := map[[2]string]string{
		{"pids", "pids.max"}:                      "100",
		{"memory", "memory.limit_in_bytes"}:       "134217728",
		{"memory", "memory.memsw.limit_in_bytes"}: "134217728",
		{"cpu", "cpu.cfs_quota_us"}:               "50000",
		{"cpu", "cpu.cfs_period_us"}:              "100000",
	}
	if cgroups.Unified() {
		want = map[[2]string]string{
			{"", "pids.max"}:        "100",
			{"", "memory.max"}:      "134217728",
			{"", "memory.swap.max"}: "0",
			{"", "cpu.max"}:         "50000 100000",
		}
	}
	for k, v := range want {
		if got := read(k[0], k[1]); got != v {
			t.Errorf("%s = %q, want %q", k[1], got, v)
		}
	}
	if out := mustSh(t, id, "ulimit -n"); out != "2048\n" {
		t.Errorf("ulimit -n = %q, want 2048", out)
	}
	var sb sandboxJSON
	call(t, "GET", "/v1/sandboxes/"+id, nil, &sb)
	if sb.Resources.CPU != 0.5 || sb.Resources.MemoryMB != 128 || sb.Resources.Pids != 100 || sb.Resources.DiskMB != 100 {
		t.Errorf("API shows resources %+v", sb.Resources)
	}
}

// TestAgentNeedsToken: the agent refuses requests without the sandbox's
// access token, even from the host over its socket.
func TestAgentNeedsToken(t *testing.T) {
	need(t)
	id := create(t, nil)
	bare := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return env.srv.Manager.Dial(ctx, id)
	}}}
	body := strings.NewReader(`{"path": "/etc/hostname"}`)
	resp, err := bare.Post("http://agent/filesystem.Filesystem/Stat", "application/json", body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("agent answered %d without a token, want 401", resp.StatusCode)
	}
	resp, err = env.srv.Manager.AgentHTTP(id).Post("http://agent/filesystem.Filesystem/Stat", "application/json", strings.NewReader(`{"path": "/etc/hostname"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("agent answered %d with the token, want 200", resp.StatusCode)
	}
	if out := mustSh(t, id, "cat /run/corral/token 2>&1 || true"); !strings.Contains(out, "Permission denied") {
		t.Fatalf("user can read the agent token: %q", out)
	}
}
