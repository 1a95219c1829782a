// Package watchdog samples the cgroup counters of every running sandbox at a
// fixed interval, keeps a short history per sandbox and applies the
// watchdog rules: a warning event when memory, disk or pids use crosses a
// fraction of its limit, a cpu_runaway action when a sandbox stays
// CPU-bound for too long (at its quota, or starved below it on a busy
// host: see cpuBound), and an oom event when the kernel kills a process
// at the memory limit.
//
// The watchdog knows nothing of HTTP, the store or the runtime driver: a
// Source lists the targets and reads their counters, and two callbacks
// receive what the watchdog noticed. Time comes from an injectable clock
// and a sampling round is an explicit Tick, so the rules are tested by
// counting ticks rather than by waiting.
package watchdog

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/corralhq/corral/internal/runtime"
)

// Event kinds the watchdog emits.
const (
	// KindMemoryHigh is emitted when memory use crosses WarnFraction of the
	// memory limit.
	KindMemoryHigh = "watchdog.memory_high"
	// KindDiskHigh is emitted when the writable layer crosses WarnFraction
	// of the disk limit.
	KindDiskHigh = "watchdog.disk_high"
	// KindPidsHigh is emitted when the number of tasks crosses WarnFraction
	// of the pids limit.
	KindPidsHigh = "watchdog.pids_high"
	// KindCPURunaway is emitted when a sandbox has been CPU-bound (see
	// cpuBound) for the runaway duration.
	KindCPURunaway = "watchdog.cpu_runaway"
	// KindOOM is emitted when the kernel killed processes of the sandbox at
	// its memory limit since the previous sample.
	KindOOM = "watchdog.oom"
)

// Defaults applied by New to zero Config fields.
const (
	// DefaultInterval is the time between sampling rounds.
	DefaultInterval = time.Second
	// DefaultHistory is the number of samples kept per sandbox (5 minutes
	// at the default interval).
	DefaultHistory = 300
	// DefaultWarnFraction is the fraction of a memory, disk or pids limit
	// at which a warning event is emitted.
	DefaultWarnFraction = 0.8
	// DefaultWarnHysteresis is how far below WarnFraction a value must drop
	// before the warning re-arms (0.8 - 0.1 = 0.7 by default).
	DefaultWarnHysteresis = 0.1
	// DefaultCPURunawayFraction is the fraction of the CPU quota used, or
	// of the larger of the quota and one core demanded, at which a sample
	// counts as CPU-bound (see cpuBound).
	DefaultCPURunawayFraction = 0.9
	// DefaultCPURunawayFor is how long a sandbox must stay CPU-bound
	// before cpu_runaway fires.
	DefaultCPURunawayFor = 30 * time.Second
	// DefaultParallel is the number of Stats calls in flight at once.
	DefaultParallel = 8
)

// Target is one running sandbox the watchdog samples.
type Target struct {
	// ID is the sandbox id.
	ID string
	// CPULimit is the CPU quota in cores; 0 means unlimited (no runaway
	// rule).
	CPULimit float64
	// MemoryBytes is the memory limit; 0 means none (no warning).
	MemoryBytes int64
	// DiskBytes is the writable layer's limit; 0 means none (no warning).
	DiskBytes int64
	// Pids is the task limit; 0 means none (no warning).
	Pids int64
	// Tier names the sandbox's resource tier, for per-tier runaway
	// durations.
	Tier string
}

// Source lists targets and reads their counters (the sandbox manager
// implements it).
type Source interface {
	// Targets returns the sandboxes to sample this round. Ids that were
	// sampled before and are no longer listed are forgotten.
	Targets() []Target
	// Stats reads the counters of one sandbox. An error skips the sandbox
	// for the round (it may have just ended).
	Stats(id string) (runtime.Stats, error)
}

// Sample is one reading of a sandbox's counters.
type Sample struct {
	// Time is when the counters were read.
	Time time.Time
	// CPUPercent is CPU use since the previous sample, in percent of one
	// core (50 = half a core, 200 = two cores). It is 0 for the first
	// sample of a sandbox and after the CPU counter went backwards.
	CPUPercent float64
	// CPUSeconds is the cumulative CPU time of the sandbox.
	CPUSeconds float64
	// CPUWaitSeconds is the cumulative time the sandbox's threads were
	// runnable but not running (runtime.Stats.CPUWaitSeconds).
	CPUWaitSeconds float64
	// DemandPercent is the sandbox's CPU demand since the previous
	// sample, in percent of one core: CPU used plus time runnable but
	// waiting (for a CPU or at the quota), summed over its threads. A
	// thread that never sleeps demands 100 whatever CPU it gets. It is
	// CPUPercent when the wait counter is unknown or went backwards.
	DemandPercent float64
	// MemoryBytes is current memory use.
	MemoryBytes int64
	// DiskBytes is what the writable layer holds.
	DiskBytes int64
	// Pids is the current number of tasks.
	Pids int64
	// OOMKills is the cumulative number of OOM kills.
	OOMKills uint64
}

// Config tunes the watchdog. Zero fields take the defaults above.
type Config struct {
	// Interval is the time between sampling rounds in Run (default 1 s).
	Interval time.Duration
	// History is the number of samples kept per sandbox (default 300).
	History int
	// WarnFraction of a memory, disk or pids limit emits a warning event,
	// once per resource until the value drops below WarnClearFraction
	// (default 0.8).
	WarnFraction float64
	// WarnClearFraction is the fraction of the limit a value must drop
	// below to re-arm its warning (default WarnFraction - 0.1). Values at
	// or above WarnFraction are replaced by the default.
	WarnClearFraction float64
	// CPURunawayFraction is the fraction at which a sample counts as
	// CPU-bound: CPU use at this fraction of the quota, or CPU demand at
	// this fraction of the larger of the quota and one core (default
	// 0.9; see cpuBound).
	CPURunawayFraction float64
	// CPURunawayFor is how long every sample must be CPU-bound before
	// cpu_runaway fires (default 30 s; negative disables the rule).
	CPURunawayFor time.Duration
	// CPURunawayForTier overrides CPURunawayFor per tier. A positive entry
	// wins, a negative entry disables the rule for the tier, a zero entry
	// is the same as no entry.
	CPURunawayForTier map[string]time.Duration
	// Parallel bounds the Stats calls in flight during a round
	// (default 8).
	Parallel int
	// StatsTimeout bounds how long a round waits for one Stats call
	// (default Interval). A call that takes longer is skipped for the
	// round; its late result is discarded and the sandbox is not read again
	// until that call has returned.
	StatsTimeout time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// OnSample, when set, receives every sample as it is recorded (the
	// usage meter integrates them). It is called with the watchdog's lock
	// held, so that a sample is seen by OnSample exactly when Latest and
	// Series return it; it must be quick and must not call the watchdog.
	OnSample func(sandbox string, s Sample)
}

// Event is something the watchdog noticed.
type Event struct {
	// Sandbox is the sandbox id.
	Sandbox string
	// Kind is one of the Kind constants.
	Kind string
	// Value is the reading that triggered the event: bytes for memory and
	// disk, tasks for pids, the CPU used in percent of one core for
	// cpu_runaway (on a busy host it may be well below the quota; the
	// message also gives the demand), and the number of new OOM kills for
	// oom.
	Value float64
	// Limit is the limit Value is compared against, in the same unit (for
	// cpu_runaway the quota in percent of one core; for oom the memory
	// limit in bytes, 0 if none).
	Limit float64
	// Demand is, for cpu_runaway, the sandbox's CPU demand in percent of
	// one core (CPU used plus time runnable but waiting); 0 otherwise.
	Demand float64
	// Message describes the event for people.
	Message string
}

// Watchdog samples sandboxes and applies the watchdog rules. Its methods
// are safe for concurrent use; Tick rounds are serialised.
type Watchdog struct {
	cfg       Config
	src       Source
	onEvent   func(Event)
	onRunaway func(string)

	// timeout returns the channel that ends the wait for id's Stats call;
	// tests replace it to make the deadline deterministic.
	timeout func(id string) (<-chan time.Time, func())

	tickMu sync.Mutex // serialises Tick

	mu       sync.Mutex
	state    map[string]*sandboxState
	inflight map[string]bool // Stats calls abandoned by a round, still running
	pending  sync.WaitGroup  // the goroutines of those calls
}

// sandboxState is what the watchdog remembers of one sandbox.
type sandboxState struct {
	ring  []Sample // fixed capacity History
	head  int      // index of the next write
	count int      // samples held, at most len(ring)

	warned [3]bool // memory, disk, pids warning fired and not yet re-armed

	runStart time.Time // start of the current CPU-bound span
	running  bool      // in a CPU-bound span
	ranAway  bool      // cpu_runaway fired for the current span
}

// New returns a watchdog over src. onEvent receives every event and
// onRunaway the id of a sandbox whose CPU ran away (the caller kills the
// command or the sandbox per policy); either may be nil. Both are called on
// the goroutine running Tick, after the round's state is updated, and must
// not call Tick.
func New(cfg Config, src Source, onEvent func(Event), onRunaway func(sandbox string)) *Watchdog {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.History <= 0 {
		cfg.History = DefaultHistory
	}
	if cfg.WarnFraction <= 0 {
		cfg.WarnFraction = DefaultWarnFraction
	}
	if cfg.WarnClearFraction <= 0 || cfg.WarnClearFraction >= cfg.WarnFraction {
		cfg.WarnClearFraction = max(cfg.WarnFraction-DefaultWarnHysteresis, 0)
	}
	if cfg.CPURunawayFraction <= 0 {
		cfg.CPURunawayFraction = DefaultCPURunawayFraction
	}
	if cfg.CPURunawayFor == 0 {
		cfg.CPURunawayFor = DefaultCPURunawayFor
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = DefaultParallel
	}
	if cfg.StatsTimeout <= 0 {
		cfg.StatsTimeout = cfg.Interval
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if onEvent == nil {
		onEvent = func(Event) {}
	}
	if onRunaway == nil {
		onRunaway = func(string) {}
	}
	w := &Watchdog{
		cfg:       cfg,
		src:       src,
		onEvent:   onEvent,
		onRunaway: onRunaway,
		state:     make(map[string]*sandboxState),
		inflight:  make(map[string]bool),
	}
	w.timeout = func(string) (<-chan time.Time, func()) {
		t := time.NewTimer(w.cfg.StatsTimeout)
		return t.C, func() { t.Stop() }
	}
	return w
}

// Run samples every Interval, starting at once, until ctx is done.
func (w *Watchdog) Run(ctx context.Context) {
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		w.Tick()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reading is the outcome of one Stats call in a round.
type reading struct {
	ok    bool
	stats runtime.Stats
	time  time.Time
}

// Tick runs one sampling round: it lists the targets, forgets sandboxes no
// longer listed, reads every target's counters (at most Parallel calls at
// once, each waited for at most StatsTimeout), records the samples and
// applies the rules. Events and runaway callbacks are delivered before Tick
// returns, in target order.
func (w *Watchdog) Tick() {
	w.tickMu.Lock()
	defer w.tickMu.Unlock()

	targets := w.src.Targets()
	live := make(map[string]bool, len(targets))
	for _, t := range targets {
		live[t.ID] = true
	}
	w.mu.Lock()
	for id := range w.state {
		if !live[id] {
			delete(w.state, id)
		}
	}
	w.mu.Unlock()

	readings := w.read(targets)

	var events []Event
	var runaways []string
	w.mu.Lock()
	for i, t := range targets {
		r := readings[i]
		if !r.ok {
			continue
		}
		ev, ran := w.observe(t, r)
		events = append(events, ev...)
		if ran {
			runaways = append(runaways, t.ID)
		}
	}
	w.mu.Unlock()

	for _, e := range events {
		w.onEvent(e)
	}
	for _, id := range runaways {
		w.onRunaway(id)
	}
}

// read calls Stats for every target with at most Parallel calls at once.
// A worker waits at most StatsTimeout for a call; a call that has not
// returned by then is abandoned (its goroutine finishes on its own and
// clears the in-flight mark), and no new call is made for that sandbox
// while it is in flight, so a hung Stats costs one goroutine, not one per
// round.
func (w *Watchdog) read(targets []Target) []reading {
	out := make([]reading, len(targets))
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range min(w.cfg.Parallel, len(targets)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				out[i] = w.readOne(targets[i].ID)
			}
		}()
	}
	for i := range targets {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	return out
}

// readOne reads one sandbox's counters, giving up after StatsTimeout.
func (w *Watchdog) readOne(id string) reading {
	w.mu.Lock()
	if w.inflight[id] {
		w.mu.Unlock()
		return reading{}
	}
	w.inflight[id] = true
	w.pending.Add(1)
	w.mu.Unlock()

	done := make(chan reading, 1)
	go func() {
		defer w.pending.Done()
		s, err := w.src.Stats(id)
		r := reading{ok: err == nil, stats: s, time: s.Time}
		if r.time.IsZero() {
			r.time = w.cfg.Now()
		}
		w.mu.Lock()
		delete(w.inflight, id)
		w.mu.Unlock()
		done <- r
	}()
	deadline, stop := w.timeout(id)
	defer stop()
	select {
	case r := <-done:
		return r
	case <-deadline:
		return reading{}
	}
}

// observe records a reading of t and applies the rules. It returns the
// events to deliver and whether onRunaway must be called. w.mu is held.
func (w *Watchdog) observe(t Target, r reading) ([]Event, bool) {
	st, s, prev, hasPrev, ok := w.record(t.ID, r)
	if !ok {
		return nil, false
	}
	var newKills uint64
	switch {
	case !hasPrev:
		// The first reading has no baseline for CPU; OOM kills counted
		// before it happened while nobody watched, so they are reported.
		newKills = s.OOMKills
	case s.OOMKills >= prev.OOMKills:
		newKills = s.OOMKills - prev.OOMKills
	default:
		newKills = s.OOMKills
	}

	var events []Event
	if newKills > 0 {
		events = append(events, Event{
			Sandbox: t.ID,
			Kind:    KindOOM,
			Value:   float64(newKills),
			Limit:   float64(t.MemoryBytes),
			Message: fmt.Sprintf("%d process(es) killed at the memory limit (%d in total)", newKills, s.OOMKills),
		})
	}
	resources := [3]struct {
		kind, name   string
		value, limit int64
	}{
		{KindMemoryHigh, "memory", s.MemoryBytes, t.MemoryBytes},
		{KindDiskHigh, "disk", s.DiskBytes, t.DiskBytes},
		{KindPidsHigh, "pids", s.Pids, t.Pids},
	}
	for i, res := range resources {
		if res.limit <= 0 {
			st.warned[i] = false
			continue
		}
		frac := float64(res.value) / float64(res.limit)
		switch {
		case !st.warned[i] && frac >= w.cfg.WarnFraction:
			st.warned[i] = true
			events = append(events, Event{
				Sandbox: t.ID,
				Kind:    res.kind,
				Value:   float64(res.value),
				Limit:   float64(res.limit),
				Message: fmt.Sprintf("%s at %.0f%% of its limit (%d of %d)", res.name, frac*100, res.value, res.limit),
			})
		case st.warned[i] && frac < w.cfg.WarnClearFraction:
			st.warned[i] = false
		}
	}

	ran := false
	if ev, ok := w.runaway(t, st, s, prev, hasPrev); ok {
		events = append(events, ev)
		ran = true
	}
	return events, ran
}

// record makes the sample of reading r of sandbox id, pushes it to the
// sandbox's history and hands it to OnSample; w.mu is held. A reading
// older than the newest sample (one read before a Final reading but
// recorded after it) is dropped: ok is false.
func (w *Watchdog) record(id string, r reading) (st *sandboxState, s, prev Sample, hasPrev, ok bool) {
	st = w.state[id]
	if st == nil {
		st = &sandboxState{ring: make([]Sample, w.cfg.History)}
		w.state[id] = st
	}
	prev, hasPrev = st.latest()
	if hasPrev && r.time.Before(prev.Time) {
		return st, s, prev, hasPrev, false
	}
	s = Sample{
		Time:           r.time,
		CPUSeconds:     r.stats.CPUSeconds,
		CPUWaitSeconds: r.stats.CPUWaitSeconds,
		MemoryBytes:    r.stats.MemoryBytes,
		DiskBytes:      r.stats.DiskBytes,
		Pids:           r.stats.Pids,
		OOMKills:       r.stats.OOMKills,
	}
	if hasPrev {
		if dt := s.Time.Sub(prev.Time).Seconds(); dt <= 0 {
			s.CPUPercent, s.DemandPercent = prev.CPUPercent, prev.DemandPercent
		} else if dc := s.CPUSeconds - prev.CPUSeconds; dc >= 0 {
			s.CPUPercent = dc / dt * 100
			s.DemandPercent = s.CPUPercent
			if dw := s.CPUWaitSeconds - prev.CPUWaitSeconds; dw > 0 {
				s.DemandPercent += dw / dt * 100
			}
		} // else the counter went backwards (new cgroup): no baseline, 0.
	}
	st.push(s)
	if w.cfg.OnSample != nil {
		w.cfg.OnSample(id, s)
	}
	return st, s, prev, hasPrev, true
}

// Final records stats, the last reading of a sandbox that is about to
// be stopped (the caller reads them: the Source no longer lists an
// ending sandbox), outside the rounds, so that what it used since the
// previous round is in its samples and reaches OnSample (the usage meter
// bills up to the end, not to the last round). No rule is applied to
// it. It may be called from onRunaway.
func (w *Watchdog) Final(id string, stats runtime.Stats) {
	r := reading{ok: true, stats: stats, time: stats.Time}
	if r.time.IsZero() {
		r.time = w.cfg.Now()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.record(id, r)
}

// runawayFor returns the runaway duration for a tier; ok is false when the
// rule is disabled.
func (w *Watchdog) runawayFor(tier string) (time.Duration, bool) {
	d := w.cfg.CPURunawayFor
	if o := w.cfg.CPURunawayForTier[tier]; o != 0 {
		d = o
	}
	return d, d > 0
}

// cpuBound reports whether one sampling interval of a sandbox counts
// towards cpu_runaway. cpuPercent is the CPU it used and demandPercent
// its demand (CPU used plus time runnable but waiting, summed over its
// threads), both in percent of one core; quota is its CPU limit in cores.
//
// It defends against a busy loop that never ends (a `while True` retry
// with no command timeout) on a host where more sandboxes spin than
// there are cores: each then gets less than its quota, so a rule on CPU
// use alone never fires and the loops burn the host for good. The
// interval is CPU-bound when either
//
//   - the sandbox used at least fraction of its quota (it got what it
//     may have and used it), or
//   - its demand was at least fraction of the larger of its quota and one
//     core: it would have used its whole quota had the host given it the
//     CPU, and, for a quota below one core, some thread of it was
//     runnable nearly all the time (it did not sleep).
//
// The one-core floor keeps work that sleeps from matching: a thread busy
// half the time in a half-core sandbox demands exactly its quota yet is
// idle half the time, while a spinning thread demands a whole core
// however little of it it gets. Sleeping, blocked (on I/O, a lock, a
// child) and stopped threads are not runnable and demand nothing, so an
// idle or I/O-bound sandbox never matches; for a quota of a core or more
// a sandbox must keep enough threads runnable to fill its quota, so a
// single spinning thread in a two-core sandbox does not match (as with
// CPU use alone). A relative epsilon keeps a reading exactly at a
// threshold from missing it by rounding (0.9*100 is not exactly 90 in
// binary).
func cpuBound(cpuPercent, demandPercent, quota, fraction float64) bool {
	if quota <= 0 {
		return false
	}
	const eps = 1 - 1e-9
	return cpuPercent >= fraction*quota*100*eps ||
		demandPercent >= fraction*max(quota, 1)*100*eps
}

// runaway applies the CPU runaway rule to sample s. A span starts at the
// previous sample's time when a sample is CPU-bound (the sample's
// percentages cover the interval since then) and ends at the first sample
// that is not. The rule fires once per span, when the span reaches the
// duration; a tenth of an Interval of slack absorbs jitter in sampling
// times without letting an exact clock fire a round early.
func (w *Watchdog) runaway(t Target, st *sandboxState, s, prev Sample, hasPrev bool) (Event, bool) {
	dur, enabled := w.runawayFor(t.Tier)
	if !enabled || !hasPrev || !cpuBound(s.CPUPercent, s.DemandPercent, t.CPULimit, w.cfg.CPURunawayFraction) {
		st.running, st.ranAway = false, false
		return Event{}, false
	}
	if !st.running {
		st.running, st.runStart = true, prev.Time
	}
	span := s.Time.Sub(st.runStart)
	if st.ranAway || span < dur-w.cfg.Interval/10 {
		return Event{}, false
	}
	st.ranAway = true
	return Event{
		Sandbox: t.ID,
		Kind:    KindCPURunaway,
		Value:   s.CPUPercent,
		Limit:   t.CPULimit * 100,
		Demand:  s.DemandPercent,
		Message: fmt.Sprintf("CPU-bound for %s with a %.2g-core quota (now using %.0f%% of one core, demanding %.0f%%)",
			span.Round(time.Millisecond), t.CPULimit, s.CPUPercent, s.DemandPercent),
	}, true
}

// push appends s to the ring, overwriting the oldest sample when full.
func (st *sandboxState) push(s Sample) {
	st.ring[st.head] = s
	st.head = (st.head + 1) % len(st.ring)
	if st.count < len(st.ring) {
		st.count++
	}
}

// latest returns the newest sample.
func (st *sandboxState) latest() (Sample, bool) {
	if st.count == 0 {
		return Sample{}, false
	}
	return st.ring[(st.head-1+len(st.ring))%len(st.ring)], true
}

// Latest returns the newest sample of a sandbox.
func (w *Watchdog) Latest(id string) (Sample, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.state[id]
	if st == nil {
		return Sample{}, false
	}
	return st.latest()
}

// Series returns a copy of the samples of a sandbox taken at or after
// since, oldest first (all of them for a zero since). It is nil for an
// unknown sandbox.
func (w *Watchdog) Series(id string, since time.Time) []Sample {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.state[id]
	if st == nil {
		return nil
	}
	out := make([]Sample, 0, st.count)
	start := st.head - st.count + len(st.ring)
	for i := range st.count {
		s := st.ring[(start+i)%len(st.ring)]
		if !s.Time.Before(since) {
			out = append(out, s)
		}
	}
	return out
}

// Forget drops the history and rule state of a sandbox (it ended). Tick
// does the same for ids no longer returned by Targets.
func (w *Watchdog) Forget(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.state, id)
}
