package integration

import (
	"os"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/runtime/oci"
)

// needGVisor skips unless the server's gVisor runtime is the pinned
// runsc build (make runsc, which make test runs; a fallback to Debian's
// 2022 runsc has no network and no volumes).
func needGVisor(t *testing.T) {
	t.Helper()
	need(t)
	r, err := oci.FindRunsc("", "")
	if err != nil {
		t.Skipf("gVisor: %v", err)
	}
	if r.Path != oci.CachedRunsc("") || r.Legacy {
		t.Skipf("gVisor: %s; make runsc builds the pinned runsc these tests need", r.Note)
	}
}

// TestGVisorRuntime: runtime "gvisor" really runs the sandbox under
// gVisor's kernel (its own kernel release, unlike the host), with the
// default user and the host cgroup limits applied. Its boot log is not
// readable: the sandbox's seccomp profile refuses syslog(2) under gVisor
// as under runc.
func TestGVisorRuntime(t *testing.T) {
	needGVisor(t)
	id := create(t, map[string]any{"runtime": "gvisor"})
	host, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	out := mustSh(t, id, "uname -r; id -un; dmesg >/dev/null 2>&1 && echo dmesg || echo no dmesg")
	rel, rest, _ := strings.Cut(out, "\n")
	if !strings.Contains(rel, "gvisor") || rel == strings.TrimSpace(string(host)) || rest != "user\nno dmesg\n" {
		t.Fatalf("under runtime gvisor: %q (host kernel %q)", out, strings.TrimSpace(string(host)))
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
