package sandbox_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/runtime/runtimetest"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/proto/process"
)

// TestCreateDefaults: a create that names nothing gets the default
// template, runtime, tier and TTL, is recorded running, and the driver
// starts it with the tier's limits, the record's access token and the
// sandbox markers in its env.
func TestCreateDefaults(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t))
	sb := h.create(sandbox.CreateRequest{})
	rec := h.record(sb.ID)
	tier := sandbox.Tiers[sandbox.DefaultTier]
	if rec.State != store.StateRunning || rec.Template != "base" || rec.Runtime != string(runtime.Runc) ||
		rec.Tier != sandbox.DefaultTier || rec.Resources != tier.Resources || rec.CommandTimeout != tier.CommandTimeout {
		t.Fatalf("record = %+v", rec)
	}
	if ttl := rec.ExpiresAt.Sub(rec.CreatedAt); ttl < 299*time.Second || ttl > 301*time.Second {
		t.Errorf("TTL = %v, want the default 300 s", ttl)
	}
	cfg, ok := h.d.Config(sb.ID)
	if !ok {
		t.Fatal("the driver does not hold the sandbox")
	}
	want := runtime.Resources{CPU: tier.Resources.CPU, MemoryBytes: tier.Resources.MemoryMB << 20,
		DiskBytes: tier.Resources.DiskMB << 20, Pids: tier.Resources.Pids, Nofile: tier.Resources.Nofile}
	if cfg.Resources != want || cfg.RootFS != h.rootfs || cfg.AccessToken != rec.AccessToken || rec.AccessToken == "" ||
		cfg.Env["E2B_SANDBOX"] != "true" || cfg.Env["CORRAL_SANDBOX"] != "true" || cfg.DefaultUser != "user" {
		t.Fatalf("driver config = %+v", cfg)
	}
	if !h.m.Running(sb.ID) || h.m.Paused(sb.ID) {
		t.Errorf("Running %v Paused %v", h.m.Running(sb.ID), h.m.Paused(sb.ID))
	}
}

// TestCreateTiers: each tier's limits reach the record and the driver;
// explicit resources override the tier.
func TestCreateTiers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t))
	for name, tier := range sandbox.Tiers {
		sb := h.create(sandbox.CreateRequest{Tier: name})
		cfg, _ := h.d.Config(sb.ID)
		if sb.Resources != tier.Resources || cfg.Resources.MemoryBytes != tier.Resources.MemoryMB<<20 || cfg.Resources.Pids != tier.Resources.Pids {
			t.Errorf("tier %s: record %+v, driver %+v", name, sb.Resources, cfg.Resources)
		}
	}
	sb := h.create(sandbox.CreateRequest{Tier: "medium", Resources: &sandbox.ResourceRequest{MemoryMB: 300}})
	if sb.Resources.MemoryMB != 300 || sb.Resources.CPU != sandbox.Tiers["medium"].Resources.CPU {
		t.Errorf("override: %+v", sb.Resources)
	}
}

// TestCreateRefusesInvalid: bad input gets a clear error of the right
// kind, and nothing is recorded or started.
func TestCreateRefusesInvalid(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	// A server on Debian's 2022 runsc (the fallback) refuses gVisor
	// sandboxes with a network or volumes.
	cfg.GVisorLegacy = true
	h := newHarness(t, cfg)
	long := strings.Repeat("x", sandbox.MaxMetadataValue+1)
	many := map[string]string{}
	for i := 0; i <= sandbox.MaxEnvVars; i++ {
		many["V"+strings.Repeat("A", i%50)+string(rune('A'+i%26))+strings.Repeat("B", i/26)] = "x"
	}
	cases := []struct {
		name string
		req  sandbox.CreateRequest
		want error // nil: an *InvalidError
	}{
		{"template name", sandbox.CreateRequest{Template: "../etc"}, nil},
		{"unknown template", sandbox.CreateRequest{Template: "nosuch"}, nil},
		{"unknown version", sandbox.CreateRequest{Template: "base:v9"}, nil},
		{"runtime", sandbox.CreateRequest{Runtime: "kvm"}, nil},
		{"tier", sandbox.CreateRequest{Tier: "huge"}, nil},
		{"timeout 0", sandbox.CreateRequest{Timeout: ptr[int64](0)}, nil},
		{"timeout over max", sandbox.CreateRequest{Timeout: ptr(int64(sandbox.MaxTTL/time.Second) + 1)}, nil},
		{"command timeout", sandbox.CreateRequest{CommandTimeout: ptr[int64](-1)}, nil},
		{"memory", sandbox.CreateRequest{Resources: &sandbox.ResourceRequest{MemoryMB: 1}}, nil},
		{"env name", sandbox.CreateRequest{Env: map[string]string{"BAD-NAME": "x"}}, nil},
		{"env count", sandbox.CreateRequest{Env: many}, nil},
		{"metadata value", sandbox.CreateRequest{Metadata: map[string]string{"k": long}}, nil},
		{"network mode", sandbox.CreateRequest{Network: "everything"}, nil},
		{"secrets without network", sandbox.CreateRequest{Secrets: []string{"gh"}}, nil},
		{"gvisor with network under a legacy runsc", sandbox.CreateRequest{Runtime: "gvisor", Network: "all-public"}, nil},
		{"unknown snapshot", sandbox.CreateRequest{Snapshot: "snap-nope"}, nil},
		{"network without a gateway", sandbox.CreateRequest{Network: "all-public"}, sandbox.ErrNetworkUnavailable},
	}
	for _, c := range cases {
		_, err := h.m.Create(context.Background(), c.req)
		var inv *sandbox.InvalidError
		switch {
		case err == nil:
			t.Errorf("%s: accepted", c.name)
		case c.want == nil && !errors.As(err, &inv):
			t.Errorf("%s: %v (%T), want an InvalidError", c.name, err, err)
		case c.want != nil && !errors.Is(err, c.want):
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if all, _ := h.st.ListSandboxes(context.Background(), store.SandboxFilter{}); len(all) != 0 {
		t.Errorf("refused creates left %d records", len(all))
	}
	if n := h.d.Starts(); n != 0 {
		t.Errorf("refused creates started %d sandboxes", n)
	}
}

// TestCreateOverCapacity: past the admission limit a create is refused
// with a CapacityError and leaves no record; a kill frees the slot.
func TestCreateOverCapacity(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.Admission = govern.NewAdmission(govern.AdmissionConfig{MaxConcurrent: 1, AgentRate: 1000, AgentBurst: 1000})
	h := newHarness(t, cfg)
	first := h.create(sandbox.CreateRequest{})
	_, err := h.m.Create(context.Background(), sandbox.CreateRequest{})
	var capErr *govern.CapacityError
	if !errors.As(err, &capErr) {
		t.Fatalf("second create: %v, want a CapacityError", err)
	}
	if all, _ := h.st.ListSandboxes(context.Background(), store.SandboxFilter{}); len(all) != 1 {
		t.Fatalf("%d records, want only the first", len(all))
	}
	if _, err := h.m.Kill(context.Background(), first.ID); err != nil {
		t.Fatal(err)
	}
	h.create(sandbox.CreateRequest{})
}

// TestCreateStartFailure: a sandbox the driver fails to start is
// recorded ended with reason error and holds no slot.
func TestCreateStartFailure(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.Admission = govern.NewAdmission(govern.AdmissionConfig{MaxConcurrent: 1, AgentRate: 1000, AgentBurst: 1000})
	h := newHarness(t, cfg)
	h.d.OnStart(func(runtime.Config) error { return errors.New("runc exploded") })
	if _, err := h.m.Create(context.Background(), sandbox.CreateRequest{}); err == nil || !strings.Contains(err.Error(), "runc exploded") {
		t.Fatalf("create: %v", err)
	}
	all, _ := h.st.ListSandboxes(context.Background(), store.SandboxFilter{})
	if len(all) != 1 || all[0].State != store.StateEnded || all[0].EndReason != sandbox.EndError {
		t.Fatalf("records = %+v", all)
	}
	h.d.OnStart(nil)
	h.create(sandbox.CreateRequest{}) // the failed start gave its slot back
}

// TestKill: a killed sandbox is recorded ended "killed", the driver holds
// nothing of it, and a second kill is ErrNotFound.
func TestKill(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t))
	sb := h.create(sandbox.CreateRequest{})
	rec, err := h.m.Kill(context.Background(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != store.StateEnded || rec.EndReason != sandbox.EndKilled || rec.EndedAt == nil {
		t.Fatalf("record = %+v", rec)
	}
	if held := h.held(); len(held) != 0 {
		t.Fatalf("driver still holds %v", held)
	}
	if h.m.Running(sb.ID) {
		t.Error("Running after kill")
	}
	if _, err := h.m.Kill(context.Background(), sb.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("second kill: %v", err)
	}
	if _, err := h.m.Kill(context.Background(), "nosuchsandbox"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("kill of an unknown id: %v", err)
	}
}

// TestTTLExpiry: a sandbox is ended "ttl" when its lifetime passes, and
// the driver holds nothing of it.
func TestTTLExpiry(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t))
	sb := h.create(sandbox.CreateRequest{Timeout: ptr[int64](1)})
	if rec := h.waitEnded(sb.ID); rec.EndReason != sandbox.EndTTL {
		t.Fatalf("end reason %q, want ttl", rec.EndReason)
	}
	if held := h.held(); len(held) != 0 {
		t.Fatalf("driver still holds %v", held)
	}
}

// TestPauseStopsTTLClock: a paused sandbox outlives its expiry (its
// clock stops), the driver holds it frozen, and once resumed with the
// time it had left it expires.
func TestPauseStopsTTLClock(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t))
	ctx := context.Background()
	sb := h.create(sandbox.CreateRequest{Timeout: ptr[int64](1)})
	rec, err := h.m.Pause(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != store.StatePaused || h.d.StateOf(sb.ID) != runtimetest.Paused {
		t.Fatalf("after pause: record %q, driver %q", rec.State, h.d.StateOf(sb.ID))
	}
	// Past the original expiry the sandbox is still paused: had the
	// clock run, the expiry would have ended it by now.
	time.Sleep(time.Until(sb.ExpiresAt) + 300*time.Millisecond)
	if rec := h.record(sb.ID); rec.State != store.StatePaused || h.d.StateOf(sb.ID) != runtimetest.Paused {
		t.Fatalf("paused sandbox after its original expiry: record %q, driver %q", rec.State, h.d.StateOf(sb.ID))
	}
	if _, err := h.m.Resume(ctx, sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	if rec := h.waitEnded(sb.ID); rec.EndReason != sandbox.EndTTL {
		t.Fatalf("end reason %q, want ttl", rec.EndReason)
	}
}

// TestPauseResume: pause and resume change the record and the driver,
// a repeated call is ErrConflict, a paused sandbox cannot be dialled, and
// commands run again after resume.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t))
	ctx := context.Background()
	sb := h.create(sandbox.CreateRequest{})
	if _, err := h.m.Resume(ctx, sb.ID, 0); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("resume of a running sandbox: %v", err)
	}
	if _, err := h.m.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Pause(ctx, sb.ID); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("second pause: %v", err)
	}
	if !h.m.Paused(sb.ID) || h.m.Running(sb.ID) {
		t.Error("Paused/Running wrong while paused")
	}
	if _, err := h.m.Dial(ctx, sb.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("dial of a paused sandbox: %v", err)
	}
	if _, err := h.m.StartProcess(ctx, sb.ID, echo("x"), "", 0); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("command in a paused sandbox: %v", err)
	}
	rec, err := h.m.Resume(ctx, sb.ID, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != store.StateRunning || h.d.StateOf(sb.ID) != runtimetest.Running {
		t.Fatalf("after resume: record %q driver %q", rec.State, h.d.StateOf(sb.ID))
	}
	if ttl := time.Until(rec.ExpiresAt); ttl < 50*time.Second || ttl > 61*time.Second {
		t.Errorf("resume TTL left %v, want about 60 s", ttl)
	}
	if out := execOut(t, h, sb.ID, "echo", "back"); out.stdout != "back\n" || out.exit != 0 {
		t.Fatalf("after resume: %+v", out)
	}
}

// TestPersistedPause: a pause without memory saves the sandbox's files,
// stops its processes (the driver holds nothing), and resume starts it
// again with the same id, token and files.
func TestPersistedPause(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t))
	ctx := context.Background()
	sb := h.create(sandbox.CreateRequest{})
	h.d.WriteFile(sb.ID, "/home/user/work.txt", []byte("progress"))
	rec, err := h.m.PauseWith(ctx, sb.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != store.StatePaused || rec.Persisted == "" {
		t.Fatalf("record = %+v", rec)
	}
	if held := h.held(); len(held) != 0 {
		t.Fatalf("a persisted sandbox is still held: %v", held)
	}
	// Its stop is no death: the watcher leaves it paused.
	time.Sleep(100 * time.Millisecond)
	if rec := h.record(sb.ID); rec.State != store.StatePaused {
		t.Fatalf("persisted sandbox state %q", rec.State)
	}
	if _, err := h.m.PauseWith(ctx, sb.ID, true); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("second persisted pause: %v", err)
	}
	if _, err := h.m.Resume(ctx, sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	cfg, ok := h.d.Config(sb.ID)
	if !ok || cfg.AccessToken != sb.AccessToken || len(cfg.Layers) == 0 {
		t.Fatalf("restarted config = %+v, held %v", cfg, ok)
	}
	if data, ok := h.d.ReadFile(sb.ID, "/home/user/work.txt"); !ok || string(data) != "progress" {
		t.Fatalf("file after resume: %q, %v", data, ok)
	}
	if out := execOut(t, h, sb.ID, "cat", "work.txt"); out.stdout != "progress" {
		t.Fatalf("cat after resume: %+v", out)
	}
}

// TestReconcileAfterRestart: a new Manager over the same store and
// driver adopts running and paused sandboxes, keeps persisted ones
// paused, ends the records of vanished sandboxes "orphaned" and of
// expired ones "ttl", and reclaims what the driver holds without a
// record.
func TestReconcileAfterRestart(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t))
	ctx := context.Background()
	running := h.create(sandbox.CreateRequest{})
	vanished := h.create(sandbox.CreateRequest{})
	frozen := h.create(sandbox.CreateRequest{})
	persisted := h.create(sandbox.CreateRequest{})
	expiring := h.create(sandbox.CreateRequest{Timeout: ptr[int64](1)})
	if _, err := h.m.Pause(ctx, frozen.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.PauseWith(ctx, persisted.ID, true); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Start(ctx, runtime.Config{ID: "orphan0", Runtime: runtime.Runc}); err != nil {
		t.Fatal(err)
	}
	h.m.Shutdown(ctx, false)
	// While the control plane is down: one sandbox vanishes, one's TTL passes.
	_ = h.d.Stop(ctx, vanished.ID, 0)
	time.Sleep(time.Until(expiring.ExpiresAt) + 100*time.Millisecond)
	h.cfg.Admission = testConfig(t).Admission
	h.m = h.open()

	if !h.m.Running(running.ID) || h.record(running.ID).State != store.StateRunning {
		t.Error("running sandbox not adopted")
	}
	if rec := h.record(vanished.ID); rec.State != store.StateEnded || rec.EndReason != sandbox.EndOrphaned {
		t.Errorf("vanished sandbox: %q %q", rec.State, rec.EndReason)
	}
	if rec := h.record(expiring.ID); rec.State != store.StateEnded || rec.EndReason != sandbox.EndTTL {
		t.Errorf("expired sandbox: %q %q", rec.State, rec.EndReason)
	}
	if !h.m.Paused(frozen.ID) || !h.m.Paused(persisted.ID) {
		t.Error("paused sandboxes not adopted as paused")
	}
	held := h.held()
	if slices.Contains(held, "orphan0") || slices.Contains(held, expiring.ID) {
		t.Errorf("driver still holds reclaimed sandboxes: %v", held)
	}
	// The adopted sandboxes work under the new Manager.
	if out := execOut(t, h, running.ID, "echo", "adopted"); out.stdout != "adopted\n" {
		t.Errorf("exec in adopted sandbox: %+v", out)
	}
	for _, id := range []string{frozen.ID, persisted.ID} {
		if _, err := h.m.Resume(ctx, id, 0); err != nil {
			t.Errorf("resume adopted %s: %v", id, err)
		}
	}
	if _, err := h.m.Kill(ctx, running.ID); err != nil {
		t.Errorf("kill adopted: %v", err)
	}
	if slices.Contains(h.held(), running.ID) {
		t.Error("killed adopted sandbox still held")
	}
}

// TestDeathDetection: a sandbox whose init dies is ended "error"; one
// killed at its memory limit "oom"; the driver then holds neither.
func TestDeathDetection(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t))
	crash := h.create(sandbox.CreateRequest{})
	oom := h.create(sandbox.CreateRequest{})
	h.d.Kill(crash.ID)
	h.d.OOM(oom.ID)
	if rec := h.waitEnded(crash.ID); rec.EndReason != sandbox.EndError {
		t.Errorf("crashed sandbox: reason %q, want error", rec.EndReason)
	}
	if rec := h.waitEnded(oom.ID); rec.EndReason != sandbox.EndOOM {
		t.Errorf("OOM-killed sandbox: reason %q, want oom", rec.EndReason)
	}
	if held := h.held(); len(held) != 0 {
		t.Errorf("driver still holds %v", held)
	}
}

// TestCommandOOM: a command killed at the memory limit ends with reason
// oom (the agent says "killed"; the Manager reads the OOM count), is
// recorded so, and its sandbox keeps running.
func TestCommandOOM(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t))
	ctx := context.Background()
	sb := h.create(sandbox.CreateRequest{})
	p, err := h.m.StartProcess(ctx, sb.ID, &process.StartRequest{Process: &process.ProcessConfig{Cmd: "sleep", Args: []string{"infinity"}}}, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if msg, err := p.Receive(); err != nil || msg.GetEvent().GetStart() == nil {
		t.Fatalf("first event: %v %v", msg, err)
	}
	eventually(t, "the command to run", func() bool { return len(h.d.Commands(sb.ID)) == 1 })
	h.d.OOMKillCommands(sb.ID)
	var end *process.ProcessEvent_EndEvent
	for end == nil {
		msg, err := p.Receive()
		if err != nil {
			t.Fatal(err)
		}
		end = msg.GetEvent().GetEnd()
	}
	if end.GetEndReason() != sandbox.EndOOM {
		t.Fatalf("end reason %q, want oom", end.GetEndReason())
	}
	cmds, _ := h.st.ListCommands(ctx, sb.ID)
	if len(cmds) != 1 || cmds[0].EndReason != sandbox.EndOOM {
		t.Fatalf("command records = %+v", cmds)
	}
	if !h.m.Running(sb.ID) {
		t.Error("sandbox ended with its command")
	}
}

// TestCommandRecorded: a command runs through the agent and its end is
// recorded with its exit code and output sizes.
func TestCommandRecorded(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t))
	sb := h.create(sandbox.CreateRequest{Env: map[string]string{"GREETING": "hi"}})
	if out := execOut(t, h, sb.ID, "printenv", "GREETING"); out.stdout != "hi\n" || out.exit != 0 {
		t.Fatalf("printenv: %+v", out)
	}
	if out := execOut(t, h, sb.ID, "exit", "3"); out.exit != 3 {
		t.Fatalf("exit 3: %+v", out)
	}
	cmds, _ := h.st.ListCommands(context.Background(), sb.ID)
	if len(cmds) != 2 || cmds[0].ExitCode == nil || cmds[1].ExitCode == nil {
		t.Fatalf("command records = %+v", cmds)
	}
	byCmd := map[string]*store.Command{}
	for _, c := range cmds {
		byCmd[c.Command] = c
	}
	if c := byCmd["printenv GREETING"]; c == nil || *c.ExitCode != 0 || c.StdoutBytes != 3 {
		t.Errorf("printenv record = %+v", c)
	}
	if c := byCmd["exit 3"]; c == nil || *c.ExitCode != 3 {
		t.Errorf("exit record = %+v", c)
	}
}

// TestPool: a warm pool fills to its minimum with sandboxes that have no
// record, a default create claims one (same id, recorded), the pool
// refills, and a create that is not poolable starts its own sandbox.
func TestPool(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t))
	ctx := context.Background()
	if _, err := h.m.SetPool(ctx, sandbox.PoolConfig{Template: "base", Min: 2}); err != nil {
		t.Fatal(err)
	}
	idle := func() int {
		ps := h.m.Pools()
		if len(ps) != 1 {
			return -1
		}
		return ps[0].Idle
	}
	eventually(t, "the pool to fill", func() bool { return idle() == 2 })
	pooled := h.held()
	if all, _ := h.st.ListSandboxes(ctx, store.SandboxFilter{}); len(pooled) != 2 || len(all) != 0 {
		t.Fatalf("pool holds %v with %d records", pooled, len(all))
	}
	sb := h.create(sandbox.CreateRequest{Metadata: map[string]string{"k": "v"}, Timeout: ptr[int64](120)})
	if !slices.Contains(pooled, sb.ID) {
		t.Fatalf("create got %s, not one of the pooled %v", sb.ID, pooled)
	}
	if rec := h.record(sb.ID); rec.State != store.StateRunning || rec.Metadata["k"] != "v" {
		t.Fatalf("claimed record = %+v", rec)
	}
	if ps := h.m.Pools(); ps[0].Hits != 1 {
		t.Errorf("pool stats %+v, want one hit", ps[0])
	}
	if cfg, _ := h.d.Config(sb.ID); cfg.AccessToken != sb.AccessToken {
		t.Error("claimed sandbox's agent token differs from its record's")
	}
	if out := execOut(t, h, sb.ID, "echo", "warm"); out.stdout != "warm\n" {
		t.Fatalf("exec in claimed sandbox: %+v", out)
	}
	eventually(t, "the pool to refill", func() bool { return idle() == 2 && len(h.held()) == 3 })
	before := h.held() // the claimed sandbox and two pooled ones
	own := h.create(sandbox.CreateRequest{Env: map[string]string{"A": "b"}})
	if slices.Contains(before, own.ID) || idle() != 2 {
		t.Errorf("a create with env vars took a pooled sandbox (idle %d)", idle())
	}
	if _, err := h.m.SetPool(ctx, sandbox.PoolConfig{Template: "base", Min: 0, Max: 0}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pool's sandboxes to stop", func() bool {
		held := h.held()
		return len(held) == 2 && slices.Contains(held, sb.ID) && slices.Contains(held, own.ID)
	})
}

func echo(s string) *process.StartRequest {
	return &process.StartRequest{Process: &process.ProcessConfig{Cmd: "echo", Args: []string{s}}}
}

type execResult struct {
	stdout, stderr string
	exit           int32
	end            *process.ProcessEvent_EndEvent
}

// execOut runs a command through the Manager and collects its output.
func execOut(t *testing.T, h *harness, id, cmd string, args ...string) execResult {
	t.Helper()
	p, err := h.m.StartProcess(context.Background(), id, &process.StartRequest{Process: &process.ProcessConfig{Cmd: cmd, Args: args}}, "", 0)
	if err != nil {
		t.Fatalf("start %s: %v", cmd, err)
	}
	defer p.Close()
	var r execResult
	for {
		msg, err := p.Receive()
		if err != nil || msg == nil {
			t.Fatalf("%s: stream ended without an end event: %v", cmd, err)
		}
		ev := msg.GetEvent()
		r.stdout += string(ev.GetData().GetStdout())
		r.stderr += string(ev.GetData().GetStderr())
		if e := ev.GetEnd(); e != nil {
			r.exit, r.end = e.GetExitCode(), e
			return r
		}
	}
}
