package usage

import (
	"context"
	"math"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/watchdog"
)

// t0 is a whole minute, so the tests know which bucket a reading is in.
var t0 = time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// TestAmounts checks the meter's arithmetic on one reading after another:
// CPU is the cumulative counter's increase (in full for a first reading
// and after the counter went backwards, a new cgroup), memory is the
// trapezoid over the interval, and gaps longer than MaxSampleGap or
// intervals that do not move forward add no memory. It defends against
// the two ways a meter overcharges: counting a counter's whole value
// again, and integrating memory over time nobody sampled.
func TestAmounts(t *testing.T) {
	const mib = 1 << 20
	prev := reading{cpu: 10, mem: 512 * mib, at: t0}
	cases := []struct {
		name    string
		ok      bool
		s       watchdog.Sample
		cpu     float64
		memGiBs float64
	}{
		{"first reading counts the counter in full", false, watchdog.Sample{Time: t0, CPUSeconds: 2.5, MemoryBytes: gib}, 2.5, 0},
		{"increase over one second", true, watchdog.Sample{Time: t0.Add(time.Second), CPUSeconds: 10.75, MemoryBytes: 512 * mib}, 0.75, 0.5},
		{"trapezoid of a rising reading", true, watchdog.Sample{Time: t0.Add(2 * time.Second), CPUSeconds: 11, MemoryBytes: 1536 * mib}, 1, 2},
		{"gap at the bound still counts", true, watchdog.Sample{Time: t0.Add(MaxSampleGap), CPUSeconds: 12, MemoryBytes: 512 * mib}, 2, 0.5 * MaxSampleGap.Seconds()},
		{"gap past the bound: CPU only", true, watchdog.Sample{Time: t0.Add(MaxSampleGap + time.Millisecond), CPUSeconds: 12, MemoryBytes: 512 * mib}, 2, 0},
		{"counter went backwards: a new cgroup", true, watchdog.Sample{Time: t0.Add(time.Second), CPUSeconds: 0.25, MemoryBytes: 512 * mib}, 0.25, 0},
		{"same time: no interval", true, watchdog.Sample{Time: t0, CPUSeconds: 10, MemoryBytes: 512 * mib}, 0, 0},
		{"clock went back: no interval", true, watchdog.Sample{Time: t0.Add(-time.Second), CPUSeconds: 10.5, MemoryBytes: 512 * mib}, 0.5, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := amounts(prev, tc.ok, tc.s)
			if !near(a.CPUSeconds, tc.cpu) || !near(a.MemoryGiBSeconds, tc.memGiBs) {
				t.Fatalf("cpu %v memory %v GiB·s, want %v and %v", a.CPUSeconds, a.MemoryGiBSeconds, tc.cpu, tc.memGiBs)
			}
			if a.Commands != 0 || a.EgressBytesUp != 0 || a.EgressBytesDown != 0 {
				t.Fatalf("a reading metered %+v", a)
			}
		})
	}
}

// fixture is a real store with sandboxes of two teams and a meter on a
// settable clock.
type fixture struct {
	t    *testing.T
	path string
	st   *store.Store
	m    *Meter
	mu   sync.Mutex
	now  time.Time
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{t: t, path: filepath.Join(t.TempDir(), "corral.db"), now: t0}
	var err error
	if f.st, err = store.Open(f.path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.st.Close() })
	ctx := context.Background()
	for _, tk := range []*store.Task{{ID: "ta", Agent: "alice", Team: "red"}, {ID: "tb", Agent: "bob", Team: "red"}, {ID: "tc", Agent: "carol", Team: "blue"}} {
		tk.State, tk.CreatedAt = store.TaskOpen, t0
		if err := f.st.InsertTask(ctx, tk); err != nil {
			t.Fatal(err)
		}
	}
	for _, sb := range []*store.Sandbox{
		{ID: "sa1", Team: "red", TaskID: "ta"}, {ID: "sa2", Team: "red", TaskID: "ta"},
		{ID: "sb1", Team: "red", TaskID: "tb"}, {ID: "sc1", Team: "blue", TaskID: "tc"},
	} {
		sb.Template, sb.Runtime, sb.Tier, sb.Network, sb.State = "base", "runc", "light", "none", store.StateRunning
		sb.CreatedAt, sb.ExpiresAt = t0, t0.Add(time.Hour)
		if err := f.st.InsertSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	f.open()
	return f
}

// open (re)starts the meter over the store, as a server start does.
func (f *fixture) open() {
	f.t.Helper()
	var err error
	f.m, err = New(context.Background(), f.st, Config{Now: f.clock})
	if err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) clock() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fixture) set(at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = at
}

func (f *fixture) report(q Query) *Report {
	f.t.Helper()
	rep, err := f.m.Report(context.Background(), q)
	if err != nil {
		f.t.Fatal(err)
	}
	return rep
}

func rowOf(t *testing.T, rep *Report, match func(*store.UsageRow) bool) *store.UsageRow {
	t.Helper()
	for _, r := range rep.Rows {
		if match(r) {
			return r
		}
	}
	t.Fatalf("no matching row in %+v", rep.Rows)
	return nil
}

// sample feeds a reading of a sandbox at t0+sec.
func (f *fixture) sample(id string, sec, cpu float64, mem int64) {
	f.m.Sample(id, watchdog.Sample{Time: t0.Add(time.Duration(sec * float64(time.Second))), CPUSeconds: cpu, MemoryBytes: mem})
}

// TestMeterReport feeds known readings, egress events and commands to
// sandboxes of two teams and checks that the report's amounts are the
// arithmetic's (CPU = last cumulative reading, memory = the trapezoid,
// egress = the events' bytes, commands = the calls), for every grouping,
// for the team filter and for a minute window.
func TestMeterReport(t *testing.T) {
	f := newFixture(t)
	// sa1: 0..3 s at 1 GiB, CPU 0.5 → 2.0 (first reading counts in full).
	f.sample("sa1", 0, 0.5, gib)
	f.sample("sa1", 1, 1.0, gib)
	f.sample("sa1", 2, 1.5, gib)
	f.sample("sa1", 3, 2.0, gib)
	// sb1: two readings in the next minute, 2 GiB for 1 s.
	f.sample("sb1", 61, 4, 2*gib)
	f.sample("sb1", 62, 4.25, 2*gib)
	// sc1 (team blue): one reading.
	f.sample("sc1", 5, 7, gib)
	f.set(t0.Add(10 * time.Second))
	f.m.Egress("sa2", 100, 1000)
	f.m.Egress("sa2", 1, 0)
	f.m.Egress("", 5, 5) // no sandbox: not metered
	for range 3 {
		f.m.Command("sa1")
	}
	f.m.Command("sc1")
	f.set(t0.Add(2 * time.Minute))

	rep := f.report(Query{Team: "red", By: store.UsageBySandbox})
	if len(rep.Rows) != 3 {
		t.Fatalf("red rows %+v, want sa1, sa2, sb1", rep.Rows)
	}
	sa1 := rowOf(t, rep, func(r *store.UsageRow) bool { return r.Sandbox == "sa1" })
	if !near(sa1.CPUSeconds, 2.0) || !near(sa1.MemoryGiBSeconds, 3.0) || sa1.Commands != 3 || sa1.Task != "ta" || sa1.Agent != "alice" {
		t.Errorf("sa1 %+v: want cpu 2, memory 3 GiB·s, 3 commands, task ta, agent alice", sa1)
	}
	sa2 := rowOf(t, rep, func(r *store.UsageRow) bool { return r.Sandbox == "sa2" })
	if sa2.EgressBytesUp != 101 || sa2.EgressBytesDown != 1000 || sa2.CPUSeconds != 0 {
		t.Errorf("sa2 %+v: want 101 bytes up, 1000 down", sa2)
	}
	if !near(sa1.SandboxSeconds, 120) || sa1.Sandboxes != 1 {
		t.Errorf("sa1 sandbox seconds %v (%d sandboxes), want 120 (alive for the 2 minutes to now)", sa1.SandboxSeconds, sa1.Sandboxes)
	}
	if !near(rep.Totals.CPUSeconds, 2+4.25) || !near(rep.Totals.MemoryGiBSeconds, 3+2) || rep.Totals.Commands != 3 ||
		rep.Totals.EgressBytesUp != 101 || rep.Totals.Sandboxes != 3 || !near(rep.Totals.SandboxSeconds, 360) {
		t.Errorf("red totals %+v", rep.Totals)
	}

	byTask := f.report(Query{Team: "red", By: store.UsageByTask})
	ta := rowOf(t, byTask, func(r *store.UsageRow) bool { return r.Task == "ta" })
	if !near(ta.CPUSeconds, 2) || ta.EgressBytesDown != 1000 || ta.Commands != 3 || ta.Sandboxes != 2 || ta.Sandbox != "" {
		t.Errorf("task ta %+v", ta)
	}
	byAgent := f.report(Query{By: store.UsageByAgent})
	if len(byAgent.Rows) != 3 {
		t.Fatalf("rows by agent over every team: %+v", byAgent.Rows)
	}
	carol := rowOf(t, byAgent, func(r *store.UsageRow) bool { return r.Agent == "carol" })
	if carol.Team != "blue" || !near(carol.CPUSeconds, 7) || carol.Commands != 1 {
		t.Errorf("agent carol %+v", carol)
	}
	blue := f.report(Query{Team: "blue"})
	if len(blue.Rows) != 0 || !near(blue.Totals.CPUSeconds, 7) || blue.Totals.Commands != 1 || blue.Totals.EgressBytesUp != 0 {
		t.Errorf("blue totals %+v rows %d: want only sc1's usage", blue.Totals, len(blue.Rows))
	}

	// The second minute only: sb1's readings; since/until are rounded out.
	win := f.report(Query{Team: "red", Since: t0.Add(70 * time.Second), Until: t0.Add(100 * time.Second), By: store.UsageBySandbox})
	if !win.Since.Equal(t0.Add(time.Minute)) || !win.Until.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("window %v..%v, want the second minute", win.Since, win.Until)
	}
	if !near(win.Totals.CPUSeconds, 4.25) || win.Totals.Commands != 0 || win.Totals.EgressBytesUp != 0 || !near(win.Totals.SandboxSeconds, 180) {
		t.Errorf("second-minute totals %+v: want sb1's 4.25 CPU s and 3 sandboxes × 60 s", win.Totals)
	}
}

// TestMeterRestartCountsOnlyNewCPU restarts the meter over the same store
// between two readings of a sandbox whose cgroup kept running (a server
// restart that adopted it). It defends against double billing: without
// the stored baseline, the first reading after the restart would count
// the sandbox's whole cumulative CPU again.
func TestMeterRestartCountsOnlyNewCPU(t *testing.T) {
	f := newFixture(t)
	f.sample("sa1", 0, 5, gib)
	f.sample("sa1", 1, 6, gib)
	if err := f.m.Close(); err != nil {
		t.Fatal(err)
	}
	f.open() // the server restarted
	f.sample("sa1", 3, 6.5, gib)
	f.set(t0.Add(time.Minute))
	rep := f.report(Query{Team: "red"})
	if !near(rep.Totals.CPUSeconds, 6.5) {
		t.Fatalf("CPU after a restart %v, want 6.5 (the last cumulative reading), not 12.5", rep.Totals.CPUSeconds)
	}
	// 1 GiB for 1 s before the restart and 2 s across it (within MaxSampleGap).
	if !near(rep.Totals.MemoryGiBSeconds, 3) {
		t.Fatalf("memory %v GiB·s, want 3", rep.Totals.MemoryGiBSeconds)
	}
}

// TestMeterCrashLosesAtMostTheUnflushed shows what a crash costs: amounts
// not yet flushed are gone, flushed ones stay, and CPU is recovered by
// the baseline at the next reading.
func TestMeterCrashLosesAtMostTheUnflushed(t *testing.T) {
	f := newFixture(t)
	f.sample("sa1", 0, 1, gib)
	f.m.Command("sa1")
	if err := f.m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.sample("sa1", 1, 2, gib)
	f.m.Command("sa1") // never flushed: the "crash" below drops the meter
	f.open()
	f.sample("sa1", 2, 3, gib)
	rep := f.report(Query{Team: "red"})
	if rep.Totals.Commands != 1 {
		t.Errorf("commands %d, want the flushed 1", rep.Totals.Commands)
	}
	if !near(rep.Totals.CPUSeconds, 3) {
		t.Errorf("CPU %v, want 3: the reading after the crash is counted from the flushed baseline", rep.Totals.CPUSeconds)
	}
}

// TestMeterTeamTotals checks the Prometheus counters' source: per team,
// what the store holds plus what was just metered, sandbox-seconds from
// the records (ended ones settled past the watermark included), kept
// across a restart and never decreasing.
func TestMeterTeamTotals(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.sample("sa1", 0, 2, gib)
	f.m.Egress("sc1", 10, 20)
	f.m.Command("sc1")
	f.set(t0.Add(30 * time.Second))
	got, err := f.m.TeamTotals(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !near(got["red"].CPUSeconds, 2) || got["blue"].EgressBytesUp+got["blue"].EgressBytesDown != 30 || got["blue"].Commands != 1 {
		t.Fatalf("totals %+v", got)
	}
	if !near(got["red"].SandboxSeconds, 3*30) || !near(got["blue"].SandboxSeconds, 30) {
		t.Fatalf("sandbox seconds red %v blue %v, want 90 and 30", got["red"].SandboxSeconds, got["blue"].SandboxSeconds)
	}
	// sc1 ends at t0+40 s; an hour later its life is settled.
	if err := f.st.EndSandbox(ctx, "sc1", "killed", "", t0.Add(40*time.Second)); err != nil {
		t.Fatal(err)
	}
	f.set(t0.Add(time.Hour))
	if got, err = f.m.TeamTotals(ctx); err != nil {
		t.Fatal(err)
	}
	if !near(got["blue"].SandboxSeconds, 40) {
		t.Fatalf("blue sandbox seconds %v, want 40 (sc1 lived 40 s)", got["blue"].SandboxSeconds)
	}
	f.set(t0.Add(2 * time.Hour))
	if got, err = f.m.TeamTotals(ctx); err != nil || !near(got["blue"].SandboxSeconds, 40) || !near(got["red"].SandboxSeconds, 3*7200) {
		t.Fatalf("after the watermark moved: %+v, %v", got, err)
	}
	if err := f.m.Close(); err != nil {
		t.Fatal(err)
	}
	f.open()
	if got, err = f.m.TeamTotals(ctx); err != nil || !near(got["red"].CPUSeconds, 2) || got["blue"].Commands != 1 || !near(got["blue"].SandboxSeconds, 40) {
		t.Fatalf("after a restart: %+v, %v", got, err)
	}
}

// TestMeterDropsEndedBaselines checks that the baseline of an ended
// sandbox is dropped once its last reading is older than forgetAfter, so
// the table and the meter's memory hold live sandboxes only, and that a
// sandbox that still runs keeps its baseline however long it was not
// sampled (a paused one).
func TestMeterDropsEndedBaselines(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.sample("sa1", 0, 1, gib)
	f.sample("sa2", 0, 1, gib)
	if err := f.st.EndSandbox(ctx, "sa1", "killed", "", t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	f.set(t0.Add(forgetAfter + 2*time.Second))
	if err := f.m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	bases, err := f.st.UsageBaselines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := bases["sa1"]; ok {
		t.Errorf("the ended sandbox's baseline is still stored")
	}
	if _, ok := bases["sa2"]; !ok {
		t.Errorf("the running sandbox's baseline was dropped")
	}
	f.m.mu.Lock()
	_, kept := f.m.last["sa1"]
	f.m.mu.Unlock()
	if kept {
		t.Errorf("the meter still tracks the ended sandbox")
	}
}

// TestMeterFlushRetriesAfterFailure checks that amounts survive a failed
// write (the store is closed) and reach the store at the next flush that
// works, so a transient error loses nothing.
func TestMeterFlushRetriesAfterFailure(t *testing.T) {
	f := newFixture(t)
	f.m.Command("sa1")
	f.sample("sa1", 0, 1, gib)
	f.st.Close()
	if err := f.m.Flush(context.Background()); err == nil {
		t.Fatal("flush to a closed store succeeded")
	}
	var err error
	if f.st, err = store.Open(f.path); err != nil {
		t.Fatal(err)
	}
	f.m.st = f.st
	rep := f.report(Query{Team: "red"})
	if rep.Totals.Commands != 1 || !near(rep.Totals.CPUSeconds, 1) {
		t.Fatalf("after a failed flush and a good one: %+v", rep.Totals)
	}
}

// TestMeterIgnoresStaleReading feeds a reading older than the newest one
// (a round that read the counters before the final reading at the
// sandbox's end, recorded after the watchdog forgot the sandbox). It
// defends against billing the sandbox's whole CPU counter a second time
// as if the counter had been reset.
func TestMeterIgnoresStaleReading(t *testing.T) {
	f := newFixture(t)
	f.sample("sa1", 0, 1, gib)
	f.sample("sa1", 2, 5, gib)
	f.sample("sa1", 1, 4, gib) // read before the one above
	rep := f.report(Query{Team: "red"})
	if !near(rep.Totals.CPUSeconds, 5) || !near(rep.Totals.MemoryGiBSeconds, 2) {
		t.Fatalf("CPU %v memory %v, want 5 and 2 (the stale reading ignored)", rep.Totals.CPUSeconds, rep.Totals.MemoryGiBSeconds)
	}
}
