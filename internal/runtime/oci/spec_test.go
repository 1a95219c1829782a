package oci

import (
	"fmt"
	goruntime "runtime"
	"testing"

	"github.com/corralhq/corral/internal/runtime"
)

// TestSeccompNativeArchOnly: a sandbox's seccomp filter, under runc and
// under gVisor (which loads it with --oci-seccomp), admits the host's own
// system call ABI only, not Docker's compat ABIs (i386 and x32 on amd64),
// so no system call reaches the kernel's compat entry paths.
func TestSeccompNativeArchOnly(t *testing.T) {
	want, ok := nativeArches[goruntime.GOARCH]
	if !ok {
		t.Skipf("no native seccomp architecture known for %s", goruntime.GOARCH)
	}
	for _, rt := range []runtime.Runtime{runtime.Runc, runtime.GVisor} {
		s, err := buildSpec(specInput{cfg: runtime.Config{ID: "x", Runtime: rt}, rootfs: "/r", runDir: "/d", agentBin: "/a",
			uidBase: 100000, idRange: 65536, cgroupDir: "/corral/x", tmpSource: "/r/tmp"})
		if err != nil {
			t.Fatal(err)
		}
		if s.Linux.Seccomp == nil {
			t.Fatalf("%s: no seccomp profile", rt)
		}
		got := s.Linux.Seccomp.Architectures
		if len(got) != 1 || got[0] != want {
			t.Fatalf("%s: seccomp architectures %v, want only %s", rt, got, want)
		}
		if len(s.Linux.Seccomp.Syscalls) == 0 {
			t.Fatalf("%s: seccomp profile has no rules", rt)
		}
	}
}

// TestSandboxOOMScoreIsDefault: a sandbox's processes get the default
// oom_score_adj (0) from the spec instead of inheriting the supervisor's
// negative one through the runtime, which would make the OOM killer
// spare a sandbox's memory hog and pick host processes instead.
func TestSandboxOOMScoreIsDefault(t *testing.T) {
	for _, rt := range []runtime.Runtime{runtime.Runc, runtime.GVisor} {
		s, err := buildSpec(specInput{cfg: runtime.Config{ID: "x", Runtime: rt}, rootfs: "/r", runDir: "/d", agentBin: "/a",
			uidBase: 100000, idRange: 65536, cgroupDir: "/corral/x", tmpSource: "/r/tmp"})
		if err != nil {
			t.Fatal(err)
		}
		if adj := s.Process.OOMScoreAdj; adj == nil || *adj != 0 {
			t.Fatalf("%s: spec oom_score_adj %v, want 0", rt, adj)
		}
	}
}

// TestGVisorSeccompAdmitsClone3: runsc's OCI seccomp answers EPERM to
// every refusal, ignoring errnoRet, so Docker's "clone3 → ENOSYS" rule
// would make glibc's pthread_create fail instead of falling back to
// clone. Under gVisor that rule admits clone3; under runc it stays
// ENOSYS; every other rule is the same under both.
func TestGVisorSeccompAdmitsClone3(t *testing.T) {
	rules := map[runtime.Runtime]map[string]string{}
	for _, rt := range []runtime.Runtime{runtime.Runc, runtime.GVisor} {
		s, err := buildSpec(specInput{cfg: runtime.Config{ID: "x", Runtime: rt}, rootfs: "/r", runDir: "/d", agentBin: "/a",
			uidBase: 100000, idRange: 65536, cgroupDir: "/corral/x", tmpSource: "/r/tmp"})
		if err != nil {
			t.Fatal(err)
		}
		rules[rt] = map[string]string{}
		for _, r := range s.Linux.Seccomp.Syscalls {
			for _, n := range r.Names {
				errno := ""
				if r.ErrnoRet != nil {
					errno = fmt.Sprint(*r.ErrnoRet)
				}
				rules[rt][n] += fmt.Sprintf("%s %s %v;", r.Action, errno, r.Args)
			}
		}
	}
	if got := rules[runtime.Runc]["clone3"]; got != "SCMP_ACT_ERRNO 38 [];" {
		t.Errorf("runc clone3 rule %q, want ENOSYS", got)
	}
	if got := rules[runtime.GVisor]["clone3"]; got != "SCMP_ACT_ALLOW  [];" {
		t.Errorf("gVisor clone3 rule %q, want allow", got)
	}
	for n, r := range rules[runtime.Runc] {
		if n != "clone3" && rules[runtime.GVisor][n] != r {
			t.Errorf("rule for %s: runc %q, gVisor %q", n, r, rules[runtime.GVisor][n])
		}
	}
	if len(rules[runtime.Runc]) != len(rules[runtime.GVisor]) {
		t.Errorf("%d system calls with rules under runc, %d under gVisor", len(rules[runtime.Runc]), len(rules[runtime.GVisor]))
	}
}
