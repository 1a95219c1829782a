package watchdog

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/runtime"
)

// clock is a settable clock safe for concurrent use.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// fakeSource is a Source with settable targets, stats and errors per id.
type fakeSource struct {
	mu      sync.Mutex
	targets []Target
	stats   map[string]runtime.Stats
	errs    map[string]error
	block   map[string]chan struct{} // Stats(id) waits for the channel to close
	calls   map[string]int

	active, maxActive int
}

func newSource(targets ...Target) *fakeSource {
	return &fakeSource{
		targets: targets,
		stats:   map[string]runtime.Stats{},
		errs:    map[string]error{},
		block:   map[string]chan struct{}{},
		calls:   map[string]int{},
	}
}

func (f *fakeSource) Targets() []Target {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.targets)
}

func (f *fakeSource) Stats(id string) (runtime.Stats, error) {
	f.mu.Lock()
	f.calls[id]++
	f.active++
	f.maxActive = max(f.maxActive, f.active)
	block := f.block[id]
	f.mu.Unlock()
	if block != nil {
		<-block
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.active--
	if err := f.errs[id]; err != nil {
		return runtime.Stats{}, err
	}
	return f.stats[id], nil
}

func (f *fakeSource) set(id string, fn func(*runtime.Stats)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.stats[id]
	fn(&s)
	f.stats[id] = s
}

func (f *fakeSource) setTargets(targets ...Target) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.targets = targets
}

// harness wires a watchdog to a fake source and clock and records what it
// reports.
type harness struct {
	clock    *clock
	src      *fakeSource
	w        *Watchdog
	events   []Event
	runaways []string
}

func newHarness(cfg Config, targets ...Target) *harness {
	h := &harness{clock: newClock(), src: newSource(targets...)}
	cfg.Now = h.clock.Now
	h.w = New(cfg, h.src,
		func(e Event) { h.events = append(h.events, e) },
		func(id string) { h.runaways = append(h.runaways, id) })
	return h
}

// tick advances the clock by one second and runs a round.
func (h *harness) tick() {
	h.clock.Advance(time.Second)
	h.w.Tick()
}

// kinds returns the kinds of the events recorded since from.
func (h *harness) kinds(from int) []string {
	var out []string
	for _, e := range h.events[from:] {
		out = append(out, e.Kind)
	}
	return out
}

func TestDefaults(t *testing.T) {
	w := New(Config{}, newSource(), nil, nil)
	c := w.cfg
	if c.Interval != time.Second || c.History != 300 || c.WarnFraction != 0.8 ||
		math.Abs(c.WarnClearFraction-0.7) > 1e-9 || c.CPURunawayFraction != 0.9 ||
		c.CPURunawayFor != 30*time.Second || c.Parallel != 8 || c.StatsTimeout != time.Second || c.Now == nil {
		t.Errorf("defaults = %+v", c)
	}
	// Nil callbacks are allowed.
	src := newSource(Target{ID: "a", MemoryBytes: 10})
	src.stats["a"] = runtime.Stats{MemoryBytes: 10, OOMKills: 1}
	New(Config{}, src, nil, nil).Tick()
}

func TestCPUPercent(t *testing.T) {
	type step struct {
		advance time.Duration
		cpu     float64 // cumulative CPU seconds
		want    float64 // CPUPercent
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"first sample has no baseline", []step{{time.Second, 5, 0}}},
		{"half a core", []step{{time.Second, 0, 0}, {time.Second, 0.5, 50}, {time.Second, 1, 50}}},
		{"two cores over two seconds", []step{{time.Second, 10, 0}, {2 * time.Second, 14, 200}}},
		{"idle", []step{{time.Second, 3, 0}, {time.Second, 3, 0}}},
		{"counter went backwards", []step{{time.Second, 10, 0}, {time.Second, 2, 0}, {time.Second, 3, 100}}},
		{"clock did not move keeps the previous value", []step{{time.Second, 0, 0}, {time.Second, 0.25, 25}, {0, 0.5, 25}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(Config{}, Target{ID: "a"})
			for i, st := range tt.steps {
				h.src.set("a", func(s *runtime.Stats) { s.CPUSeconds = st.cpu })
				h.clock.Advance(st.advance)
				h.w.Tick()
				got, ok := h.w.Latest("a")
				if !ok {
					t.Fatalf("step %d: no sample", i)
				}
				if math.Abs(got.CPUPercent-st.want) > 1e-9 {
					t.Errorf("step %d: CPUPercent = %v, want %v", i, got.CPUPercent, st.want)
				}
				if got.CPUSeconds != st.cpu || !got.Time.Equal(h.clock.Now()) {
					t.Errorf("step %d: sample = %+v", i, got)
				}
			}
		})
	}
}

func TestWarnings(t *testing.T) {
	// Limit 1000 everywhere; warn at 800, re-arm below 700.
	values := []int64{500, 800, 900, 750, 800, 699, 850, 1000}
	wantFire := []bool{false, true, false, false, false, false, true, false}
	tests := []struct {
		name   string
		kind   string
		target Target
		set    func(*runtime.Stats, int64)
		fires  bool
	}{
		{"memory", KindMemoryHigh, Target{ID: "a", MemoryBytes: 1000},
			func(s *runtime.Stats, v int64) { s.MemoryBytes = v }, true},
		{"disk", KindDiskHigh, Target{ID: "a", DiskBytes: 1000},
			func(s *runtime.Stats, v int64) { s.DiskBytes = v }, true},
		{"pids", KindPidsHigh, Target{ID: "a", Pids: 1000},
			func(s *runtime.Stats, v int64) { s.Pids = v }, true},
		{"no limit no warning", KindMemoryHigh, Target{ID: "a"},
			func(s *runtime.Stats, v int64) { s.MemoryBytes = v }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(Config{}, tt.target)
			for i, v := range values {
				h.src.set("a", func(s *runtime.Stats) { tt.set(s, v) })
				n := len(h.events)
				h.tick()
				got := h.kinds(n)
				var want []string
				if tt.fires && wantFire[i] {
					want = []string{tt.kind}
				}
				if !slices.Equal(got, want) {
					t.Fatalf("value %d (step %d): events %v, want %v", v, i, got, want)
				}
				if len(want) == 1 {
					e := h.events[n]
					if e.Sandbox != "a" || e.Value != float64(v) || e.Limit != 1000 || e.Message == "" {
						t.Errorf("event = %+v", e)
					}
				}
			}
		})
	}
}

func TestWarnClearFraction(t *testing.T) {
	h := newHarness(Config{WarnFraction: 0.5, WarnClearFraction: 0.2}, Target{ID: "a", Pids: 100})
	for _, v := range []int64{50, 30, 60, 19, 50} {
		h.src.set("a", func(s *runtime.Stats) { s.Pids = v })
		h.tick()
	}
	if got := h.kinds(0); !slices.Equal(got, []string{KindPidsHigh, KindPidsHigh}) {
		t.Errorf("events = %v", got)
	}
}

func TestCPURunaway(t *testing.T) {
	// repeat returns n copies of p.
	repeat := func(p float64, n int) []float64 {
		out := make([]float64, n)
		for i := range out {
			out[i] = p
		}
		return out
	}
	tests := []struct {
		name     string
		cfg      Config
		target   Target
		percents []float64 // CPU percent of each tick after the baseline tick
		want     []int     // 1-based ticks (after the baseline) at which the rule fires
	}{
		{"default fires after exactly 30 s", Config{}, Target{ID: "a", CPULimit: 1},
			repeat(95, 40), []int{30}},
		{"29 s is not enough", Config{}, Target{ID: "a", CPULimit: 1},
			repeat(95, 29), nil},
		{"exactly at the threshold counts", Config{}, Target{ID: "a", CPULimit: 1},
			repeat(90, 30), []int{30}},
		{"below the threshold never fires", Config{}, Target{ID: "a", CPULimit: 1},
			repeat(89, 60), nil},
		{"quota in cores", Config{}, Target{ID: "a", CPULimit: 2},
			append(repeat(175, 40), repeat(185, 30)...), []int{70}},
		{"unlimited CPU never fires", Config{}, Target{ID: "a"},
			repeat(400, 60), nil},
		{"configured duration", Config{CPURunawayFor: 5 * time.Second}, Target{ID: "a", CPULimit: 1},
			repeat(100, 10), []int{5}},
		{"tier override wins", Config{CPURunawayFor: 20 * time.Second,
			CPURunawayForTier: map[string]time.Duration{"small": 10 * time.Second}},
			Target{ID: "a", CPULimit: 1, Tier: "small"}, repeat(100, 25), []int{10}},
		{"other tier uses the default", Config{CPURunawayFor: 20 * time.Second,
			CPURunawayForTier: map[string]time.Duration{"small": 10 * time.Second}},
			Target{ID: "a", CPULimit: 1, Tier: "large"}, repeat(100, 25), []int{20}},
		{"negative tier entry disables", Config{
			CPURunawayForTier: map[string]time.Duration{"batch": -1}},
			Target{ID: "a", CPULimit: 1, Tier: "batch"}, repeat(100, 60), nil},
		{"negative duration disables", Config{CPURunawayFor: -1}, Target{ID: "a", CPULimit: 1},
			repeat(100, 60), nil},
		{"a dip resets the span", Config{CPURunawayFor: 10 * time.Second}, Target{ID: "a", CPULimit: 1},
			slices.Concat(repeat(100, 9), []float64{50}, repeat(100, 10)), []int{20}},
		{"fires once per span and re-arms after a dip", Config{CPURunawayFor: 5 * time.Second},
			Target{ID: "a", CPULimit: 1},
			slices.Concat(repeat(100, 12), []float64{10}, repeat(100, 5)), []int{5, 18}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(tt.cfg, tt.target)
			cpu := 0.0
			h.tick() // baseline
			var fired []int
			for i, p := range tt.percents {
				cpu += p / 100 // one second per tick
				h.src.set("a", func(s *runtime.Stats) { s.CPUSeconds = cpu })
				n, r := len(h.events), len(h.runaways)
				h.tick()
				got := h.kinds(n)
				switch {
				case len(got) == 0 && len(h.runaways) == r:
				case slices.Equal(got, []string{KindCPURunaway}) && slices.Equal(h.runaways[r:], []string{"a"}):
					fired = append(fired, i+1)
					e := h.events[n]
					if e.Sandbox != "a" || math.Abs(e.Value-p) > 1e-6 || e.Limit != tt.target.CPULimit*100 {
						t.Errorf("event = %+v", e)
					}
				default:
					t.Fatalf("tick %d: events %v, runaways %v", i+1, got, h.runaways[r:])
				}
			}
			if !slices.Equal(fired, tt.want) {
				t.Errorf("fired at ticks %v, want %v", fired, tt.want)
			}
		})
	}
}

func TestOOM(t *testing.T) {
	tests := []struct {
		name  string
		kills []uint64
		want  []float64 // event Value per tick, 0 for none
	}{
		{"increases are reported with the count", []uint64{0, 0, 1, 1, 3}, []float64{0, 0, 1, 0, 2}},
		{"kills before the first sample are reported", []uint64{2, 2}, []float64{2, 0}},
		{"counter reset reports the new count", []uint64{3, 1}, []float64{3, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(Config{}, Target{ID: "a", MemoryBytes: 1 << 20})
			for i, k := range tt.kills {
				h.src.set("a", func(s *runtime.Stats) { s.OOMKills = k })
				n := len(h.events)
				h.tick()
				var got float64
				switch evs := h.events[n:]; len(evs) {
				case 0:
				case 1:
					if evs[0].Kind != KindOOM || evs[0].Sandbox != "a" || evs[0].Limit != 1<<20 {
						t.Fatalf("tick %d: event %+v", i, evs[0])
					}
					got = evs[0].Value
				default:
					t.Fatalf("tick %d: events %+v", i, evs)
				}
				if got != tt.want[i] {
					t.Errorf("tick %d: oom count %v, want %v", i, got, tt.want[i])
				}
			}
			if h.runaways != nil {
				t.Errorf("runaways = %v", h.runaways)
			}
		})
	}
}

func TestHistory(t *testing.T) {
	h := newHarness(Config{History: 5}, Target{ID: "a"})
	start := h.clock.Now()
	for i := range 8 {
		h.src.set("a", func(s *runtime.Stats) { s.Pids = int64(i + 1) })
		h.tick()
	}
	at := func(sec int) time.Time { return start.Add(time.Duration(sec) * time.Second) }
	tests := []struct {
		name  string
		since time.Time
		want  []int64 // Pids of the samples returned
	}{
		{"zero since returns the whole ring", time.Time{}, []int64{4, 5, 6, 7, 8}},
		{"since is inclusive", at(6), []int64{6, 7, 8}},
		{"between samples", at(6).Add(time.Millisecond), []int64{7, 8}},
		{"future", at(9), []int64{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := h.w.Series("a", tt.since)
			pids := []int64{}
			for i, s := range got {
				pids = append(pids, s.Pids)
				if i > 0 && !s.Time.After(got[i-1].Time) {
					t.Errorf("series not oldest first: %v", got)
				}
			}
			if !slices.Equal(pids, tt.want) {
				t.Errorf("Series pids = %v, want %v", pids, tt.want)
			}
		})
	}
	if l, ok := h.w.Latest("a"); !ok || l.Pids != 8 || !l.Time.Equal(at(8)) {
		t.Errorf("Latest = %+v, %v", l, ok)
	}
	if _, ok := h.w.Latest("nope"); ok {
		t.Error("Latest of an unknown sandbox is ok")
	}
	if s := h.w.Series("nope", time.Time{}); s != nil {
		t.Errorf("Series of an unknown sandbox = %v", s)
	}
	// The ring never grows past History.
	if n := len(h.w.state["a"].ring); n != 5 {
		t.Errorf("ring size %d", n)
	}
}

func TestForget(t *testing.T) {
	tests := []struct {
		name   string
		forget func(h *harness)
	}{
		{"target disappears", func(h *harness) { h.src.setTargets(Target{ID: "b"}) }},
		{"explicit Forget", func(h *harness) { h.w.Forget("a") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(Config{}, Target{ID: "a", CPULimit: 1}, Target{ID: "b"})
			h.tick()
			h.src.set("a", func(s *runtime.Stats) { s.CPUSeconds = 1 })
			h.tick()
			if l, _ := h.w.Latest("a"); l.CPUPercent != 100 {
				t.Fatalf("CPUPercent = %v", l.CPUPercent)
			}
			tt.forget(h)
			h.tick()
			if _, ok := h.w.Latest("b"); !ok {
				t.Error("b was forgotten")
			}
			if tt.name == "target disappears" {
				if _, ok := h.w.Latest("a"); ok {
					t.Fatal("a is still known")
				}
				h.src.setTargets(Target{ID: "a", CPULimit: 1}, Target{ID: "b"})
				h.tick()
			}
			// Back (or never gone from Targets): history starts afresh.
			if s := h.w.Series("a", time.Time{}); len(s) != 1 || s[0].CPUPercent != 0 {
				t.Errorf("series after forgetting = %+v", s)
			}
		})
	}
}

func TestStatsError(t *testing.T) {
	h := newHarness(Config{}, Target{ID: "a"}, Target{ID: "b"})
	h.src.set("a", func(s *runtime.Stats) { s.CPUSeconds = 0 })
	h.tick()
	h.src.errs["a"] = errors.New("cgroup gone")
	h.src.set("a", func(s *runtime.Stats) { s.CPUSeconds = 1 })
	h.tick()
	if n := len(h.w.Series("a", time.Time{})); n != 1 {
		t.Errorf("a has %d samples after an error, want 1", n)
	}
	if n := len(h.w.Series("b", time.Time{})); n != 2 {
		t.Errorf("b has %d samples, want 2", n)
	}
	delete(h.src.errs, "a")
	h.tick()
	// The next sample's CPU percent spans the skipped round.
	if l, _ := h.w.Latest("a"); l.CPUPercent != 50 {
		t.Errorf("CPUPercent after a skipped round = %v, want 50", l.CPUPercent)
	}
	// An error on the very first read leaves no state.
	h2 := newHarness(Config{}, Target{ID: "c"})
	h2.src.errs["c"] = runtime.ErrNotFound
	h2.tick()
	if _, ok := h2.w.Latest("c"); ok {
		t.Error("sample recorded despite an error")
	}
}

func TestSlowStats(t *testing.T) {
	h := newHarness(Config{}, Target{ID: "slow"}, Target{ID: "fast"})
	release := make(chan struct{})
	h.src.block["slow"] = release
	// The deadline passes at once for the slow sandbox and never for others,
	// so the test does not depend on timing.
	expired := make(chan time.Time)
	close(expired)
	h.w.timeout = func(id string) (<-chan time.Time, func()) {
		if id == "slow" {
			return expired, func() {}
		}
		return nil, func() {}
	}
	h.tick()
	h.tick()
	if _, ok := h.w.Latest("slow"); ok {
		t.Error("slow sandbox sampled before its Stats returned")
	}
	if n := len(h.w.Series("fast", time.Time{})); n != 2 {
		t.Errorf("fast has %d samples, want 2", n)
	}
	h.src.mu.Lock()
	calls := h.src.calls["slow"]
	h.src.mu.Unlock()
	if calls != 1 {
		t.Errorf("Stats(slow) called %d times while in flight, want 1", calls)
	}
	close(release)
	h.w.pending.Wait()
	h.src.mu.Lock()
	delete(h.src.block, "slow")
	h.src.mu.Unlock()
	h.w.timeout = func(string) (<-chan time.Time, func()) { return nil, func() {} }
	h.tick()
	if _, ok := h.w.Latest("slow"); !ok {
		t.Error("slow sandbox not sampled once its call returned")
	}
}

func TestParallelBound(t *testing.T) {
	tests := []struct {
		parallel, targets int
	}{
		{1, 5}, {2, 7}, {8, 20}, {8, 3},
	}
	for _, tt := range tests {
		h := newHarness(Config{Parallel: tt.parallel})
		var targets []Target
		for i := range tt.targets {
			targets = append(targets, Target{ID: string(rune('a' + i))})
		}
		h.src.setTargets(targets...)
		h.tick()
		if h.src.maxActive > tt.parallel {
			t.Errorf("parallel %d: %d calls at once", tt.parallel, h.src.maxActive)
		}
		for _, tg := range targets {
			if _, ok := h.w.Latest(tg.ID); !ok {
				t.Errorf("parallel %d: %s not sampled", tt.parallel, tg.ID)
			}
		}
	}
}

func TestRun(t *testing.T) {
	h := newHarness(Config{}, Target{ID: "a"})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	h.w.Run(ctx) // one round, then returns because ctx is done
	if _, ok := h.w.Latest("a"); !ok {
		t.Error("Run did not sample")
	}
}

// TestCPUBound is the runaway rule's decision on one interval, in pure
// numbers (percent of one core; quota in cores; fraction 0.9 unless
// named). The starved cases defend against the busy-host runaway: more
// spinning sandboxes than cores, each getting less than its quota.
func TestCPUBound(t *testing.T) {
	tests := []struct {
		name        string
		cpu, demand float64
		quota, frac float64
		want        bool
	}{
		{"idle sandbox", 0, 0, 0.5, 0.9, false},
		{"agent threads waking on a busy host", 0, 11, 0.5, 0.9, false},
		{"mostly blocked on I/O (not runnable)", 5, 9, 0.5, 0.9, false},
		{"mostly blocked on I/O, many threads, busy host", 6, 48, 0.5, 0.9, false},
		{"spinning at its full half-core quota", 50, 100, 0.5, 0.9, true},
		{"full quota, wait unknown (CPU use alone, as before)", 50, 50, 0.5, 0.9, true},
		{"exactly at the CPU threshold", 45, 45, 0.5, 0.9, true},
		{"just below the CPU threshold", 44.9, 44.9, 0.5, 0.9, false},
		{"starved spinner: 2 cores, 17 spinners", 12, 100, 0.5, 0.9, true},
		{"starved spinner: 10 loops at 20%", 20, 101, 0.5, 0.9, true},
		{"starved, demand exactly at the threshold", 10, 90, 0.5, 0.9, true},
		{"starved, demand just below", 10, 89.9, 0.5, 0.9, false},
		{"bursty 50% duty, half core, idle host (throttled in bursts)", 25, 50, 0.5, 0.9, false},
		{"bursty 50% duty, half core, busy host", 13, 55, 0.5, 0.9, false},
		{"bursty 50% duty, half core, very busy host (slow wake-ups)", 8, 68, 0.5, 0.9, false},
		{"bursty 50% duty, one core", 50, 52, 1, 0.9, false},
		{"one spinner at one core", 100, 100, 1, 0.9, true},
		{"one spinner starved at one core", 30, 100, 1, 0.9, true},
		{"one spinner in a two-core sandbox, idle host", 100, 100, 2, 0.9, false},
		{"one spinner in a two-core sandbox, busy host", 40, 100, 2, 0.9, false},
		{"two spinners in a two-core sandbox, busy host", 60, 200, 2, 0.9, true},
		{"four spinners, four-core quota on a two-core host", 200, 400, 4, 0.9, true},
		{"1.75 of a 2-core quota", 175, 175, 2, 0.9, false},
		{"unlimited CPU never matches", 400, 400, 0, 0.9, false},
		{"configured fraction: CPU", 30, 30, 0.5, 0.5, true},
		{"configured fraction: demand", 10, 50, 0.5, 0.5, true},
		{"configured fraction: below both", 20, 45, 0.5, 0.5, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := cpuBound(tt.cpu, tt.demand, tt.quota, tt.frac); got != tt.want {
				t.Errorf("cpuBound(cpu %v, demand %v, quota %v, fraction %v) = %v, want %v",
					tt.cpu, tt.demand, tt.quota, tt.frac, got, tt.want)
			}
		})
	}
}

// TestCPURunawayStarved runs the rule through Tick on readings of CPU and
// wait counters: a sandbox spinning far below its quota (the busy-host
// runaway) fires after the period; bursty work and a wait counter that
// went backwards (a new cgroup, so no demand baseline) do not.
func TestCPURunawayStarved(t *testing.T) {
	type pct struct{ cpu, wait float64 } // percent of one core per tick
	repeat := func(p pct, n int) []pct {
		out := make([]pct, n)
		for i := range out {
			out[i] = p
		}
		return out
	}
	tests := []struct {
		name  string
		cfg   Config
		quota float64
		ticks []pct
		want  []int // 1-based ticks (after the baseline) at which the rule fires
	}{
		{"starved spinner fires after the default 30 s", Config{}, 0.5,
			repeat(pct{12, 88}, 40), []int{30}},
		{"starved spinner, configured 5 s", Config{CPURunawayFor: 5 * time.Second}, 0.5,
			repeat(pct{20, 80}, 8), []int{5}},
		{"a sleep resets the span", Config{CPURunawayFor: 5 * time.Second}, 0.5,
			slices.Concat(repeat(pct{20, 80}, 4), []pct{{10, 30}}, repeat(pct{20, 80}, 5)), []int{10}},
		{"bursty work never fires", Config{CPURunawayFor: 5 * time.Second}, 0.5,
			repeat(pct{13, 42}, 20), nil},
		{"full quota, no wait counter, fires as before", Config{CPURunawayFor: 5 * time.Second}, 0.5,
			repeat(pct{50, 0}, 6), []int{5}},
		{"wait counter backwards has no demand baseline", Config{CPURunawayFor: 3 * time.Second}, 0.5,
			slices.Concat(repeat(pct{20, 80}, 2), []pct{{20, -1000}}, repeat(pct{20, 80}, 4)), []int{6}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(tt.cfg, Target{ID: "a", CPULimit: tt.quota})
			h.src.set("a", func(s *runtime.Stats) { s.CPUSeconds, s.CPUWaitSeconds = 0, 1000 })
			h.tick() // baseline
			cpu, wait := 0.0, 1000.0
			var fired []int
			for i, p := range tt.ticks {
				cpu += p.cpu / 100
				wait += p.wait / 100
				h.src.set("a", func(s *runtime.Stats) { s.CPUSeconds, s.CPUWaitSeconds = cpu, wait })
				n := len(h.events)
				h.tick()
				if got := h.kinds(n); len(got) > 0 {
					e := h.events[n]
					if !slices.Equal(got, []string{KindCPURunaway}) || math.Abs(e.Value-p.cpu) > 1e-6 || e.Limit != tt.quota*100 {
						t.Fatalf("tick %d: events %+v", i+1, h.events[n:])
					}
					fired = append(fired, i+1)
				}
			}
			if !slices.Equal(fired, tt.want) {
				t.Errorf("fired at ticks %v, want %v", fired, tt.want)
			}
			if !slices.Equal(h.runaways, slices.Repeat([]string{"a"}, len(tt.want))) {
				t.Errorf("runaways = %v", h.runaways)
			}
		})
	}
}

// TestDemandPercent: demand is CPU plus wait per second; the sample time
// is the driver's read time when it gives one, so a Stats call delayed on
// a busy host does not skew the rates.
func TestDemandPercent(t *testing.T) {
	h := newHarness(Config{}, Target{ID: "a"})
	read := h.clock.Now().Add(-10 * time.Second)
	step := func(cpu, wait float64, at time.Time) Sample {
		h.src.set("a", func(s *runtime.Stats) { s.CPUSeconds, s.CPUWaitSeconds, s.Time = cpu, wait, at })
		h.tick()
		got, _ := h.w.Latest("a")
		return got
	}
	step(1, 2, read)
	got := step(1.5, 3, read.Add(2*time.Second)) // 0.5 s CPU + 1 s wait over 2 s
	if math.Abs(got.CPUPercent-25) > 1e-9 || math.Abs(got.DemandPercent-75) > 1e-9 || !got.Time.Equal(read.Add(2*time.Second)) {
		t.Errorf("sample = %+v; want CPU 25%%, demand 75%% at the read time", got)
	}
	got = step(2, 2.5, time.Time{}) // wait went backwards; no read time: the clock
	if got.DemandPercent != got.CPUPercent || !got.Time.Equal(h.clock.Now()) {
		t.Errorf("sample = %+v; want demand = CPU at the clock's time", got)
	}
}

// TestOnSampleSeesEverySample checks the usage meter's feed: OnSample
// receives every recorded sample, in order, with the values Series
// returns, and nothing for a sandbox whose Stats failed. A sample the
// meter missed would be CPU and memory nobody is billed for.
func TestOnSampleSeesEverySample(t *testing.T) {
	clk := newClock()
	src := newSource(Target{ID: "a"}, Target{ID: "b"})
	src.errs["b"] = errors.New("gone")
	var got []Sample
	w := New(Config{Now: clk.Now, OnSample: func(id string, s Sample) {
		if id != "a" {
			t.Errorf("OnSample for %s, whose Stats failed", id)
		}
		got = append(got, s)
	}}, src, nil, nil)
	for i := range 5 {
		src.mu.Lock()
		src.stats["a"] = runtime.Stats{CPUSeconds: float64(i) * 0.5, MemoryBytes: int64(i+1) << 20}
		src.mu.Unlock()
		w.Tick()
		clk.Advance(time.Second)
	}
	series := w.Series("a", time.Time{})
	if len(got) != 5 || !slices.Equal(got, series) {
		t.Fatalf("OnSample got %+v, Series %+v: want the same 5 samples", got, series)
	}
}

// TestFinalReadingAndStaleReadings checks the end-of-sandbox reading:
// Final records a sample (and hands it to OnSample) outside the rounds,
// without applying rules, and a reading older than the newest sample (a
// round that read the counters before Final but records after it) is
// dropped. Without Final, what a sandbox used after the last round is
// never sampled (nor billed); without the drop, the older reading would
// look like a counter reset to the usage meter and be billed twice.
func TestFinalReadingAndStaleReadings(t *testing.T) {
	clk := newClock()
	src := newSource(Target{ID: "a", MemoryBytes: 100})
	var got []Sample
	var events []Event
	w := New(Config{Now: clk.Now, OnSample: func(_ string, s Sample) { got = append(got, s) }}, src,
		func(e Event) { events = append(events, e) }, nil)
	base := clk.Now()
	src.stats["a"] = runtime.Stats{Time: base, CPUSeconds: 1, MemoryBytes: 10}
	w.Tick()
	w.Final("a", runtime.Stats{Time: base.Add(500 * time.Millisecond), CPUSeconds: 1.4, MemoryBytes: 95})
	if len(got) != 2 || got[1].CPUSeconds != 1.4 || !got[1].Time.Equal(base.Add(500*time.Millisecond)) {
		t.Fatalf("after Final, OnSample got %+v", got)
	}
	if len(events) != 0 {
		t.Fatalf("Final applied rules: %+v", events)
	}
	src.mu.Lock()
	src.stats["a"] = runtime.Stats{Time: base.Add(400 * time.Millisecond), CPUSeconds: 1.3, MemoryBytes: 10}
	src.mu.Unlock()
	w.Tick()
	if len(got) != 2 || len(w.Series("a", time.Time{})) != 2 {
		t.Fatalf("a stale reading was recorded: %+v", got)
	}
}
