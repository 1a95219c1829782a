package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/cgroups"
)

// TestPauseResume: pause freezes every process of the sandbox with the
// cgroup freezer (memory kept), commands are refused while paused, a
// second pause conflicts, and resume thaws it with files and processes
// intact.
func TestPauseResume(t *testing.T) {
	need(t)
	id := create(t, nil)
	// Waits until the sleeper runs, so that the pause freezes it.
	mustSh(t, id, "echo kept > /tmp/keep; (setsid sleep 1000 >/dev/null 2>&1 &); i=0; until pgrep -x sleep >/dev/null; do i=$((i+1)); [ $i -gt 300 ] && exit 1; sleep 0.1; done", map[string]any{"timeout": 60})
	var sb sandboxJSON
	if code := call(t, "POST", "/v1/sandboxes/"+id+"/pause", nil, &sb); code != 200 || sb.State != "paused" {
		t.Fatalf("pause: %d %+v", code, sb)
	}
	if !cgroups.Unified() {
		b, err := os.ReadFile(filepath.Join(cgroups.Root, "freezer", "corral", id, "freezer.state"))
		if err != nil || strings.TrimSpace(string(b)) != "FROZEN" {
			t.Fatalf("freezer.state = %q (%v), want FROZEN", b, err)
		}
	}
	var e apiErr
	if code := call(t, "POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"command": "true"}, &e); code != 409 || e.Code != "conflict" {
		t.Fatalf("exec while paused: %d %+v", code, e)
	}
	if code := call(t, "POST", "/v1/sandboxes/"+id+"/pause", nil, &e); code != 409 {
		t.Fatalf("second pause: %d", code)
	}
	var list struct{ Sandboxes []sandboxJSON }
	call(t, "GET", "/v1/sandboxes?state=paused", nil, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != id {
		t.Fatalf("list state=paused: %+v", list.Sandboxes)
	}
	if code := call(t, "POST", "/v1/sandboxes/"+id+"/resume", map[string]any{"timeout": 120}, &sb); code != 200 || sb.State != "running" {
		t.Fatalf("resume: %d %+v", code, sb)
	}
	if out := mustSh(t, id, "cat /tmp/keep; pgrep -c -x sleep"); out != "kept\n1\n" {
		t.Fatalf("after resume: %q", out)
	}
	if code := call(t, "POST", "/v1/sandboxes/"+id+"/resume", nil, &e); code != 409 {
		t.Fatalf("resume of a running sandbox: %d", code)
	}
	// A paused sandbox can be killed, and nothing is left.
	call(t, "POST", "/v1/sandboxes/"+id+"/pause", nil, nil)
	if code := call(t, "DELETE", "/v1/sandboxes/"+id, nil, &sb); code != 200 || sb.EndReason != "killed" {
		t.Fatalf("kill paused: %d %+v", code, sb)
	}
	assertNoTrace(t, id)
}
