package sandbox_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/runtime/runtimetest"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
)

// TestSnapshotAndFork: a snapshot keeps a sandbox's files; sandboxes
// created from it, and forks, start with them; a deleted snapshot can no
// longer be created from.
func TestSnapshotAndFork(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t))
	ctx := context.Background()
	sb := h.create(sandbox.CreateRequest{Metadata: map[string]string{"k": "v"}})
	h.d.WriteFile(sb.ID, "/home/user/state.json", []byte(`{"step":3}`))
	sn, err := h.m.Snapshot(ctx, sb.ID, "after-step-3")
	if err != nil {
		t.Fatal(err)
	}
	if sn.SandboxID != sb.ID || sn.SizeBytes != int64(len(`{"step":3}`)) || h.d.StateOf(sb.ID) != runtimetest.Running {
		t.Fatalf("snapshot %+v, sandbox %q", sn, h.d.StateOf(sb.ID))
	}
	from := h.create(sandbox.CreateRequest{Snapshot: sn.ID})
	if data, ok := h.d.ReadFile(from.ID, "/home/user/state.json"); !ok || string(data) != `{"step":3}` || from.Snapshot != sn.ID {
		t.Fatalf("sandbox from snapshot: %q %v %+v", data, ok, from)
	}
	forks, fsn, err := h.m.Fork(ctx, sb.ID, 2, nil)
	if err != nil || len(forks) != 2 || fsn.SandboxID != sb.ID {
		t.Fatalf("fork: %v %+v %v", forks, fsn, err)
	}
	for _, f := range forks {
		if data, ok := h.d.ReadFile(f.ID, "/home/user/state.json"); !ok || string(data) != `{"step":3}` || f.Metadata["k"] != "v" {
			t.Errorf("fork %s: %q %v %+v", f.ID, data, ok, f.Metadata)
		}
	}
	if _, _, err := h.m.Fork(ctx, sb.ID, sandbox.MaxForkCount+1, nil); err == nil {
		t.Error("fork over the count limit accepted")
	}
	if err := h.m.DeleteSnapshot(ctx, sn.ID); err != nil {
		t.Fatal(err)
	}
	var inv *sandbox.InvalidError
	if _, err := h.m.Create(ctx, sandbox.CreateRequest{Snapshot: sn.ID}); !errors.As(err, &inv) {
		t.Errorf("create from a deleted snapshot: %v", err)
	}
	if err := h.m.DeleteSnapshot(ctx, "snap-nosuch"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("delete of an unknown snapshot: %v", err)
	}
}

// TestAutoPauseAtTTL: with auto-pause the end of the TTL pauses instead
// of killing: frozen with memory kept, or persisted (nothing held) without.
func TestAutoPauseAtTTL(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t))
	memory := h.create(sandbox.CreateRequest{Timeout: ptr[int64](1), AutoPause: true, PauseMemory: true})
	files := h.create(sandbox.CreateRequest{Timeout: ptr[int64](1), AutoPause: true})
	eventually(t, "both sandboxes to auto-pause", func() bool {
		return h.record(memory.ID).State == store.StatePaused && h.record(files.ID).State == store.StatePaused
	})
	if h.d.StateOf(memory.ID) != runtimetest.Paused {
		t.Errorf("memory auto-pause: driver state %q, want paused", h.d.StateOf(memory.ID))
	}
	if rec := h.record(files.ID); rec.Persisted == "" || slices.Contains(h.held(), files.ID) {
		t.Errorf("persisted auto-pause: persisted %q, held %v", rec.Persisted, h.held())
	}
}

// TestTimeouts: SetTimeout refuses values out of bounds and changes the
// expiry; ExtendTimeout never shortens it; a shortened TTL ends the
// sandbox "ttl".
func TestTimeouts(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t))
	ctx := context.Background()
	sb := h.create(sandbox.CreateRequest{Timeout: ptr[int64](600)})
	var inv *sandbox.InvalidError
	for _, d := range []time.Duration{0, sandbox.MaxTTL + time.Second} {
		if _, err := h.m.SetTimeout(ctx, sb.ID, d); !errors.As(err, &inv) {
			t.Errorf("SetTimeout(%v): %v", d, err)
		}
	}
	rec, err := h.m.ExtendTimeout(ctx, sb.ID, time.Minute)
	if err != nil || rec.ExpiresAt.Sub(sb.ExpiresAt).Abs() > time.Second {
		t.Errorf("ExtendTimeout shortened the TTL: %v → %v (%v)", sb.ExpiresAt, rec.ExpiresAt, err)
	}
	if _, err := h.m.SetTimeout(ctx, "nosuchsandbox", time.Minute); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("SetTimeout of an unknown sandbox: %v", err)
	}
	if _, err := h.m.SetTimeout(ctx, sb.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	if rec := h.waitEnded(sb.ID); rec.EndReason != sandbox.EndTTL {
		t.Fatalf("end reason %q, want ttl", rec.EndReason)
	}
}

// TestShutdownKillAll: a shutdown that kills every sandbox ends them
// "shutdown" and leaves the driver holding nothing; one that does not
// leaves them running for the next start to adopt.
func TestShutdownKillAll(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t))
	a := h.create(sandbox.CreateRequest{})
	h.restart()
	if !h.m.Running(a.ID) {
		t.Fatal("not adopted after a shutdown that keeps sandboxes")
	}
	b := h.create(sandbox.CreateRequest{})
	h.m.Shutdown(context.Background(), true)
	for _, id := range []string{a.ID, b.ID} {
		if rec := h.record(id); rec.State != store.StateEnded || rec.EndReason != sandbox.EndShutdown {
			t.Errorf("%s: %q %q", id, rec.State, rec.EndReason)
		}
	}
	if held := h.held(); len(held) != 0 {
		t.Errorf("driver still holds %v", held)
	}
	h.m = h.open() // for the cleanup's Shutdown
}
