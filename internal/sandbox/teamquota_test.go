package sandbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
)

// TestTeamQuotaCountsPausedAndAdopted defends against evading a team's
// quota by pausing sandboxes or by restarting the server: a paused
// sandbox keeps its team's slot, CPUs and memory (its resume needs no
// new admission), and after a restart the adopted sandboxes count in
// their team again (team, CPUs and memory from the record), so the
// team's next create is still refused naming team_sandboxes while
// another team creates. A stored override is applied at start.
func TestTeamQuotaCountsPausedAndAdopted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	adm := func() *govern.Admission {
		return govern.NewAdmission(govern.AdmissionConfig{MaxConcurrent: 50, MaxPerAgent: 50, AgentRate: 1000, AgentBurst: 1000,
			Team: govern.TeamQuota{MaxSandboxes: 1}})
	}
	cfg := testConfig(t)
	cfg.Admission = adm()
	h := newHarness(t, cfg)
	two := int64(2)
	if err := h.m.SetTeamQuota(ctx, store.TeamQuota{Team: "a", MaxSandboxes: &two}); err != nil {
		t.Fatal(err)
	}
	running := h.create(sandbox.CreateRequest{Team: "a"})
	paused := h.create(sandbox.CreateRequest{Team: "a"})
	if _, err := h.m.Pause(ctx, paused.ID); err != nil {
		t.Fatal(err)
	}
	refused := func(what string) {
		t.Helper()
		_, err := h.m.Create(ctx, sandbox.CreateRequest{Team: "a"})
		var ce *govern.CapacityError
		if !errors.As(err, &ce) || ce.Limit != govern.CapacityTeamSandboxes {
			t.Fatalf("%s: team a's third create: %v, want team_sandboxes", what, err)
		}
	}
	refused("with one paused")

	h.m.Shutdown(ctx, false)
	h.cfg.Admission = adm()
	h.m = h.open()
	refused("after a restart")
	st := h.m.Admission().TeamStats("a")
	light := sandbox.Tiers[sandbox.DefaultTier].Resources
	if st.Running != 2 || st.CPUs != 2*light.CPU || st.MemoryMB != 2*light.MemoryMB {
		t.Fatalf("team a after the restart: %+v, want 2 sandboxes of tier %s", st, sandbox.DefaultTier)
	}
	h.create(sandbox.CreateRequest{Team: "b"})
	if _, err := h.m.Resume(ctx, paused.ID, 0); err != nil {
		t.Fatalf("resume of the adopted paused sandbox: %v", err)
	}
	if _, err := h.m.Kill(ctx, running.ID); err != nil {
		t.Fatal(err)
	}
	h.create(sandbox.CreateRequest{Team: "a"})
}

// TestSetTeamQuotaInvalid: a bad override is refused naming the field
// and nothing is stored.
func TestSetTeamQuotaInvalid(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t))
	neg := -1.0
	err := h.m.SetTeamQuota(context.Background(), store.TeamQuota{Team: "a", MaxCPUs: &neg})
	var inv *govern.InvalidError
	if !errors.As(err, &inv) || inv.Msg[:8] != "max_cpus" {
		t.Fatalf("SetTeamQuota: %v, want an InvalidError naming max_cpus", err)
	}
	if _, err := h.st.GetTeamQuota(context.Background(), "a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("stored anyway: %v", err)
	}
}
