package integration

import (
	"os/exec"
	"testing"
)

// needGVisor skips when runsc is not installed.
func needGVisor(t *testing.T) {
	t.Helper()
	need(t)
	if _, err := exec.LookPath("runsc"); err != nil {
		t.Skip("runsc (gVisor) is not installed: apt-get install runsc")
	}
}

// TestGVisorRuntime: runtime "gvisor" really runs the sandbox under
// gVisor's kernel (which reports itself as Linux 4.4.0, unlike the host),
// with the default user and the host cgroup limits applied.
func TestGVisorRuntime(t *testing.T) {
	needGVisor(t)
	id := create(t, map[string]any{"runtime": "gvisor"})
	if out := mustSh(t, id, "uname -r; id -un; dmesg | head -1 | grep -c gVisor"); out != "4.4.0\nuser\n1\n" {
		t.Fatalf("under runtime gvisor: %q", out)
	}
	var sb sandboxJSON
	call(t, "GET", "/v1/sandboxes/"+id, nil, &sb)
	if sb.Runtime != "gvisor" {
		t.Fatalf("record says runtime %q", sb.Runtime)
	}
}

// eachRuntime runs fn once per runtime as subtests, the same suite for
// runc and runsc (gVisor), as containerd runs one suite for every
// snapshotter.
func eachRuntime(t *testing.T, fn func(t *testing.T, rt string)) {
	t.Run("runc", func(t *testing.T) { need(t); fn(t, "runc") })
	t.Run("gvisor", func(t *testing.T) { needGVisor(t); fn(t, "gvisor") })
}
