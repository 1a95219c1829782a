package pool

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/actor"
	"github.com/corralhq/corral/internal/store"
)

// fakeStarter starts "sandboxes" in memory for the pools' unit tests.
type fakeStarter struct {
	mu      sync.Mutex
	n       int
	running map[string]string // id → template version
	version string
	room    int
	// owned records, per started id, whether the pools owned it when the
	// runtime started it (the reaper must never see a pooled sandbox
	// that no one owns).
	owned map[string]bool
	// team records, per started id, the team it was started for.
	team map[string]string
	ps   *Pools
	// stops counts StopIdle calls; onStop, if set, is called first by
	// each (a test can hold a stop in flight).
	stops  int
	onStop func(id string)
}

func (f *fakeStarter) StartIdle(team, template string, claim func(string)) (*Idle, error) {
	f.mu.Lock()
	f.n++
	id := fmt.Sprintf("sb%d", f.n)
	v := f.version
	f.mu.Unlock()
	claim(id)
	owned := f.ps.Owns(id)
	f.mu.Lock()
	f.running[id], f.owned[id], f.team[id] = v, owned, team
	f.mu.Unlock()
	return &Idle{ID: id, Token: "tok-" + id, Version: v, Started: time.Now()}, nil
}

func (f *fakeStarter) StopIdle(id string) {
	f.mu.Lock()
	hook := f.onStop
	f.mu.Unlock()
	if hook != nil {
		hook(id)
	}
	f.mu.Lock()
	f.stops++
	delete(f.running, id)
	f.mu.Unlock()
}

func (f *fakeStarter) stopCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stops
}

func (f *fakeStarter) Alive(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.running[id]
	return ok
}

func (f *fakeStarter) Room() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.room
}

func (f *fakeStarter) runningCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.running)
}

// runningOf counts the running sandboxes of template version v.
func (f *fakeStarter) runningOf(v string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, rv := range f.running {
		if rv == v {
			n++
		}
	}
	return n
}

type events struct {
	mu    sync.Mutex
	kinds []string
	teams []string // the team of the actor of each event
}

func (e *events) RecordBy(ctx context.Context, _, kind string, _ any) {
	e.mu.Lock()
	e.kinds = append(e.kinds, kind)
	e.teams = append(e.teams, actor.From(ctx).Team)
	e.mu.Unlock()
}

// teamsOf returns the teams of the events of kind.
func (e *events) teamsOf(kind string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for i, k := range e.kinds {
		if k == kind {
			out = append(out, e.teams[i])
		}
	}
	return out
}

func (e *events) has(kind string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, k := range e.kinds {
		if k == kind {
			return true
		}
	}
	return false
}

func newTestPools(t *testing.T, room int, pressure *atomic.Bool) (*Pools, *fakeStarter, *events) {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f := &fakeStarter{running: map[string]string{}, owned: map[string]bool{}, team: map[string]string{}, version: "base:v1", room: room}
	ev := &events{}
	ps := New(f, st, ev, pressure.Load, nil)
	f.ps = ps
	return ps, f, ev
}

// waitIdle polls until the pool holds n idle sandboxes (n < 0: as many
// as its target).
func waitIdle(t *testing.T, ps *Pools, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ps.Refill()
		l := ps.List()
		if len(l) == 1 && (l[0].Idle == n || n < 0 && l[0].Idle == l[0].Target) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool: %+v, want %d idle", l, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPoolsLifecycle drives the pools through a fake Starter: a pool
// fills to its min within the global limit and owns its sandboxes from
// before they start (else the reaper could reclaim a starting one); a
// take hands out a sandbox of the current template version only and
// discards stale ones; a user's create at the limit evicts an idle
// sandbox; memory pressure empties the pools and records why. It runs in
// milliseconds without root, beside TestWarmPool and
// TestWarmPoolMemoryPressure (real sandboxes).
func TestPoolsLifecycle(t *testing.T) {
	var pressure atomic.Bool
	ps, f, ev := newTestPools(t, 10, &pressure)
	ctx := context.Background()
	if _, err := ps.Set(ctx, Config{Template: "base", Min: 2, Max: 4}); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, ps, 2)
	for id, owned := range f.owned {
		if !owned {
			t.Errorf("%s was started before the pools owned it", id)
		}
	}

	// The template gets a new version: a take of it discards what the
	// pool holds (and what a refill still running started) and misses.
	f.mu.Lock()
	f.version = "base:v2"
	f.mu.Unlock()
	if pd := ps.Take("", "base", "base:v2"); pd != nil {
		t.Fatalf("took %+v of version %s, want a miss", pd, pd.Version)
	}
	deadline := time.Now().Add(10 * time.Second)
	for f.runningOf("base:v1") != 0 && time.Now().Before(deadline) {
		ps.Take("", "base", "base:v2") // drops v1 sandboxes a late refill added
		ps.Refill()
		time.Sleep(5 * time.Millisecond) // stale ones are discarded in the background
	}
	if n := f.runningOf("base:v1"); n != 0 {
		t.Fatalf("%d stale pooled sandboxes still run", n)
	}
	waitIdle(t, ps, -1) // the misses grew the target past the min
	pd := ps.Take("", "base", "base:v2")
	if pd == nil || !ps.Owns(pd.ID) {
		t.Fatalf("take: %+v (owned %v), want a sandbox still owned until released", pd, pd != nil && ps.Owns(pd.ID))
	}
	ps.Release(pd.ID)
	if ps.Owns(pd.ID) {
		t.Fatal("released sandbox still owned")
	}

	// At the global limit (Room: the limit less the live sandboxes, here
	// the idle ones' worth) a user's create makes room.
	idle := ps.List()[0].Idle
	f.mu.Lock()
	f.room = idle
	f.mu.Unlock()
	if free := ps.Free(); free != 0 {
		t.Fatalf("free %d with %d idle sandboxes and room for as many, want 0", free, idle)
	}
	ps.MakeRoom()
	if l := ps.List(); l[0].Idle != idle-1 || l[0].Evicted == 0 || ps.Free() != 1 {
		t.Fatalf("after MakeRoom at the limit: %+v, free %d; want one idle sandbox evicted", l, ps.Free())
	}
	ps.MakeRoom() // room left: nothing is evicted
	if l := ps.List(); l[0].Idle != idle-1 {
		t.Fatalf("MakeRoom with room left evicted: %+v", l)
	}

	// Memory pressure empties the pools and records why.
	pressure.Store(true)
	ps.Refill()
	if l := ps.List(); l[0].Idle != 0 {
		t.Fatalf("under pressure: %+v, want no idle sandbox", l)
	}
	if !ev.has("pool.emptied") {
		t.Fatal("no pool.emptied event under memory pressure")
	}
	if n := f.runningCount(); n != 1 { // the taken one, live now
		t.Fatalf("%d sandboxes run under memory pressure, want only the taken one", n)
	}
}

// TestPoolsRefuseBadSizes: a pool configuration out of bounds is refused
// with an InvalidError and changes nothing (no pool, no record).
func TestPoolsRefuseBadSizes(t *testing.T) {
	var pressure atomic.Bool
	ps, _, _ := newTestPools(t, 10, &pressure)
	for _, c := range []Config{
		{Template: "base", Min: -1},
		{Template: "base", Min: 3, Max: 2},
		{Template: "base", Min: 1, Max: MaxSize + 1},
		{Template: "base", Min: 1, MaxIdle: time.Second},
		{Template: "base", Min: 1, MaxIdle: 25 * time.Hour},
	} {
		_, err := ps.Set(context.Background(), c)
		if _, ok := err.(*InvalidError); !ok {
			t.Errorf("Set(%+v) = %v, want an InvalidError", c, err)
		}
	}
	if l := ps.List(); len(l) != 0 {
		t.Fatalf("pools after refused sets: %+v", l)
	}
	ps.Load(context.Background())
	if l := ps.List(); len(l) != 0 {
		t.Fatalf("pools recorded by refused sets: %+v", l)
	}
}

// TestPoolsArePerTeam: a warm pool belongs to one team. Team A's create
// must never be handed a sandbox started for team B's pool of the same
// template (it would run as B's, with B's template, and B's pool would
// pay for A), removing B's pool must leave A's alone, and both survive a
// restart (Load) with their teams. Memory pressure records why the pools
// emptied in each affected team's own log (a server-wide event is not
// one a team's audit query sees).
func TestPoolsArePerTeam(t *testing.T) {
	var pressure atomic.Bool
	ps, f, ev := newTestPools(t, 10, &pressure)
	ctx := context.Background()
	if _, err := ps.Set(ctx, Config{Team: "team-b", Template: "base", Min: 2, Max: 2}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for ps.List()[0].Idle != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("team B's pool did not fill: %+v", ps.List())
		}
		ps.Refill()
		time.Sleep(5 * time.Millisecond)
	}
	if pd := ps.Take("team-a", "base", "base:v1"); pd != nil {
		t.Fatalf("team A took %s, a sandbox of team B's pool (started for %q)", pd.ID, f.team[pd.ID])
	}
	if pd := ps.Take("", "base", "base:v1"); pd != nil {
		t.Fatalf("the default team took %s of team B's pool", pd.ID)
	}
	pd := ps.Take("team-b", "base", "base:v1")
	if pd == nil {
		t.Fatal("team B's take missed its own full pool")
	}
	f.mu.Lock()
	started := f.team[pd.ID]
	f.mu.Unlock()
	if started != "team-b" {
		t.Fatalf("team B's take = %+v started for %q, want one started for team-b", pd, started)
	}
	ps.Release(pd.ID)
	if _, err := ps.Set(ctx, Config{Team: "team-a", Template: "base", Min: 1, Max: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := ps.Set(ctx, Config{Team: "team-a", Template: "base"}); err != nil { // A removes its pool
		t.Fatal(err)
	}
	if l := ps.List(); len(l) != 1 || l[0].Team != "team-b" || l[0].Min != 2 {
		t.Fatalf("pools after team A removed its own: %+v, want team B's untouched", l)
	}
	pressure.Store(true)
	for deadline := time.Now().Add(10 * time.Second); len(ev.teamsOf("pool.emptied")) == 0 && time.Now().Before(deadline); {
		ps.Refill() // returns at once while a background pass runs
		time.Sleep(5 * time.Millisecond)
	}
	if got := ev.teamsOf("pool.emptied"); len(got) != 1 || got[0] != "team-b" {
		t.Fatalf("pool.emptied events of teams %q, want one of team-b (whose pool held the idle sandbox)", got)
	}
	again := New(f, ps.st, nil, pressure.Load, nil)
	again.Load(ctx)
	if l := again.List(); len(l) != 1 || l[0].Team != "team-b" || l[0].Template != "base" {
		t.Fatalf("pools loaded from the store: %+v, want team B's", l)
	}
}

// TestDrainStopsTakenSandboxes defends against a pooled sandbox that a
// create had taken outliving the server: the create, still waiting for
// admission when the server shut down, gave it back after Drain had
// returned, and that discard's stop ran while the server closed its
// store and driver (or never, the process gone: pooled sandboxes have no
// record and are never adopted). Drain must stop the taken sandboxes no
// create has made live, and the late give-back must stop nothing more;
// a released (live) one is the create's and Drain leaves it.
func TestDrainStopsTakenSandboxes(t *testing.T) {
	var pressure atomic.Bool
	ps, f, _ := newTestPools(t, 10, &pressure)
	if _, err := ps.Set(context.Background(), Config{Template: "base", Min: 3, Max: 3}); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, ps, 3)
	live, given := ps.Take("", "base", "base:v1"), ps.Take("", "base", "base:v1")
	if live == nil || given == nil {
		t.Fatal("takes of a full pool missed")
	}
	ps.Release(live.ID)
	ps.Drain()
	if f.Alive(given.ID) || ps.Owns(given.ID) {
		t.Errorf("after Drain the taken sandbox %s runs (%v) or is owned (%v), want it stopped", given.ID, f.Alive(given.ID), ps.Owns(given.ID))
	}
	if n := f.runningCount(); n != 1 || !f.Alive(live.ID) {
		t.Errorf("after Drain %d sandboxes run, want only the released one %s", n, live.ID)
	}
	stops := f.stopCount()
	ps.DiscardLater(given) // the create gives it back once drained
	if pd := ps.Take("", "base", "base:v1"); pd != nil {
		t.Errorf("a take after Drain handed out %s", pd.ID)
	}
	ps.MakeRoom()
	if n := f.stopCount(); n != stops {
		t.Errorf("%d stops after Drain had returned, want none", n-stops)
	}
}

// TestDrainWaitsForStopsInFlight defends against a pooled sandbox's stop
// outliving the server: a sandbox taken out of the pools and being
// stopped (evicted to make room for a user's create, dropped by a
// smaller pool size, given back by a create) when the server shut down
// was no longer idle, so Drain neither stopped it nor waited for its
// stop, and the server closed its driver while that stop ran (a leaked
// overlay mount and runc container). Drain must return only once that
// stop has finished.
func TestDrainWaitsForStopsInFlight(t *testing.T) {
	for _, tc := range []struct {
		name string
		// stop takes the pool's one idle sandbox out and stops it (in a
		// goroutine of the test's: it uses t.Error only).
		stop func(t *testing.T, ps *Pools, f *fakeStarter)
	}{
		{"eviction", func(t *testing.T, ps *Pools, f *fakeStarter) {
			f.mu.Lock()
			f.room = 1 // the idle sandbox fills the global limit
			f.mu.Unlock()
			ps.MakeRoom()
		}},
		{"smaller pool", func(t *testing.T, ps *Pools, f *fakeStarter) {
			if _, err := ps.Set(context.Background(), Config{Template: "base"}); err != nil {
				t.Error(err)
			}
		}},
		{"given back", func(t *testing.T, ps *Pools, f *fakeStarter) { ps.DiscardLater(ps.Take("", "base", "base:v1")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pressure atomic.Bool
			ps, f, _ := newTestPools(t, 10, &pressure)
			if _, err := ps.Set(context.Background(), Config{Template: "base", Min: 1, Max: 1}); err != nil {
				t.Fatal(err)
			}
			waitIdle(t, ps, 1)
			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			f.mu.Lock()
			f.onStop = func(string) {
				once.Do(func() { close(entered) })
				<-release
			}
			f.mu.Unlock()
			go tc.stop(t, ps, f)
			<-entered
			// Drain gets up to 2 s to reach its wait (without one it
			// returns at once) before the stop is let through.
			var released atomic.Bool
			var early bool
			drained := make(chan struct{})
			go func() {
				ps.Drain()
				early = !released.Load()
				close(drained)
			}()
			select {
			case <-drained:
			case <-time.After(2 * time.Second):
			}
			released.Store(true)
			close(release)
			<-drained
			if early {
				t.Error("Drain returned while a pooled sandbox's stop was in flight")
			}
			if n := f.runningCount(); n != 0 {
				t.Errorf("%d pooled sandboxes run after Drain", n)
			}
		})
	}
}
