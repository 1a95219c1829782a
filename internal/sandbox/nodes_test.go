package sandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/audit"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/runtime/runtimetest"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/sandbox/sandboxtest"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/store/pgtest"
	"github.com/corralhq/corral/internal/template/registry"
	"github.com/corralhq/corral/internal/template/registry/registrytest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// eachStore runs f on a new SQLite store and a new PostgreSQL one.
func eachStore(t *testing.T, f func(t *testing.T, st *store.Store, reg *registry.Registry)) {
	for _, b := range []struct {
		name string
		addr func(t *testing.T) string
	}{
		{"sqlite", func(t *testing.T) string { return filepath.Join(t.TempDir(), "corral.db") }},
		{"postgres", func(t *testing.T) string { return pgtest.Shared(t).NewDatabase(t) }},
	} {
		t.Run(b.name, func(t *testing.T) {
			st, err := store.Open(b.addr(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			reg, _ := registrytest.New(t, st)
			f(t, st, reg)
		})
	}
}

// node is one control plane of a multi-node test: a Manager with its
// own node id over a shared store.
type node struct {
	t   *testing.T
	cfg sandbox.Config
	st  *store.Store
	reg *registry.Registry
	d   runtime.Driver
	al  *audit.Log
	m   *sandbox.Manager
	// wrap, when set, wraps the node's audit log (a test seam).
	wrap func(*audit.Log) recorder
	// stopped: stop was called since the last open.
	stopped bool
}

// recorder is what a Manager needs of its audit log (*audit.Log).
type recorder interface {
	Record(sandbox, kind string, data any)
	RecordBy(ctx context.Context, sandbox, kind string, data any)
	RecordSandboxEnd(ctx context.Context, end *store.SandboxEnd, kind string, data any) (bool, error)
}

func startNode(t *testing.T, st *store.Store, reg *registry.Registry, d runtime.Driver, id string, mod func(*sandbox.Config)) *node {
	t.Helper()
	cfg := testConfig(t)
	cfg.Node = id
	if mod != nil {
		mod(&cfg)
	}
	n := &node{t: t, cfg: cfg, st: st, reg: reg, d: d}
	n.open()
	t.Cleanup(func() {
		if !n.stopped {
			n.stop()
		}
	})
	return n
}

func (n *node) open() {
	n.t.Helper()
	n.al = audit.New(n.st, nil, nil)
	n.cfg.Audit = n.al
	if n.wrap != nil {
		n.cfg.Audit = n.wrap(n.al)
	}
	n.cfg.Admission = testConfig(n.t).Admission
	n.stopped = false
	n.m = sandbox.New(n.cfg, n.st, n.d, n.reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := n.m.Reconcile(context.Background()); err != nil {
		n.t.Fatalf("node %s: reconcile: %v", n.cfg.Node, err)
	}
}

// stop is the node's control plane stopping (or dying): its sandboxes
// keep running.
func (n *node) stop() {
	n.stopped = true
	n.m.Shutdown(context.Background(), false)
	n.al.Close()
}

func rec(t *testing.T, st *store.Store, id string) *store.Sandbox {
	t.Helper()
	r, err := st.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatalf("record of %s: %v", id, err)
	}
	return r
}

func holds(d runtime.Driver, id string) bool {
	ids, _ := d.List(context.Background())
	for _, h := range ids {
		if h == id {
			return true
		}
	}
	return false
}

// TestNodesLocalRuntime: two control planes with host-local drivers
// (runc, runsc: each sees only its own host's sandboxes) on one store, on
// both backends. Defends against a control plane taking the other's
// sandboxes for its own lost ones: before records named their node, the
// second node's start-up reconcile ended every running record its own
// driver did not hold (the first node's live sandboxes) as orphaned, and
// closed their open command records.
//   - a node's reconcile and reaper leave the other node's records
//     running and its sandboxes alive;
//   - a kill of the other node's sandbox is refused with an
//     OtherNodeError naming the owner, and changes nothing;
//   - the owner, restarted, adopts its sandbox;
//   - a record made before records had a node is the first starting
//     node's: it adopts it and the record names it.
func TestNodesLocalRuntime(t *testing.T) {
	eachStore(t, func(t *testing.T, st *store.Store, reg *registry.Registry) {
		ctx := context.Background()
		dA, dB := runtimetest.New(), runtimetest.New()
		a := startNode(t, st, reg, dA, "node-a", nil)
		sbA := createOn(t, a.m)
		if r := rec(t, st, sbA.ID); r.Node != "node-a" {
			t.Fatalf("record of a's sandbox names node %q", r.Node)
		}

		b := startNode(t, st, reg, dB, "node-b", nil)
		b.m.Reap(ctx)
		if r := rec(t, st, sbA.ID); r.State != store.StateRunning {
			t.Fatalf("node b's reconcile ended node a's sandbox: %+v", r)
		}
		if !dA.Alive(sbA.ID) || !a.m.Running(sbA.ID) {
			t.Fatal("node a's sandbox is no longer running")
		}

		_, err := b.m.Kill(ctx, sbA.ID)
		var other *sandbox.OtherNodeError
		if !errors.As(err, &other) || other.Node != "node-a" {
			t.Fatalf("kill through node b: %v, want an OtherNodeError naming node-a", err)
		}
		if r := rec(t, st, sbA.ID); r.State != store.StateRunning || !dA.Alive(sbA.ID) {
			t.Fatalf("a refused kill changed the sandbox: %+v", r)
		}
		if _, err := b.m.Kill(ctx, "nosuchsandbox"); !errors.Is(err, sandbox.ErrNotFound) {
			t.Fatalf("kill of an unknown sandbox: %v, want ErrNotFound", err)
		}

		// A record from before nodes, with its sandbox running on a's host.
		now := time.Now().UTC()
		old := &store.Sandbox{ID: "oldsandbox01", Template: "base", Runtime: "runc", Tier: sandbox.DefaultTier, State: store.StateRunning,
			CreatedAt: now, ExpiresAt: now.Add(time.Hour), AccessToken: "old-token-0123456789abcdef", Team: store.DefaultTeam}
		if err := st.InsertSandbox(ctx, old); err != nil {
			t.Fatal(err)
		}
		if _, err := dA.Start(ctx, runtime.Config{ID: old.ID, AccessToken: old.AccessToken, Runtime: runtime.Runc}); err != nil {
			t.Fatal(err)
		}

		a.stop()
		a.open()
		if !a.m.Running(sbA.ID) {
			t.Fatal("restarted node a did not adopt its sandbox")
		}
		if r := rec(t, st, old.ID); r.Node != "node-a" || r.State != store.StateRunning || !a.m.Running(old.ID) {
			t.Fatalf("the record without a node: %+v (running here: %v), want adopted by node-a", r, a.m.Running(old.ID))
		}
		if _, err := a.m.Kill(ctx, sbA.ID); err != nil {
			t.Fatalf("kill through the owner: %v", err)
		}
		if r := rec(t, st, sbA.ID); r.EndReason != sandbox.EndKilled || dA.Alive(sbA.ID) {
			t.Fatalf("killed through its owner: %+v", r)
		}
	})
}

func createOn(t *testing.T, m *sandbox.Manager) *store.Sandbox {
	t.Helper()
	sb, err := m.Create(context.Background(), sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// sharedDriver is the fake driver as a shared runtime (as Kubernetes
// is: every node sees every sandbox); gate, when set, holds Start until
// it is closed, and onList runs before each List.
type sharedDriver struct {
	*runtimetest.Driver
	mu     sync.Mutex
	gate   chan struct{}
	onList func()
}

func (*sharedDriver) SharedRuntime() bool { return true }

func (d *sharedDriver) Start(ctx context.Context, cfg runtime.Config) (*runtime.Handle, error) {
	d.mu.Lock()
	g := d.gate
	d.mu.Unlock()
	if g != nil {
		<-g
	}
	return d.Driver.Start(ctx, cfg)
}

func (d *sharedDriver) List(ctx context.Context) ([]string, error) {
	d.mu.Lock()
	f := d.onList
	d.onList = nil
	d.mu.Unlock()
	if f != nil {
		f()
	}
	return d.Driver.List(ctx)
}

func endedEvents(t *testing.T, st *store.Store, id string) int {
	t.Helper()
	evs, err := st.ListEvents(context.Background(), store.EventFilter{SandboxID: id, Kind: "sandbox.ended"})
	if err != nil {
		t.Fatal(err)
	}
	return len(evs)
}

// TestNodesSharedRuntime: two control planes on one store and one
// shared runtime (every node sees every sandbox, as on Kubernetes), on
// both backends. Defends against:
//   - the reconcile race: a node starting while another node's create is
//     in flight (its record inserted, its sandbox not started yet) ended
//     that record as lost and reclaimed the sandbox when it appeared;
//     and a record inserted between the starting node's listing of the
//     records and its listing of the runtime made the new sandbox an
//     orphan, deleted under its creator;
//   - the reaper of one node deleting the other node's running sandboxes
//     every 30 s (they are not live in its memory);
//   - a kill sent to a node that does not hold the sandbox failing (404)
//     while the sandbox runs on; now any node kills it, once: one end,
//     one sandbox.ended event, and the owner forgets it;
//   - the API's warm pools, whose idle sandboxes have no record (the
//     other node would reclaim them), are refused;
//   - sandboxes of a node gone for good running for ever: another node
//     ends them once overdue (past the TTL; the sandbox gone, the record
//     older than the create deadline), and not before.
func TestNodesSharedRuntime(t *testing.T) {
	eachStore(t, func(t *testing.T, st *store.Store, reg *registry.Registry) {
		ctx := context.Background()
		d := &sharedDriver{Driver: runtimetest.New()}
		a := startNode(t, st, reg, d, "node-a", nil)

		// A create in flight on a while b starts.
		gate := make(chan struct{})
		d.mu.Lock()
		d.gate = gate
		d.mu.Unlock()
		inflight := sandboxtest.CreateInFlight(t, a.m, st, "node-a")
		b := startNode(t, st, reg, d, "node-b", nil)
		b.m.Reap(ctx)
		if r := rec(t, st, inflight.Record.ID); r.State != store.StateRunning {
			t.Fatalf("node b ended node a's create in flight: %+v", r)
		}
		d.mu.Lock()
		d.gate = nil
		d.mu.Unlock()
		close(gate)
		created, err := inflight.Wait()
		if err != nil {
			t.Fatalf("the create in flight failed: %v", err)
		}
		b.m.Reap(ctx)
		if got := rec(t, st, created.ID); got.State != store.StateRunning || !d.Alive(created.ID) || !a.m.Running(created.ID) {
			t.Fatalf("after b's reaper: %+v, alive %v", got, d.Alive(created.ID))
		}

		// A create that inserts its record and starts its sandbox between
		// a starting node's two listings.
		var late *store.Sandbox
		d.mu.Lock()
		d.onList = func() { late = createOn(t, a.m) }
		d.mu.Unlock()
		b.stop()
		b.open()
		if late == nil {
			t.Fatal("the hook did not run")
		}
		if got := rec(t, st, late.ID); got.State != store.StateRunning || !d.Alive(late.ID) {
			t.Fatalf("a create between b's listings: %+v, alive %v", got, d.Alive(late.ID))
		}
		if b.m.Running(late.ID) {
			t.Fatal("node b adopted node a's sandbox")
		}

		// The API's warm pools would start sandboxes without records,
		// which the other node's reaper would take for orphans.
		if _, err := b.m.SetPool(ctx, sandbox.PoolConfig{Template: "base", Min: 1, Max: 1}); !errors.Is(err, runtime.ErrUnsupported) {
			t.Fatalf("a warm pool of the API under a shared runtime: %v, want ErrUnsupported", err)
		}

		// A kill through the other node.
		if _, err := b.m.Kill(ctx, late.ID); err != nil {
			t.Fatalf("kill through node b: %v", err)
		}
		if got := rec(t, st, late.ID); got.State != store.StateEnded || got.EndReason != sandbox.EndKilled || d.Alive(late.ID) {
			t.Fatalf("killed through node b: %+v, alive %v", got, d.Alive(late.ID))
		}
		eventually(t, "node a forgets the killed sandbox", func() bool { return !a.m.Running(late.ID) })
		a.al.Sync()
		b.al.Sync()
		if got := rec(t, st, late.ID); got.EndReason != sandbox.EndKilled {
			t.Fatalf("the owner's death check rewrote the end: %+v", got)
		}
		if n := endedEvents(t, st, late.ID); n != 1 {
			t.Fatalf("%d sandbox.ended events for a sandbox killed through another node, want 1", n)
		}

		// Node a goes away for good, leaving a sandbox with a short TTL
		// and one whose sandbox dies meanwhile.
		ttl := int64(1)
		expiring, err := a.m.Create(ctx, sandbox.CreateRequest{Timeout: &ttl})
		if err != nil {
			t.Fatal(err)
		}
		lost := createOn(t, a.m)
		a.stop()
		if err := d.Stop(ctx, lost.ID, 0); err != nil {
			t.Fatal(err)
		}
		// b with the default grace and create deadline: nothing is
		// overdue yet.
		b.m.Reap(ctx)
		if got := rec(t, st, lost.ID); got.State != store.StateRunning {
			t.Fatalf("node b ended a young record at once: %+v", got)
		}
		b.stop()
		b.cfg.ForeignGrace = 100 * time.Millisecond
		b.cfg.CreateDeadline = 100 * time.Millisecond
		b.open()
		eventually(t, "node b ends node a's overdue sandboxes", func() bool {
			b.m.Reap(ctx)
			return rec(t, st, expiring.ID).State == store.StateEnded && rec(t, st, lost.ID).State == store.StateEnded
		})
		if got := rec(t, st, expiring.ID); got.EndReason != sandbox.EndTTL || d.Alive(expiring.ID) {
			t.Fatalf("expired sandbox of a gone node: %+v, alive %v", got, d.Alive(expiring.ID))
		}
		if got := rec(t, st, lost.ID); got.EndReason != sandbox.EndOrphaned {
			t.Fatalf("lost sandbox of a gone node: %+v", got)
		}
		if got := rec(t, st, created.ID); got.State != store.StateRunning {
			t.Fatalf("a sandbox of node a that is neither expired nor lost was ended: %+v", got)
		}
	})
}

// endRace is a node's audit log that runs race once, just before the
// node records the end of sandbox id: another node's kill landing while
// the owner ends the sandbox (after its stop, before its record).
type endRace struct {
	*audit.Log
	// mu guards id and race, set by the test after the create while the
	// sandbox's TTL timer may already read them.
	mu   sync.Mutex
	id   string
	race func()
	once sync.Once
}

// set arms the race for sandbox id.
func (r *endRace) set(id string, race func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.id, r.race = id, race
}

// runFor runs the race once if id is its sandbox.
func (r *endRace) runFor(id string) {
	r.mu.Lock()
	race := r.race
	ok := id == r.id
	r.mu.Unlock()
	if ok {
		r.once.Do(race)
	}
}

func (r *endRace) RecordBy(ctx context.Context, sandbox, kind string, data any) {
	if kind == "sandbox.ended" {
		r.runFor(sandbox)
	}
	r.Log.RecordBy(ctx, sandbox, kind, data)
}

func (r *endRace) RecordSandboxEnd(ctx context.Context, end *store.SandboxEnd, kind string, data any) (bool, error) {
	r.runFor(end.ID)
	return r.Log.RecordSandboxEnd(ctx, end, kind, data)
}

// TestOneEndEventWhateverTheRace: under a shared runtime, the owner's own
// end of a sandbox (a kill through it, its TTL, the watchdog's runaway
// kill) and a kill through another node racing it record one end and
// exactly one sandbox.ended event, whose reason is the record's, on both
// backends. Defends against the owner checking that the record had not
// ended, the other node's kill ending it (with its event) in between,
// and the owner then recording a second event, with a reason the record
// does not have (the audit log then says the sandbox ended twice). The
// other node's kill is made to land in exactly that window; then both
// nodes kill sandboxes at once.
func TestOneEndEventWhateverTheRace(t *testing.T) {
	eachStore(t, func(t *testing.T, st *store.Store, reg *registry.Registry) {
		ctx := context.Background()
		d := &sharedDriver{Driver: runtimetest.New()}
		b := startNode(t, st, reg, d, "node-b", nil)
		for _, tc := range []struct {
			name string
			req  sandbox.CreateRequest
			end  func(a *node, id string) // the owner's own end (nil: its TTL)
		}{
			{"kill", sandbox.CreateRequest{}, func(a *node, id string) { _, _ = a.m.Kill(ctx, id) }},
			{"ttl", sandbox.CreateRequest{Timeout: ptr[int64](1)}, nil},
			{"runaway", sandbox.CreateRequest{}, func(a *node, id string) { a.m.OnRunaway(id) }},
		} {
			t.Run(tc.name, func(t *testing.T) {
				race := &endRace{}
				a := startNode(t, st, reg, d, "node-a-"+tc.name, nil)
				a.wrap = func(l *audit.Log) recorder { race.Log = l; return race }
				a.stop()
				a.open()
				sb, err := a.m.Create(ctx, tc.req)
				if err != nil {
					t.Fatal(err)
				}
				raced := make(chan error, 1)
				race.set(sb.ID, func() {
					_, err := b.m.Kill(ctx, sb.ID)
					raced <- err
				})
				if tc.end != nil {
					tc.end(a, sb.ID)
				}
				select {
				case err := <-raced:
					if err != nil {
						t.Fatalf("the kill through node b: %v", err)
					}
				case <-time.After(time.Minute):
					t.Fatal("node a never recorded the sandbox's end")
				}
				eventually(t, "node a forgets the sandbox", func() bool { return !a.m.Running(sb.ID) })
				a.al.Sync()
				b.al.Sync()
				got := rec(t, st, sb.ID)
				evs, err := st.ListEvents(ctx, store.EventFilter{SandboxID: sb.ID, Kind: "sandbox.ended"})
				if err != nil {
					t.Fatal(err)
				}
				if len(evs) != 1 {
					t.Fatalf("%d sandbox.ended events for one end (%s), want 1: %v", len(evs), got.EndReason, eventData(evs))
				}
				var data struct{ Reason string }
				if err := json.Unmarshal(evs[0].Data, &data); err != nil || got.State != store.StateEnded || data.Reason != got.EndReason {
					t.Fatalf("the record ended %q (%s), its event says %q (%v)", got.EndReason, got.State, data.Reason, err)
				}
				if d.Alive(sb.ID) {
					t.Fatal("the sandbox still runs")
				}
			})
		}
		t.Run("at once", func(t *testing.T) {
			a := startNode(t, st, reg, d, "node-a", nil)
			for range 5 {
				sb := createOn(t, a.m)
				var wg sync.WaitGroup
				for _, n := range []*node{a, b} {
					wg.Go(func() { _, _ = n.m.Kill(ctx, sb.ID) })
				}
				wg.Wait()
				eventually(t, "node a forgets the sandbox", func() bool { return !a.m.Running(sb.ID) })
				a.al.Sync()
				b.al.Sync()
				if n := endedEvents(t, st, sb.ID); n != 1 {
					t.Fatalf("%d sandbox.ended events for a sandbox killed through both nodes at once, want 1", n)
				}
			}
		})
	})
}

func eventData(evs []*store.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = string(ev.Data)
	}
	return out
}
