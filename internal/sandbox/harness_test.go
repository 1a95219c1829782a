package sandbox_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/audit"
	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/runtime/runtimetest"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template/registry"
	"github.com/corralhq/corral/internal/template/registry/registrytest"
)

// harness is a Manager over a real SQLite store in a temporary directory
// and the fake runtime driver: no root, no runc, no network.
type harness struct {
	t      testing.TB
	st     *store.Store
	reg    *registry.Registry
	d      *runtimetest.Driver
	m      *sandbox.Manager
	cfg    sandbox.Config
	rootfs string
	// callHook is the hook of hookedDriver (onCall).
	callHook atomic.Pointer[func(call, id string)]
}

// hookedDriver is the harness's fake driver with a hook before the
// calls the fake has none for (Snapshot, Pause, Resume), so that a test
// can hold one in flight (gate, onCall). The fake's other methods,
// optional interfaces included, are its own.
type hookedDriver struct {
	*runtimetest.Driver
	hook *atomic.Pointer[func(call, id string)]
}

func (d hookedDriver) before(call, id string) {
	if f := d.hook.Load(); f != nil {
		(*f)(call, id)
	}
}

func (d hookedDriver) Snapshot(ctx context.Context, id, dst string) (int64, error) {
	d.before("snapshot", id)
	return d.Driver.Snapshot(ctx, id, dst)
}

func (d hookedDriver) Pause(ctx context.Context, id string) error {
	d.before("pause", id)
	return d.Driver.Pause(ctx, id)
}

func (d hookedDriver) Resume(ctx context.Context, id string) error {
	d.before("resume", id)
	return d.Driver.Resume(ctx, id)
}

// onCall makes every later Snapshot, Pause and Resume of the Manager's
// driver call hook(call, id) first, call being "snapshot", "pause" or
// "resume"; nil removes the hook.
func (h *harness) onCall(hook func(call, id string)) {
	if hook == nil {
		h.callHook.Store(nil)
		return
	}
	h.callHook.Store(&hook)
}

var _ runtime.Driver = hookedDriver{}

// testConfig is a Manager configuration for unit tests: a fast death
// check, no kill grace, snapshots in a temporary directory, no memory
// pressure, and admission limits no test reaches unless it sets its own.
func testConfig(t testing.TB) sandbox.Config {
	return sandbox.Config{
		WatchInterval:  20 * time.Millisecond,
		KillGrace:      time.Millisecond,
		SnapshotDir:    filepath.Join(t.TempDir(), "snapshots"),
		MemoryPressure: func() bool { return false },
		Admission: govern.NewAdmission(govern.AdmissionConfig{MaxConcurrent: 50, MaxPerAgent: 50,
			AgentRate: 1000, AgentBurst: 1000}),
	}
}

func newHarness(t testing.TB, cfg sandbox.Config) *harness {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	reg, rootfs := registrytest.New(t, st)
	if u, ok := cfg.Audit.(interface{ useStore(*store.Store) }); ok {
		u.useStore(st) // a fake recorder writes the ends it records
	}
	h := &harness{t: t, st: st, reg: reg, d: runtimetest.New(), cfg: cfg, rootfs: rootfs}
	h.m = h.open()
	t.Cleanup(func() {
		h.m.Shutdown(context.Background(), false)
		for _, id := range h.held() {
			_ = h.d.Stop(context.Background(), id, 0)
		}
		st.Close()
	})
	return h
}

// open makes a Manager over the harness's store and driver and
// reconciles, as a server start does.
func (h *harness) open() *sandbox.Manager {
	h.t.Helper()
	m := sandbox.New(h.cfg, h.st, hookedDriver{Driver: h.d, hook: &h.callHook}, h.reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := m.Reconcile(context.Background()); err != nil {
		h.t.Fatalf("reconcile: %v", err)
	}
	return m
}

// restart is a control-plane restart: the Manager stops (sandboxes keep
// running) and a new one over the same store and driver reconciles.
// Admission is fresh, as it is in a new process.
func (h *harness) restart() {
	h.t.Helper()
	h.m.Shutdown(context.Background(), false)
	h.cfg.Admission = testConfig(h.t).Admission
	h.m = h.open()
}

func (h *harness) create(req sandbox.CreateRequest) *store.Sandbox {
	h.t.Helper()
	sb, err := h.m.Create(context.Background(), req)
	if err != nil {
		h.t.Fatalf("create %+v: %v", req, err)
	}
	return sb
}

func (h *harness) record(id string) *store.Sandbox {
	h.t.Helper()
	sb, err := h.st.GetSandbox(context.Background(), id)
	if err != nil {
		h.t.Fatalf("record of %s: %v", id, err)
	}
	return sb
}

func (h *harness) held() []string {
	ids, _ := h.d.List(context.Background())
	return ids
}

// waitEnded polls until the record of id has ended and returns it.
func (h *harness) waitEnded(id string) *store.Sandbox {
	h.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if sb := h.record(id); sb.State == store.StateEnded {
			return sb
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.t.Fatalf("sandbox %s never ended", id)
	return nil
}

// eventually polls cond until it holds or a generous deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func ptr[T any](v T) *T { return &v }

// newGovernedHarness is newHarness with a governor and a real audit log;
// onTrip (if not nil) is the governor's OnTrip callback, given the
// harness.
func newGovernedHarness(tb testing.TB, onTrip func(*harness, *store.Task)) *harness {
	tb.Helper()
	h := newHarness(tb, testConfig(tb))
	h.m.Shutdown(context.Background(), false)
	al := audit.New(h.st, nil, nil)
	tb.Cleanup(al.Close)
	h.cfg.Audit = al
	gc := govern.Config{Audit: al}
	if onTrip != nil {
		gc.OnTrip = func(t *store.Task) { onTrip(h, t) }
	}
	h.cfg.Governor = govern.New(gc, h.st)
	h.m = h.open()
	return h
}
