package oci

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/corralhq/corral/internal/runtime"
)

// TestStartRecordsPhases: a runc sandbox's start records where its time
// went, phase by phase (docs/performance.md, "Where create time goes"):
// the supervisor's round trip, the runtime's own process (as the
// supervisor measured it), the init's watch and the wait for the agent;
// `runc state` only when the pid file and the cgroup did not settle who
// the init is, which a normal start never needs. Without the runtime's
// own time the trace could not tell runc from corral's overhead around it.
func TestStartRecordsPhases(t *testing.T) {
	env := conformanceEnv(t, runtime.Runc)
	s := env.setup(t, runtime.Runc)
	ph := runtime.NewPhases()
	cfg := runtime.Config{
		ID: fmt.Sprintf("phases-%d", os.Getpid()), Runtime: runtime.Runc, RootFS: s.RootFS,
		Resources:   runtime.Resources{CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 256 << 20, Pids: 256, Nofile: 1024},
		DefaultUser: "user", AccessToken: "phases-test-token-0123456789",
	}
	if _, err := s.Driver.Start(runtime.WithPhases(context.Background(), ph), cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Driver.Stop(context.Background(), cfg.ID, 0) })
	got := ph.Milliseconds()
	for _, p := range []string{runtime.PhaseMounts, runtime.PhaseSpec, runtime.PhaseSupervisor, runtime.PhaseRuntime, runtime.PhaseWatch, runtime.PhaseAgent} {
		if _, ok := got[p]; !ok {
			t.Errorf("phase %s not recorded: %v", p, got)
		}
	}
	if got[runtime.PhaseRuntime] <= 0 {
		t.Errorf("runtime phase %v ms: the runtime's own time is missing (%v)", got[runtime.PhaseRuntime], got)
	}
	if v, ok := got[runtime.PhaseState]; ok {
		t.Errorf("a normal start asked the runtime for its state (%v ms): %v", v, got)
	}
}
