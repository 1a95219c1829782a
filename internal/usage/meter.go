// Package usage meters what sandboxes use, for chargeback per team, task,
// agent and sandbox (docs/configuration.md, "Usage"): CPU seconds and
// memory GiB-seconds from the watchdog's samples, egress bytes from the
// egress proxy's events, commands started, and sandbox-seconds from the
// sandbox records.
//
// The [Meter] adds what it is fed to per-sandbox, per-minute amounts in
// memory and writes them to the store every FlushInterval (and soon after
// a sandbox ends), in one transaction with the last watchdog reading they
// account for (a baseline). Reports and the Prometheus counters flush
// first, so they include everything metered so far. A crash loses at most
// the memory, egress and command amounts of one flush interval; CPU time
// is not lost, as the next reading after a restart is counted from the
// stored baseline (for a sandbox that was adopted, whose cgroup counter
// kept running).
//
// The arithmetic (see [Meter.Sample]):
//
//   - CPU seconds are the increase of the sandbox's cumulative CPU
//     counter. The first reading of a sandbox counts in full (the counter
//     started at zero with the sandbox's cgroup), and so does a reading
//     below the previous one (a new cgroup: a persisted sandbox resumed).
//     So a sandbox's CPU seconds equal its last reading's cumulative CPU.
//   - Memory GiB-seconds integrate the memory readings over time by the
//     trapezoid rule: each interval between two consecutive readings of
//     a sandbox adds (m1+m2)/2 × interval. Intervals longer than
//     [MaxSampleGap] (the sandbox was paused and not sampled, the server
//     was down, the counters could not be read) add nothing, nor does the
//     interval across a CPU counter reset.
//   - An amount goes to the minute in which the reading or event that
//     completed it arrived.
package usage

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/watchdog"
)

// Defaults and bounds of the meter (docs/configuration.md, "Usage").
const (
	// DefaultFlushInterval is the time between writes of the metered
	// amounts to the store: what a crash can lose at most.
	DefaultFlushInterval = 10 * time.Second
	// MaxSampleGap is the longest interval between two readings of a
	// sandbox that memory is integrated over.
	MaxSampleGap = 10 * time.Second
	// forgetAfter is how long after its last reading an ended sandbox's
	// baseline is kept (a reading taken just before the end may still
	// arrive).
	forgetAfter = time.Minute
	// settleLag is how long after a sandbox ended its life counts as
	// settled in the sandbox-seconds counter (its record is long
	// committed by then).
	settleLag = time.Minute
	// maxTeamCache bounds the sandbox → team cache.
	maxTeamCache = 10000
)

// gib is a GiB in bytes.
const gib = 1 << 30

// Config tunes a meter; zero fields take the defaults.
type Config struct {
	// FlushInterval is the time between writes to the store (default
	// DefaultFlushInterval).
	FlushInterval time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Log receives flush failures (default slog.Default()).
	Log *slog.Logger
}

// key is a sandbox and the minute (unix seconds of its start).
type key struct {
	sandbox string
	bucket  int64
}

// reading is the last watchdog reading of a sandbox the amounts account
// for.
type reading struct {
	cpu float64
	mem int64
	at  time.Time
}

// Meter meters usage. Its methods are safe for concurrent use; the
// feeding methods (Sample, Egress, Command) only take a lock and add.
type Meter struct {
	cfg Config
	st  *store.Store

	flushMu sync.Mutex // serialises flushes

	mu      sync.Mutex
	pending map[key]*store.UsageAmounts
	last    map[string]reading
	dirty   map[string]bool // sandboxes whose reading changed since the last flush
	teams   map[string]string
	totals  map[string]store.UsageAmounts // stored amounts by team

	secMu     sync.Mutex
	settled   map[string]float64 // sandbox-seconds of sandboxes ended up to watermark
	watermark time.Time
	emitted   map[string]float64 // largest sandbox-seconds value returned, by team

	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	started bool
	once    sync.Once
}

// New returns a meter over st, loaded with the stored baselines and
// totals.
func New(ctx context.Context, st *store.Store, cfg Config) (*Meter, error) {
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = DefaultFlushInterval
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	m := &Meter{cfg: cfg, st: st, pending: map[key]*store.UsageAmounts{}, last: map[string]reading{}, dirty: map[string]bool{},
		teams: map[string]string{}, emitted: map[string]float64{},
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	bases, err := st.UsageBaselines(ctx)
	if err != nil {
		return nil, fmt.Errorf("usage meter: %w", err)
	}
	for id, b := range bases {
		m.last[id] = reading{cpu: b.CPUSeconds, mem: b.MemoryBytes, at: b.SampledAt}
	}
	if m.totals, err = st.UsageTotalsByTeam(ctx); err != nil {
		return nil, fmt.Errorf("usage meter: %w", err)
	}
	now := cfg.Now()
	m.watermark = now.Add(-settleLag)
	if _, m.settled, err = st.SandboxSecondsByTeam(ctx, time.Time{}, m.watermark, now); err != nil {
		return nil, fmt.Errorf("usage meter: %w", err)
	}
	return m, nil
}

// Sample meters one watchdog reading of a sandbox (watchdog.Config's
// OnSample): the CPU counter's increase and the memory integral over the
// interval since the previous reading (see the package comment). A
// reading older than the sandbox's newest is ignored: a round that read
// the counters before the watchdog's final reading at the sandbox's end
// would otherwise look like a counter reset and be counted in full.
func (m *Meter) Sample(sandbox string, s watchdog.Sample) {
	m.mu.Lock()
	defer m.mu.Unlock()
	prev, ok := m.last[sandbox]
	if ok && s.Time.Before(prev.at) {
		return // read before the newest reading (a round racing the final one)
	}
	m.last[sandbox] = reading{cpu: s.CPUSeconds, mem: s.MemoryBytes, at: s.Time}
	m.dirty[sandbox] = true
	a := amounts(prev, ok, s)
	m.addLocked(sandbox, s.Time, a)
}

// amounts is what a reading s adds after the previous reading prev (ok:
// there is one) of the same sandbox: the arithmetic of the package
// comment.
func amounts(prev reading, ok bool, s watchdog.Sample) store.UsageAmounts {
	var a store.UsageAmounts
	if !ok || s.CPUSeconds < prev.cpu {
		a.CPUSeconds = max(s.CPUSeconds, 0)
		return a
	}
	a.CPUSeconds = s.CPUSeconds - prev.cpu
	if dt := s.Time.Sub(prev.at); dt > 0 && dt <= MaxSampleGap {
		a.MemoryGiBSeconds = (float64(prev.mem) + float64(s.MemoryBytes)) / 2 * dt.Seconds() / gib
	}
	return a
}

// Egress meters the bytes of one egress proxy event of a sandbox (every
// event the audit log records as egress.*); events of no known sandbox
// are not metered.
func (m *Meter) Egress(sandbox string, up, down int64) {
	if sandbox == "" || (up <= 0 && down <= 0) {
		return
	}
	m.add(sandbox, store.UsageAmounts{EgressBytesUp: max(up, 0), EgressBytesDown: max(down, 0)})
}

// Command meters one command started in a sandbox (sandbox.Config's
// OnCommand).
func (m *Meter) Command(sandbox string) {
	m.add(sandbox, store.UsageAmounts{Commands: 1})
}

func (m *Meter) add(sandbox string, a store.UsageAmounts) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.addLocked(sandbox, m.cfg.Now(), a)
}

// addLocked adds a to the sandbox's amounts of the minute of at; m.mu is
// held.
func (m *Meter) addLocked(sandbox string, at time.Time, a store.UsageAmounts) {
	if a == (store.UsageAmounts{}) {
		return
	}
	k := key{sandbox, at.Truncate(store.UsageBucket).Unix()}
	p := m.pending[k]
	if p == nil {
		p = &store.UsageAmounts{}
		m.pending[k] = p
	}
	p.Add(a)
}

// Kick asks for a flush soon (a sandbox ended), without waiting for it.
func (m *Meter) Kick() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// Start flushes every FlushInterval and after each Kick until Close.
func (m *Meter) Start() {
	m.started = true
	go func() {
		defer close(m.done)
		t := time.NewTicker(m.cfg.FlushInterval)
		defer t.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-t.C:
			case <-m.kick:
			}
			if err := m.Flush(context.Background()); err != nil {
				m.cfg.Log.Error("usage flush", "err", err)
			}
		}
	}()
}

// Close stops the flushing and writes what is pending.
func (m *Meter) Close() error {
	m.once.Do(func() {
		close(m.stop)
		if m.started {
			<-m.done
		}
	})
	return m.Flush(context.Background())
}

// Flush writes the pending amounts and the changed baselines to the
// store in one transaction and drops the baselines of sandboxes that
// ended over forgetAfter after their last reading. On failure everything
// stays pending for the next flush.
func (m *Meter) Flush(ctx context.Context) error {
	m.flushMu.Lock()
	defer m.flushMu.Unlock()
	now := m.cfg.Now()

	m.mu.Lock()
	pending, dirty := m.pending, m.dirty
	m.pending, m.dirty = map[key]*store.UsageAmounts{}, map[string]bool{}
	var bases []store.UsageBaseline
	for id := range dirty {
		if r, ok := m.last[id]; ok {
			bases = append(bases, store.UsageBaseline{SandboxID: id, CPUSeconds: r.cpu, MemoryBytes: r.mem, SampledAt: r.at})
		}
	}
	var lookup, stale []string
	seen := map[string]bool{}
	for k := range pending {
		if _, ok := m.teams[k.sandbox]; !ok && !seen[k.sandbox] {
			seen[k.sandbox] = true
			lookup = append(lookup, k.sandbox)
		}
	}
	for id, r := range m.last {
		if now.Sub(r.at) > forgetAfter {
			stale = append(stale, id)
			if !seen[id] {
				seen[id] = true
				lookup = append(lookup, id)
			}
		}
	}
	m.mu.Unlock()

	restore := func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		for k, a := range pending {
			if p := m.pending[k]; p != nil {
				p.Add(*a)
			} else {
				m.pending[k] = a
			}
		}
		for id := range dirty {
			m.dirty[id] = true
		}
	}
	owners, err := m.st.SandboxOwners(ctx, lookup)
	if err != nil {
		restore()
		return err
	}
	var drop []string
	for _, id := range stale {
		if o, ok := owners[id]; !ok || o.Ended {
			drop = append(drop, id)
		}
	}
	recs := make([]store.UsageRecord, 0, len(pending))
	for k, a := range pending {
		recs = append(recs, store.UsageRecord{SandboxID: k.sandbox, Bucket: time.Unix(k.bucket, 0).UTC(), UsageAmounts: *a})
	}
	if len(recs) == 0 && len(bases) == 0 && len(drop) == 0 {
		return nil
	}
	if err := m.st.WriteUsage(ctx, recs, bases, drop); err != nil {
		restore()
		return err
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.teams) > maxTeamCache {
		m.teams = map[string]string{}
	}
	for id, o := range owners {
		m.teams[id] = o.Team
	}
	for _, r := range recs {
		team, ok := m.teams[r.SandboxID]
		if !ok {
			continue // no record: not in any team's usage (nor in reports)
		}
		t := m.totals[team]
		t.Add(r.UsageAmounts)
		m.totals[team] = t
	}
	for _, id := range drop {
		if r, ok := m.last[id]; ok && now.Sub(r.at) > forgetAfter && !m.dirty[id] {
			delete(m.last, id)
			delete(m.teams, id)
		}
	}
	return nil
}

// Totals are one team's all-time usage (the Prometheus counters).
type Totals struct {
	store.UsageAmounts
	SandboxSeconds float64
}

// TeamTotals flushes and returns every team's usage so far: the stored
// amounts (those pruned by retention before this server started are not
// included) and the sandbox-seconds of every sandbox record. The values
// never decrease while the server runs.
func (m *Meter) TeamTotals(ctx context.Context) (map[string]Totals, error) {
	if err := m.Flush(ctx); err != nil {
		return nil, err
	}
	secs, err := m.sandboxSeconds(ctx)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]Totals, len(m.totals)+len(secs))
	for team, a := range m.totals {
		out[team] = Totals{UsageAmounts: a}
	}
	for team, s := range secs {
		t := out[team]
		t.SandboxSeconds = s
		out[team] = t
	}
	return out, nil
}

// sandboxSeconds returns every team's sandbox-seconds so far: the
// settled sum of sandboxes that ended before the watermark plus the
// recent and live ones read now; the watermark moves up to settleLag
// before now. A value is never lower than one returned before (a
// sandbox whose end is being recorded may dip by milliseconds).
func (m *Meter) sandboxSeconds(ctx context.Context) (map[string]float64, error) {
	m.secMu.Lock()
	defer m.secMu.Unlock()
	now := m.cfg.Now()
	wm := now.Add(-settleLag)
	if !wm.After(m.watermark) {
		wm = m.watermark
	}
	recent, settle, err := m.st.SandboxSecondsByTeam(ctx, m.watermark, wm, now)
	if err != nil {
		return nil, err
	}
	out := make(map[string]float64, len(m.settled)+len(recent))
	for team, s := range m.settled {
		out[team] += s
	}
	for team, s := range recent {
		out[team] += s
	}
	for team, s := range settle {
		m.settled[team] += s
	}
	m.watermark = wm
	for team, s := range out {
		if s < m.emitted[team] {
			out[team] = m.emitted[team]
		}
		m.emitted[team] = out[team]
	}
	for team, s := range m.emitted {
		if _, ok := out[team]; !ok {
			out[team] = s
		}
	}
	return out, nil
}

// Query selects a report.
type Query struct {
	// Team is the team ("" = every team).
	Team string
	// Since and Until bound the window (zero: unbounded); they are
	// rounded out to whole minutes.
	Since, Until time.Time
	// By groups the rows: store.UsageByTeam, UsageByAgent, UsageByTask,
	// UsageBySandbox, or "" for the totals only.
	By string
}

// Report is a usage report.
type Report struct {
	// Since and Until are the window after rounding (zero: unbounded).
	Since, Until time.Time
	// Totals sum the rows.
	Totals store.UsageRow
	// Rows are the groups (none when the query had no By).
	Rows []*store.UsageRow
}

// Report flushes and returns the usage q selects.
func (m *Meter) Report(ctx context.Context, q Query) (*Report, error) {
	if err := m.Flush(ctx); err != nil {
		return nil, err
	}
	return ReportFrom(ctx, m.st, q, m.cfg.Now())
}

// ReportFrom returns the usage q selects from what st holds, at now.
func ReportFrom(ctx context.Context, st *store.Store, q Query, now time.Time) (*Report, error) {
	rep := &Report{}
	if !q.Since.IsZero() {
		rep.Since = q.Since.UTC().Truncate(store.UsageBucket)
	}
	if !q.Until.IsZero() {
		u := q.Until.UTC()
		if t := u.Truncate(store.UsageBucket); t.Equal(u) {
			rep.Until = t
		} else {
			rep.Until = t.Add(store.UsageBucket)
		}
	}
	by := q.By
	if by == "" {
		by = store.UsageByTeam
	}
	rows, err := st.UsageReport(ctx, store.UsageQuery{Team: q.Team, Since: rep.Since, Until: rep.Until, By: by, Now: now})
	if err != nil {
		return nil, err
	}
	for _, r := range rows {
		rep.Totals.UsageAmounts.Add(r.UsageAmounts)
		rep.Totals.SandboxSeconds += r.SandboxSeconds
		rep.Totals.Sandboxes += r.Sandboxes
	}
	rep.Totals.Team = q.Team
	if q.By != "" {
		rep.Rows = rows
	}
	if rep.Rows == nil {
		rep.Rows = []*store.UsageRow{}
	}
	return rep, nil
}
