package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
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
			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			h.d.OnStop(func(id string) {
				if id == rec.ID {
					once.Do(func() { close(entered) })
					<-release
				}
			})
			go h.m.OnRunaway(rec.ID)
			<-entered
			done := make(chan struct{})
			go func() {
				h.m.Shutdown(context.Background(), killAll)
				close(done)
			}()
			select {
			case <-done:
				close(release)
				h.d.OnStop(nil)
				h.m = h.open() // the harness's cleanup shuts this one down
				t.Fatal("Shutdown returned while the sandbox's end was still stopping it")
			case <-time.After(300 * time.Millisecond):
			}
			close(release)
			<-done
			got, err := h.st.GetSandbox(context.Background(), rec.ID)
			if err != nil || got.State != store.StateEnded || got.EndReason != sandbox.EndCPURunaway {
				t.Fatalf("after Shutdown the record is %+v (%v); want ended cpu_runaway", got, err)
			}
			if held := h.held(); len(held) != 0 {
				t.Fatalf("the driver still holds %v after Shutdown", held)
			}
			h.d.OnStop(nil)
			h.m = h.open()
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
			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			h.d.OnStart(func(runtime.Config) error {
				once.Do(func() { close(entered) })
				<-release
				return nil
			})
			if _, err := h.m.SetPool(context.Background(), sandbox.PoolConfig{Template: "base", Min: 2}); err != nil {
				t.Fatal(err)
			}
			<-entered // the first refill's Start is in flight
			done := make(chan struct{})
			go func() {
				h.m.Shutdown(context.Background(), killAll)
				close(done)
			}()
			// Let Shutdown reach the pools before the Start finishes: it
			// returns at once without the fix, waits for the refill with it.
			select {
			case <-done:
			case <-time.After(2 * time.Second):
			}
			close(release)
			<-done
			eventually(t, "the refill's Start to return", func() bool { return h.d.Starts() >= 1 })
			if held := h.held(); len(held) != 0 {
				t.Errorf("the driver still holds %v after Shutdown: a refill in flight outlived it", held)
			}
			if n := h.d.Starts(); n != 1 {
				t.Errorf("%d pooled sandboxes started, want only the one in flight at Shutdown", n)
			}
			h.d.OnStart(nil)
			h.m = h.open() // the harness's cleanup shuts this one down
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
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var released atomic.Bool
	h.d.OnStart(func(runtime.Config) error {
		once.Do(func() { close(entered) })
		<-release
		return nil
	})
	created := make(chan error, 1)
	go func() {
		_, err := h.m.Create(context.Background(), sandbox.CreateRequest{})
		created <- err
	}()
	<-entered
	done := make(chan struct{})
	var early atomic.Bool // Shutdown returned with the Start still held
	var heldAtReturn []string
	go func() {
		h.m.Shutdown(context.Background(), false)
		early.Store(!released.Load())
		heldAtReturn = h.held()
		close(done)
	}()
	select { // let Shutdown reach its waits before the Start finishes
	case <-done:
	case <-time.After(2 * time.Second):
	}
	released.Store(true)
	close(release)
	<-done
	if early.Load() {
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
	h.d.OnStart(nil)
	h.m = h.open() // the harness's cleanup shuts this one down
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
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var released atomic.Bool
	h.d.OnStop(func(id string) {
		if id == rec.ID {
			once.Do(func() { close(entered) })
			<-release
		}
	})
	<-entered // the TTL fired: the persisted pause is stopping the sandbox
	done := make(chan struct{})
	var early atomic.Bool
	go func() {
		h.m.Shutdown(context.Background(), false)
		early.Store(!released.Load())
		close(done)
	}()
	select { // let Shutdown reach its waits before the stop finishes
	case <-done:
	case <-time.After(2 * time.Second):
	}
	released.Store(true)
	close(release)
	<-done
	if early.Load() {
		t.Error("Shutdown returned while the TTL's auto-pause was still stopping the sandbox")
	}
	if got := h.record(rec.ID); got.State != store.StatePaused {
		t.Errorf("after Shutdown the record is %s, want paused", got.State)
	}
	if held := h.held(); len(held) != 0 {
		t.Errorf("the driver still holds %v after Shutdown", held)
	}
	h.d.OnStop(nil)
	h.m = h.open() // the harness's cleanup shuts this one down
}
