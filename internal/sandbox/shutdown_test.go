package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/runtime/runtimetest"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template/registry"
)

// TestShutdownStartsNothingMore guards against a sandbox outliving the
// server that started it: a create waiting for admission when the server
// shuts down with killAll was admitted by the slot the shutdown freed and
// started a sandbox nobody would kill (integration runs found such leaked
// sandboxes holding their runtime and shim for good). Shutdown now stops
// every create in flight: the waiting one fails with ErrShuttingDown and
// the driver holds no sandbox afterwards.
func TestShutdownStartsNothingMore(t *testing.T) {
	cfg := testConfig(t)
	cfg.Admission = govern.NewAdmission(govern.AdmissionConfig{MaxConcurrent: 1, MaxPerAgent: 1,
		AgentRate: 1000, AgentBurst: 1000, QueueTimeout: time.Minute})
	h := newHarness(t, cfg)
	h.create(sandbox.CreateRequest{})
	errc := make(chan error, 1)
	go func() {
		_, err := h.m.Create(context.Background(), sandbox.CreateRequest{})
		errc <- err
	}()
	eventually(t, "the second create to wait for a slot", func() bool { return cfg.Admission.Stats().Waiting == 1 })
	h.m.Shutdown(context.Background(), true)
	if err := <-errc; !errors.Is(err, sandbox.ErrShuttingDown) {
		t.Errorf("a create waiting when the server shut down: %v; want ErrShuttingDown", err)
	}
	if held := h.held(); len(held) != 0 {
		t.Errorf("the driver still holds %v after a shutdown that kills all", held)
	}
	h.m = h.open() // the harness's cleanup shuts this one down
}

// gate holds the driver calls that pass through a test's driver hook
// (hold) until the test opens it.
type gate struct {
	entered, release chan struct{}
	once             sync.Once
	open             atomic.Bool
}

func newGate() *gate { return &gate{entered: make(chan struct{}), release: make(chan struct{})} }

// hold is called in a driver hook: it says that a call is in flight and
// waits until the gate opens.
func (g *gate) hold() {
	g.once.Do(func() { close(g.entered) })
	<-g.release
}

// shutdownWhileHeld waits until g holds a driver call, runs
// Shutdown(killAll) and lets it reach its waits (up to 2 s: without a
// wait it returns at once) before it opens g; then it waits for Shutdown
// to return. It reports whether Shutdown returned while the call was
// still held (early) and what the driver held when it returned; each
// atReturn runs as Shutdown returns, to see what the call had made by
// then. The harness's hooks are removed and a new Manager is opened
// when the test ends (the harness's cleanup shuts that one down).
func (h *harness) shutdownWhileHeld(g *gate, killAll bool, atReturn ...func()) (early bool, heldAtReturn []string) {
	h.t.Helper()
	h.t.Cleanup(func() {
		h.d.OnStart(nil)
		h.d.OnStop(nil)
		h.onCall(nil)
		h.m = h.open()
	})
	<-g.entered
	done := make(chan struct{})
	go func() {
		h.m.Shutdown(context.Background(), killAll)
		early = !g.open.Load()
		heldAtReturn = h.held()
		for _, f := range atReturn {
			f()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
	}
	g.open.Store(true)
	close(g.release)
	<-done
	return early, heldAtReturn
}

// TestShutdownWaitsForEndsInFlight defends against a shutdown returning
// while a sandbox is still being torn down (the watchdog's cpu_runaway
// end, a kill or a TTL in flight): the process then exits or its data
// dir is removed with the sandbox's rootfs still mounted and its record
// still running (found as a leaked overlay mount after a test server
// closed during a runaway kill). Shutdown must return only after that
// end has stopped the sandbox and recorded it.
func TestShutdownWaitsForEndsInFlight(t *testing.T) {
	for _, killAll := range []bool{false, true} {
		t.Run(fmt.Sprintf("killAll=%v", killAll), func(t *testing.T) {
			h := newHarness(t, testConfig(t))
			rec := h.create(sandbox.CreateRequest{})
			g := newGate()
			h.d.OnStop(func(id string) {
				if id == rec.ID {
					g.hold()
				}
			})
			go h.m.OnRunaway(rec.ID)
			if early, _ := h.shutdownWhileHeld(g, killAll); early {
				t.Fatal("Shutdown returned while the sandbox's end was still stopping it")
			}
			got, err := h.st.GetSandbox(context.Background(), rec.ID)
			if err != nil || got.State != store.StateEnded || got.EndReason != sandbox.EndCPURunaway {
				t.Fatalf("after Shutdown the record is %+v (%v); want ended cpu_runaway", got, err)
			}
			if held := h.held(); len(held) != 0 {
				t.Fatalf("the driver still holds %v after Shutdown", held)
			}
		})
	}
}

// TestShutdownUndoesPoolRefillInFlight defends against a warm-pool
// refill outliving the server half-made: a refill whose Start was in
// flight when the server closed finished after Shutdown had drained the
// pools, and nothing stopped it (with runc, its rootfs mounts and a
// supervisor with a container stayed behind). Pooled sandboxes are never
// adopted across a restart (docs/environments.md: a server stop stops
// them), so Shutdown must return only once that refill has ended and its
// sandbox is stopped, and start no other: with or without killAll, the
// driver holds nothing afterwards and the pass started no second
// sandbox.
func TestShutdownUndoesPoolRefillInFlight(t *testing.T) {
	for _, killAll := range []bool{false, true} {
		t.Run(fmt.Sprintf("killAll=%v", killAll), func(t *testing.T) {
			h := newHarness(t, testConfig(t))
			g := newGate()
			h.d.OnStart(func(runtime.Config) error {
				g.hold()
				return nil
			})
			if _, err := h.m.SetPool(context.Background(), sandbox.PoolConfig{Template: "base", Min: 2}); err != nil {
				t.Fatal(err)
			}
			early, heldAtReturn := h.shutdownWhileHeld(g, killAll)
			if early {
				t.Error("Shutdown returned while a pool refill's Start was still in flight")
			}
			if len(heldAtReturn) != 0 {
				t.Errorf("the driver still holds %v after Shutdown: a refill in flight outlived it", heldAtReturn)
			}
			if n := h.d.Starts(); n != 1 {
				t.Errorf("%d pooled sandboxes started, want only the one in flight at Shutdown", n)
			}
		})
	}
}

// TestShutdownWaitsForCreatesInFlight defends against a create outliving
// the shutdown half-made: a create whose runtime Start was in flight
// when Shutdown ran (past the HTTP drain's deadline, or from a caller
// that is no HTTP request) returned to a server about to close its store
// and driver, and the create's own undo (it stops what it started once
// it sees the server closing) ran, if at all, after that. Shutdown must
// return only after that create has finished: its sandbox stopped, its
// record ended, the driver holding nothing.
func TestShutdownWaitsForCreatesInFlight(t *testing.T) {
	h := newHarness(t, testConfig(t))
	g := newGate()
	h.d.OnStart(func(runtime.Config) error {
		g.hold()
		return nil
	})
	created := make(chan error, 1)
	go func() {
		_, err := h.m.Create(context.Background(), sandbox.CreateRequest{})
		created <- err
	}()
	early, heldAtReturn := h.shutdownWhileHeld(g, false)
	if early {
		t.Error("Shutdown returned while a create's runtime Start was still in flight")
	}
	if len(heldAtReturn) != 0 {
		t.Errorf("when Shutdown returned the driver held %v", heldAtReturn)
	}
	err := <-created
	if !errors.Is(err, sandbox.ErrShuttingDown) {
		t.Errorf("the create in flight at Shutdown returned %v, want ErrShuttingDown", err)
	}
	if held := h.held(); len(held) != 0 {
		t.Errorf("the driver still holds %v after Shutdown", held)
	}
}

// TestShutdownWaitsForAutoPauseInFlight defends against a TTL's
// auto-pause outliving the shutdown half-made: the TTL of an auto-pause
// sandbox (persisted: snapshot, then stop) that fired just before the
// server closed was no end Shutdown waited for, so the server went on to
// close its store and driver while the pause still stopped the sandbox
// and wrote its record. Shutdown must return only once that pause has
// finished: the sandbox stopped, its record paused.
func TestShutdownWaitsForAutoPauseInFlight(t *testing.T) {
	h := newHarness(t, testConfig(t))
	rec := h.create(sandbox.CreateRequest{Timeout: ptr[int64](1), AutoPause: true})
	g := newGate()
	h.d.OnStop(func(id string) {
		if id == rec.ID {
			g.hold()
		}
	})
	// The TTL fires: the persisted pause stops the sandbox.
	if early, _ := h.shutdownWhileHeld(g, false); early {
		t.Error("Shutdown returned while the TTL's auto-pause was still stopping the sandbox")
	}
	if got := h.record(rec.ID); got.State != store.StatePaused {
		t.Errorf("after Shutdown the record is %s, want paused", got.State)
	}
	if held := h.held(); len(held) != 0 {
		t.Errorf("the driver still holds %v after Shutdown", held)
	}
}

// TestShutdownWaitsForResumeInFlight defends against the resume of a
// persisted sandbox (paused to disk: its processes stopped) outliving
// the shutdown half-made: its runtime Start was no work Shutdown waited
// for, so the server went on to close its store and driver while the
// resume still started the sandbox and then wrote its record (a running
// sandbox whose record says paused, or a write to a closed store).
// Shutdown must return only once that resume has finished: without
// killAll the sandbox runs and its record says so (the next start
// adopts it); with killAll it is stopped and ended. And a resume asked
// for once Shutdown has begun starts nothing: ErrShuttingDown, the
// sandbox left paused.
func TestShutdownWaitsForResumeInFlight(t *testing.T) {
	for _, tc := range []struct {
		killAll   bool
		wantState string
		wantHeld  int
	}{
		{killAll: false, wantState: store.StateRunning, wantHeld: 1},
		{killAll: true, wantState: store.StateEnded, wantHeld: 0},
	} {
		t.Run(fmt.Sprintf("killAll=%v", tc.killAll), func(t *testing.T) {
			h := newHarness(t, testConfig(t))
			rec := h.create(sandbox.CreateRequest{})
			if _, err := h.m.PauseWith(context.Background(), rec.ID, true); err != nil {
				t.Fatal(err)
			}
			g := newGate()
			h.d.OnStart(func(runtime.Config) error {
				g.hold()
				return nil
			})
			resumed := make(chan error, 1)
			go func() {
				_, err := h.m.Resume(context.Background(), rec.ID, 0)
				resumed <- err
			}()
			early, heldAtReturn := h.shutdownWhileHeld(g, tc.killAll)
			if early {
				t.Error("Shutdown returned while a persisted sandbox's resume was still starting it")
			}
			if got := h.record(rec.ID); got.State != tc.wantState {
				t.Errorf("after Shutdown the record is %s, want %s", got.State, tc.wantState)
			}
			if len(heldAtReturn) != tc.wantHeld {
				t.Errorf("when Shutdown returned the driver held %v, want %d sandboxes", heldAtReturn, tc.wantHeld)
			}
			if err := <-resumed; !tc.killAll && err != nil {
				t.Errorf("the resume in flight at Shutdown: %v", err)
			}
		})
	}
	t.Run("after", func(t *testing.T) {
		h := newHarness(t, testConfig(t))
		rec := h.create(sandbox.CreateRequest{})
		if _, err := h.m.PauseWith(context.Background(), rec.ID, true); err != nil {
			t.Fatal(err)
		}
		h.m.Shutdown(context.Background(), false)
		defer func() { h.m = h.open() }()
		if _, err := h.m.Resume(context.Background(), rec.ID, 0); !errors.Is(err, sandbox.ErrShuttingDown) {
			t.Errorf("a resume once Shutdown has begun: %v, want ErrShuttingDown", err)
		}
		if held := h.held(); len(held) != 0 {
			t.Errorf("a resume after Shutdown started %v", held)
		}
		if got := h.record(rec.ID); got.State != store.StatePaused {
			t.Errorf("after a refused resume the record is %s, want paused", got.State)
		}
	})
}

// TestShutdownStopsTakenPooledSandbox defends against a warm-pool
// sandbox outliving the shutdown through a create that had taken it: a
// create that took a pooled sandbox and then waited for admission (its
// work not counted yet) gave it back with a background discard once it
// saw the server closing, after Shutdown had drained the pools, so the
// discard's runtime Stop ran, if at all, after the server closed its
// store and driver (pooled sandboxes have no record and are never
// adopted: a leaked overlay mount and runc container). Shutdown must
// return with the taken sandbox stopped, whether the create is still
// waiting (it then gives back nothing: the sandbox is stopped once) or
// was admitted by the slot a killAll freed.
func TestShutdownStopsTakenPooledSandbox(t *testing.T) {
	for _, killAll := range []bool{false, true} {
		t.Run(fmt.Sprintf("killAll=%v", killAll), func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Admission = govern.NewAdmission(govern.AdmissionConfig{MaxConcurrent: 50, MaxPerAgent: 1,
				AgentRate: 1000, AgentBurst: 1000, QueueTimeout: time.Minute})
			h := newHarness(t, cfg)
			ctx := context.Background()
			live := h.create(sandbox.CreateRequest{Agent: "a"}) // holds agent a's only slot
			if _, err := h.m.SetPool(ctx, sandbox.PoolConfig{Template: "base", Min: 1, Max: 1}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the pool to fill", func() bool { ps := h.m.Pools(); return len(ps) == 1 && ps[0].Idle == 1 })
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			created := make(chan error, 1)
			go func() {
				_, err := h.m.Create(cctx, sandbox.CreateRequest{Agent: "a"})
				created <- err
			}()
			eventually(t, "the pooled create to wait for agent a's slot", func() bool {
				ps := h.m.Pools()
				return cfg.Admission.Stats().Waiting == 1 && ps[0].Hits == 1
			})
			h.m.Shutdown(ctx, killAll)
			defer func() { h.m = h.open() }()
			want := []string{live.ID}
			if killAll {
				want = nil
			}
			heldAtReturn := h.held()
			if !slices.Equal(heldAtReturn, want) {
				t.Errorf("when Shutdown returned the driver held %v, want %v: the taken pooled sandbox outlived it", heldAtReturn, want)
			}
			stops := h.d.Stops()
			cancel()
			err := <-created
			if killAll && !errors.Is(err, sandbox.ErrShuttingDown) {
				t.Errorf("the pooled create admitted during Shutdown: %v, want ErrShuttingDown", err)
			}
			if !killAll && !errors.Is(err, context.Canceled) {
				t.Errorf("the pooled create still waiting after Shutdown: %v, want its context's end", err)
			}
			if n := h.d.Stops(); n != stops {
				t.Errorf("the create stopped %d sandboxes after Shutdown had returned, want none", n-stops)
			}
			if held := h.held(); !slices.Equal(held, want) {
				t.Errorf("after the create returned the driver holds %v, want %v", held, want)
			}
		})
	}
}

// TestShutdownWaitsForPersistedPauseInFlight defends against a user's
// pause to disk (persist: snapshot the files, stop the processes)
// outliving the shutdown half-made: it was no work Shutdown waited for,
// so the server went on to close its store and driver while the pause
// still stopped the sandbox and then wrote its record (a stopped
// sandbox whose record says running, or a write to a closed store).
// Shutdown must return only once that pause has finished: the sandbox
// stopped, its record paused (the next start adopts it as such). And a
// pause to disk asked for once Shutdown has begun changes nothing:
// ErrShuttingDown, the sandbox left running.
func TestShutdownWaitsForPersistedPauseInFlight(t *testing.T) {
	t.Run("in flight", func(t *testing.T) {
		h := newHarness(t, testConfig(t))
		rec := h.create(sandbox.CreateRequest{})
		g := newGate()
		h.d.OnStop(func(id string) {
			if id == rec.ID {
				g.hold()
			}
		})
		paused := make(chan error, 1)
		go func() {
			_, err := h.m.PauseWith(context.Background(), rec.ID, true)
			paused <- err
		}()
		early, heldAtReturn := h.shutdownWhileHeld(g, false)
		if early {
			t.Error("Shutdown returned while a pause to disk was still stopping the sandbox")
		}
		if len(heldAtReturn) != 0 {
			t.Errorf("when Shutdown returned the driver held %v, want the paused sandbox stopped", heldAtReturn)
		}
		if got := h.record(rec.ID); got.State != store.StatePaused || got.Persisted == "" {
			t.Errorf("after Shutdown the record is %s (persisted %q), want paused to disk", got.State, got.Persisted)
		}
		if err := <-paused; err != nil {
			t.Errorf("the pause in flight at Shutdown: %v", err)
		}
	})
	t.Run("after", func(t *testing.T) {
		h := newHarness(t, testConfig(t))
		rec := h.create(sandbox.CreateRequest{})
		h.m.Shutdown(context.Background(), false)
		defer func() { h.m = h.open() }()
		if _, err := h.m.PauseWith(context.Background(), rec.ID, true); !errors.Is(err, sandbox.ErrShuttingDown) {
			t.Errorf("a pause to disk once Shutdown has begun: %v, want ErrShuttingDown", err)
		}
		if held := h.held(); !slices.Equal(held, []string{rec.ID}) {
			t.Errorf("after a refused pause the driver holds %v, want the sandbox still running", held)
		}
		if got := h.record(rec.ID); got.State != store.StateRunning || got.Persisted != "" {
			t.Errorf("after a refused pause the record is %s (persisted %q), want running", got.State, got.Persisted)
		}
	})
}

// sandboxWork is a user's operation on a live sandbox that runs the
// runtime and writes the sandbox's files, its record or the store
// (TestShutdownWaitsForSandboxWork).
type sandboxWork struct {
	name string
	// call is the driver call the operation makes ("snapshot", "pause",
	// "resume": held in flight, onCall); "" for one that makes none.
	call string
	// frozen: the sandbox is paused with the freezer first.
	frozen bool
	op     func(h *harness, id string) error
	// wantErr is what the operation in flight at Shutdown returns.
	wantErr error
	// made checks, as Shutdown returns, that the operation in flight
	// has made all it makes; nothingMade, after a refused one, that it
	// made none of it.
	made, nothingMade func(t *testing.T, h *harness, id string)
}

// snapshotsMade checks that sandbox id has want snapshots, each with its
// record and its files: a snapshot directory without a record, or a
// record without its layer, is half-made.
func snapshotsMade(t *testing.T, h *harness, id string, want int) {
	t.Helper()
	list, err := h.st.ListSnapshots(context.Background(), store.SnapshotFilter{SandboxID: id})
	if err != nil {
		t.Errorf("list snapshots: %v", err)
		return
	}
	var recs, dirs []string
	for _, sn := range list {
		recs = append(recs, sn.ID)
		if len(sn.Layers) == 0 {
			t.Errorf("snapshot %s has no layer", sn.ID)
		} else if _, err := os.Stat(sn.Layers[0]); err != nil {
			t.Errorf("snapshot %s's layer: %v", sn.ID, err)
		}
	}
	entries, err := os.ReadDir(h.cfg.SnapshotDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Errorf("snapshot dir: %v", err)
	}
	for _, e := range entries {
		dirs = append(dirs, e.Name())
	}
	slices.Sort(recs)
	if len(recs) != want || !slices.Equal(recs, dirs) {
		t.Errorf("snapshot records %v, snapshot directories %v; want %d of each, the same", recs, dirs, want)
	}
}

// savedRef is the template version the save cases make.
const savedRef = "saved:v1"

var sandboxWorks = []sandboxWork{
	{
		name: "snapshot", call: "snapshot",
		op: func(h *harness, id string) error {
			_, err := h.m.Snapshot(context.Background(), id, "s1")
			return err
		},
		made:        func(t *testing.T, h *harness, id string) { snapshotsMade(t, h, id, 1) },
		nothingMade: func(t *testing.T, h *harness, id string) { snapshotsMade(t, h, id, 0) },
	},
	{
		// The fork's create comes after Shutdown has begun: refused.
		name: "fork", call: "snapshot", wantErr: sandbox.ErrShuttingDown,
		op: func(h *harness, id string) error {
			_, _, err := h.m.Fork(context.Background(), id, 1, nil)
			return err
		},
		made:        func(t *testing.T, h *harness, id string) { snapshotsMade(t, h, id, 1) },
		nothingMade: func(t *testing.T, h *harness, id string) { snapshotsMade(t, h, id, 0) },
	},
	{
		name: "save template", call: "snapshot",
		op: func(h *harness, id string) error {
			_, err := h.m.SaveTemplate(context.Background(), id, savedRef)
			return err
		},
		made: func(t *testing.T, h *harness, id string) {
			tv, err := h.reg.Resolve(context.Background(), savedRef)
			if err != nil {
				t.Errorf("the saved template's version: %v", err)
				return
			}
			if _, err := os.Stat(tv.Layers[0]); err != nil {
				t.Errorf("the saved template's layer: %v", err)
			}
		},
		nothingMade: func(t *testing.T, h *harness, id string) {
			if _, err := h.reg.Resolve(context.Background(), savedRef); !errors.Is(err, registry.ErrNotFound) {
				t.Errorf("the refused save's version: %v, want none", err)
			}
			// The version's directory is free: nothing was written there.
			if _, err := h.reg.NewLayerDir("saved", "v1"); err != nil {
				t.Errorf("the refused save left its files: %v", err)
			}
		},
	},
	{
		name: "pause", call: "pause",
		op: func(h *harness, id string) error {
			_, err := h.m.Pause(context.Background(), id)
			return err
		},
		made: func(t *testing.T, h *harness, id string) {
			if got, st := h.record(id).State, h.d.StateOf(id); got != store.StatePaused || st != runtimetest.Paused {
				t.Errorf("the record says %s, the driver %s; want both paused", got, st)
			}
		},
	},
	{
		name: "resume", call: "resume", frozen: true,
		op: func(h *harness, id string) error {
			_, err := h.m.Resume(context.Background(), id, 0)
			return err
		},
		made: func(t *testing.T, h *harness, id string) {
			if got, st := h.record(id).State, h.d.StateOf(id); got != store.StateRunning || st != runtimetest.Running {
				t.Errorf("the record says %s, the driver %s; want both running", got, st)
			}
		},
	},
	{
		name: "set timeout",
		op: func(h *harness, id string) error {
			_, err := h.m.SetTimeout(context.Background(), id, time.Hour)
			return err
		},
	},
}

// TestShutdownWaitsForSandboxWork defends against a user's operation on
// a live sandbox outliving the shutdown half-made: a snapshot, a fork, a
// template saved from a sandbox, a freezer pause or resume, a new
// timeout were no work Shutdown waited for, so the server went on to
// close its store and driver while the operation still ran the runtime
// and then wrote its files and its record (a snapshot's or template
// version's layer without its record, a frozen sandbox whose record says
// running, a write to a closed store). Shutdown must return only once
// the operation in flight has finished (what it makes, made whole), and
// one asked for once Shutdown has begun is refused with ErrShuttingDown
// and changes nothing: no record, no file, the sandbox's state, record
// and expiry as they were.
func TestShutdownWaitsForSandboxWork(t *testing.T) {
	ctx := context.Background()
	for _, w := range sandboxWorks {
		if w.call == "" {
			continue // SetTimeout holds the Manager's lock, which Shutdown takes first
		}
		t.Run("in flight/"+w.name, func(t *testing.T) {
			h := newHarness(t, testConfig(t))
			rec := h.create(sandbox.CreateRequest{})
			if w.frozen {
				if _, err := h.m.Pause(ctx, rec.ID); err != nil {
					t.Fatal(err)
				}
			}
			g := newGate()
			h.onCall(func(call, id string) {
				if call == w.call && id == rec.ID {
					g.hold()
				}
			})
			errc := make(chan error, 1)
			go func() { errc <- w.op(h, rec.ID) }()
			early, heldAtReturn := h.shutdownWhileHeld(g, false, func() { w.made(t, h, rec.ID) })
			if early {
				t.Errorf("Shutdown returned while the %s was still in its driver call", w.name)
			}
			if !slices.Equal(heldAtReturn, []string{rec.ID}) {
				t.Errorf("when Shutdown returned the driver held %v, want only the sandbox", heldAtReturn)
			}
			if err := <-errc; !errors.Is(err, w.wantErr) {
				t.Errorf("the %s in flight at Shutdown: %v, want %v", w.name, err, w.wantErr)
			}
		})
	}
	for _, w := range sandboxWorks {
		t.Run("after/"+w.name, func(t *testing.T) {
			h := newHarness(t, testConfig(t))
			rec := h.create(sandbox.CreateRequest{})
			if w.frozen {
				if _, err := h.m.Pause(ctx, rec.ID); err != nil {
					t.Fatal(err)
				}
			}
			before, state := h.record(rec.ID), h.d.StateOf(rec.ID)
			h.m.Shutdown(ctx, false)
			defer func() { h.m = h.open() }()
			if err := w.op(h, rec.ID); !errors.Is(err, sandbox.ErrShuttingDown) {
				t.Errorf("a %s once Shutdown has begun: %v, want ErrShuttingDown", w.name, err)
			}
			got := h.record(rec.ID)
			if got.State != before.State || !got.ExpiresAt.Equal(before.ExpiresAt) || got.Persisted != before.Persisted {
				t.Errorf("after a refused %s the record is %s expiring %v (persisted %q), want %s expiring %v as before",
					w.name, got.State, got.ExpiresAt, got.Persisted, before.State, before.ExpiresAt)
			}
			if st, held := h.d.StateOf(rec.ID), h.held(); st != state || !slices.Equal(held, []string{rec.ID}) {
				t.Errorf("after a refused %s the driver holds %v, the sandbox %s; want only it, %s", w.name, held, st, state)
			}
			if w.nothingMade != nil {
				w.nothingMade(t, h, rec.ID)
			}
		})
	}
}
