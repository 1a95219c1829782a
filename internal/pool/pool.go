// Package pool keeps the warm pools: per team and template, idle
// sandboxes started ahead of time with the template's defaults (tier
// light, runc, no network), each handed to exactly one create of that
// team and never reused. The pools start and stop sandboxes through a
// Starter (the sandbox manager); they own no lifecycle of their own.
package pool

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corralhq/corral/internal/actor"
	"github.com/corralhq/corral/internal/store"
)

// Pool limits and defaults.
const (
	// MaxSize bounds a pool's max.
	MaxSize = 100
	// DefaultMaxIdle is how long a pooled sandbox may wait before it is
	// replaced by a fresh one.
	DefaultMaxIdle = 30 * time.Minute
	// MemoryFloor: below this fraction of available host memory pools
	// stop refilling and give back their idle sandboxes.
	MemoryFloor = 0.10
)

// Config is one team's warm pool of one template.
type Config struct {
	// Team owns the pool: only its creates take the pool's sandboxes,
	// which start as that team's ("" is store.DefaultTeam).
	Team     string        `json:"team"`
	Template string        `json:"template"`
	Min      int           `json:"min"`      // idle sandboxes kept ready
	Max      int           `json:"max"`      // idle sandboxes at most (the target grows to it on misses)
	MaxIdle  time.Duration `json:"max_idle"` // a pooled sandbox older than this is replaced
}

// Stats describes one pool.
type Stats struct {
	Config
	Idle         int     `json:"idle"`
	Target       int     `json:"target"`
	Hits         int64   `json:"hits"`
	Misses       int64   `json:"misses"`
	Refills      int64   `json:"refills"`
	RefillMSAvg  float64 `json:"refill_ms_avg"`
	Evicted      int64   `json:"evicted"`
	LastRefillMS float64 `json:"last_refill_ms"`
}

// ErrClosed is what a Starter returns when the server has begun to shut
// down: the refill pass stops quietly (it is no failure).
var ErrClosed = errors.New("pools closed: the server is shutting down")

// InvalidError is a pool configuration the caller must fix.
type InvalidError struct{ Msg string }

func (e *InvalidError) Error() string { return e.Msg }

// Idle is one idle pooled sandbox: started, not recorded, not listed.
type Idle struct {
	ID, Token string
	// Version is the template version it runs.
	Version string
	Started time.Time
}

// Starter is what the pools need of the sandbox manager.
type Starter interface {
	// StartIdle starts a sandbox of team's template with the
	// template's defaults and no record. It calls claim with the
	// sandbox's id before the runtime starts it, so that the reaper
	// leaves it alone. Once the server is shutting down it starts
	// nothing and returns ErrClosed.
	StartIdle(team, template string, claim func(id string)) (*Idle, error)
	// StopIdle stops a pooled sandbox (total stop, nothing recorded).
	StopIdle(id string)
	// Alive reports whether a pooled sandbox still runs.
	Alive(id string) bool
	// Room is how many more sandboxes the global limit allows besides
	// the pools' own: the limit less the live sandboxes.
	Room() int
}

// auditRecorder records pool events in the audit log (*audit.Log), with
// the team and key id of the request that caused them.
type auditRecorder interface {
	RecordBy(ctx context.Context, sandbox, kind string, data any)
}

// key names one pool: a team's pool of a template.
type key struct{ team, template string }

type pool struct {
	cfg     Config
	target  int
	idle    []*Idle
	filling int
	stats   Stats
}

// Pools holds the warm pools. It is safe for concurrent use.
type Pools struct {
	starter  Starter
	st       *store.Store
	audit    auditRecorder
	log      *slog.Logger
	pressure func() bool

	// mu guards byName, ids, taken, closed and every pool's fields.
	mu     sync.Mutex
	byName map[key]*pool
	// ids are the sandboxes the pools own (idle, starting or taken),
	// which the reaper must leave alone.
	ids map[string]bool
	// taken are the sandboxes Take handed to a create that has neither
	// made them live (Release) nor given them back (DiscardLater) yet:
	// Drain stops them.
	taken map[string]*Idle
	// refilling keeps one refill pass at a time.
	refilling sync.Mutex
	// closed is set by Drain (under mu): no refill starts a sandbox
	// after it, what a refill in flight started is stopped, and every
	// pooled sandbox left (idle or taken) is Drain's alone to stop.
	closed bool
	// inflight counts the refill passes and the stops of sandboxes taken
	// out of the pools (discards, evictions), which Drain waits for; Add
	// only under mu while !closed.
	inflight sync.WaitGroup
}

// New returns empty pools (Load reads their configuration) that start
// sandboxes through s. pressure reports whether the host is short of
// memory (nil: HostMemoryPressure); audit may be nil.
func New(s Starter, st *store.Store, audit auditRecorder, pressure func() bool, log *slog.Logger) *Pools {
	if pressure == nil {
		pressure = HostMemoryPressure
	}
	if log == nil {
		log = slog.Default()
	}
	return &Pools{starter: s, st: st, audit: audit, log: log, pressure: pressure,
		byName: map[key]*pool{}, ids: map[string]bool{}, taken: map[string]*Idle{}}
}

func (ps *Pools) record(ctx context.Context, kind string, data any) {
	if ps.audit != nil {
		ps.audit.RecordBy(ctx, "", kind, data)
	}
}

func teamOr(team string) string {
	if team == "" {
		return store.DefaultTeam
	}
	return team
}

// Owns reports whether id is a sandbox a pool owns.
func (ps *Pools) Owns(id string) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.ids[id]
}

// Set creates or changes c.Team's pool of c.Template (min 0 and max 0
// removes it, stopping its idle sandboxes); another team's pool of the
// template is untouched. The caller has checked the template.
func (ps *Pools) Set(ctx context.Context, c Config) (Stats, error) {
	c.Team = teamOr(c.Team)
	if c.Max == 0 {
		c.Max = c.Min
	}
	if c.Min < 0 || c.Max < c.Min || c.Max > MaxSize {
		return Stats{}, &InvalidError{Msg: fmt.Sprintf("pool sizes must satisfy 0 <= min <= max <= %d", MaxSize)}
	}
	if c.MaxIdle == 0 {
		c.MaxIdle = DefaultMaxIdle
	}
	if c.MaxIdle < time.Minute || c.MaxIdle > 24*time.Hour {
		return Stats{}, &InvalidError{Msg: "max idle age must be between 1m and 24h"}
	}
	if err := ps.st.PutPool(ctx, store.Pool{Team: c.Team, Template: c.Template, Min: c.Min, Max: c.Max, MaxIdleS: int64(c.MaxIdle / time.Second)}); err != nil {
		return Stats{}, err
	}
	k := key{c.Team, c.Template}
	ps.mu.Lock()
	p := ps.byName[k]
	if p == nil {
		p = &pool{}
		ps.byName[k] = p
	}
	p.cfg = c
	p.target = max(c.Min, min(p.target, c.Max))
	var drop []*Idle
	for !ps.closed && len(p.idle) > c.Max { // once closed, Drain stops them
		drop = append(drop, p.idle[0])
		p.idle = p.idle[1:]
	}
	if len(drop) > 0 {
		ps.inflight.Add(1)
	}
	st := p.statsLocked()
	if c.Max == 0 && len(p.idle) == 0 {
		delete(ps.byName, k)
	}
	ps.mu.Unlock()
	if len(drop) > 0 {
		for _, d := range drop {
			ps.discard(d)
		}
		ps.inflight.Done()
	}
	ps.record(ctx, "pool.set", map[string]any{"team": c.Team, "template": c.Template, "min": c.Min, "max": c.Max, "max_idle_s": int64(c.MaxIdle / time.Second)})
	go ps.Refill()
	return st, nil
}

// List returns every team's pools' configuration and counters, by team
// and template.
func (ps *Pools) List() []Stats {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := make([]Stats, 0, len(ps.byName))
	for _, p := range ps.byName {
		out = append(out, p.statsLocked())
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Team != out[j].Team {
			return out[i].Team < out[j].Team
		}
		return out[i].Template < out[j].Template
	})
	return out
}

func (p *pool) statsLocked() Stats {
	s := p.stats
	s.Config, s.Idle, s.Target = p.cfg, len(p.idle), p.target
	return s
}

// Load reads the pools' configuration from the store (at start).
func (ps *Pools) Load(ctx context.Context) {
	list, err := ps.st.ListPools(ctx)
	if err != nil {
		ps.log.Error("load pools", "err", err)
		return
	}
	ps.mu.Lock()
	for _, c := range list {
		ps.byName[key{teamOr(c.Team), c.Template}] = &pool{cfg: Config{Team: teamOr(c.Team), Template: c.Template, Min: c.Min, Max: c.Max,
			MaxIdle: time.Duration(c.MaxIdleS) * time.Second}, target: c.Min}
	}
	ps.mu.Unlock()
}

// Take hands out an idle sandbox of team's pool of template, if any,
// that runs version (the template's current version; older ones are
// dropped). Only team's own pool serves it: a sandbox started for one
// team is never handed to another. On a miss the pool's target grows (up
// to its max); once the pools are drained every take misses. The
// sandbox stays owned (Owns) until the create has made it live
// (Release) or given it up (DiscardLater); one still taken when Drain
// runs is stopped by Drain, so a create must Release it before Drain
// can begin (the Manager does so under its lock, while not closing).
func (ps *Pools) Take(team, template, version string) *Idle {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.byName[key{teamOr(team), template}]
	if p == nil || ps.closed {
		return nil
	}
	for len(p.idle) > 0 {
		pd := p.idle[0]
		p.idle = p.idle[1:]
		if pd.Version == version && ps.starter.Alive(pd.ID) {
			p.stats.Hits++
			ps.taken[pd.ID] = pd
			return pd
		}
		ps.discardLocked(pd)
	}
	p.stats.Misses++
	p.target = min(p.target+1, p.cfg.Max)
	return nil
}

// count is the number of pooled sandboxes (idle or being started).
func (ps *Pools) count() int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	n := 0
	for _, p := range ps.byName {
		n += len(p.idle) + p.filling
	}
	return n
}

// Free is how many more sandboxes (user or pooled) the global limit
// allows.
func (ps *Pools) Free() int { return ps.starter.Room() - ps.count() }

// MakeRoom stops one idle pooled sandbox (the oldest) when the global
// limit is reached, to make room for a user's sandbox.
func (ps *Pools) MakeRoom() {
	if ps.Free() > 0 {
		return
	}
	ps.mu.Lock()
	if ps.closed {
		ps.mu.Unlock()
		return // Drain stops every idle sandbox
	}
	var oldest *Idle
	var from *pool
	for _, p := range ps.byName {
		if len(p.idle) > 0 && (oldest == nil || p.idle[0].Started.Before(oldest.Started)) {
			oldest, from = p.idle[0], p
		}
	}
	if from == nil {
		ps.mu.Unlock()
		return
	}
	from.idle = from.idle[1:]
	from.stats.Evicted++
	ps.inflight.Add(1)
	ps.mu.Unlock()
	defer ps.inflight.Done()
	ps.discard(oldest)
}

// discard stops a pooled sandbox and gives up its ownership. The caller
// has taken pd out of the pools and, unless it is Drain, counted the
// stop in inflight.
func (ps *Pools) discard(pd *Idle) {
	ps.starter.StopIdle(pd.ID)
	ps.Release(pd.ID)
}

// DiscardLater gives back a taken sandbox that a create will not make
// live: it is stopped in the background (the create need not wait for
// its stop), and Drain waits for that stop. Once the pools are drained
// it does nothing: Drain stops every taken sandbox itself, so no stop
// starts after Drain has returned. It defends against a create's discard
// outliving the server's shutdown (its runtime Stop finishing after the
// server closed its store and driver: a leaked overlay mount and runc
// container).
func (ps *Pools) DiscardLater(pd *Idle) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed {
		return
	}
	delete(ps.taken, pd.ID)
	ps.discardLocked(pd)
}

// discardLocked discards pd in the background, counted in inflight;
// ps.mu must be held and the pools not drained.
func (ps *Pools) discardLocked(pd *Idle) {
	ps.inflight.Add(1)
	go func() {
		defer ps.inflight.Done()
		ps.discard(pd)
	}()
}

// Release gives up the ownership of a pooled sandbox: a taken one once
// it is live (the reaper sees it as such), or one that was stopped.
func (ps *Pools) Release(id string) {
	ps.mu.Lock()
	delete(ps.ids, id)
	delete(ps.taken, id)
	ps.mu.Unlock()
}

// Refill replaces pooled sandboxes past their idle age, tops every pool
// up to its target within the global limit, and empties pools under
// memory pressure. The manager's watch loop runs it every second and Set
// after each change; a call while another pass runs returns at once, and
// so does every call after Drain. A pass checks Drain before each start
// and stops what it started once the pools are drained.
func (ps *Pools) Refill() {
	ps.mu.Lock()
	if ps.closed {
		ps.mu.Unlock()
		return
	}
	ps.inflight.Add(1)
	ps.mu.Unlock()
	defer ps.inflight.Done()
	if !ps.refilling.TryLock() {
		return
	}
	defer ps.refilling.Unlock()
	now := time.Now()
	pressure := ps.pressure()
	ps.mu.Lock()
	var stale []*Idle
	stoppedOf := map[string]int{} // team -> its pooled sandboxes stopped
	type job struct {
		p *pool
		n int
	}
	var jobs []job
	for _, p := range ps.byName {
		keep := p.idle[:0]
		for _, pd := range p.idle {
			if pressure || now.Sub(pd.Started) > p.cfg.MaxIdle {
				stale = append(stale, pd)
				stoppedOf[p.cfg.Team]++
				p.stats.Evicted++
				if !pressure && p.target > p.cfg.Min {
					p.target-- // unused for its whole idle age: shrink back
				}
				continue
			}
			keep = append(keep, pd)
		}
		p.idle = keep
		if want := p.target - len(p.idle) - p.filling; want > 0 && !pressure {
			jobs = append(jobs, job{p, want})
		}
	}
	ps.mu.Unlock()
	if pressure && len(stale) > 0 {
		// Recorded first, so that whoever sees the sandboxes gone finds why.
		// One event per team, in that team's log: each team sees why
		// its pooled sandboxes went, and how many.
		ps.log.Warn("memory pressure: pools emptied", "stopped", len(stale))
		for team, n := range stoppedOf {
			ps.record(actor.With(context.Background(), actor.Actor{Team: team}), "pool.emptied", map[string]any{"reason": "memory_pressure", "stopped": n})
		}
	}
	for _, pd := range stale {
		ps.discard(pd)
	}
	for _, j := range jobs {
		for i := 0; i < j.n && ps.Free() > 1; i++ {
			ps.mu.Lock()
			if ps.closed {
				ps.mu.Unlock()
				return
			}
			j.p.filling++
			k := key{j.p.cfg.Team, j.p.cfg.Template}
			ps.mu.Unlock()
			t0 := time.Now()
			pd, err := ps.start(k)
			ps.mu.Lock()
			j.p.filling--
			if err == nil {
				if !ps.closed && ps.byName[k] == j.p && len(j.p.idle) < j.p.cfg.Max {
					j.p.idle = append(j.p.idle, pd)
					ms := float64(time.Since(t0).Microseconds()) / 1000
					j.p.stats.Refills++
					j.p.stats.LastRefillMS = ms
					j.p.stats.RefillMSAvg += (ms - j.p.stats.RefillMSAvg) / float64(j.p.stats.Refills)
					pd = nil
				}
			}
			ps.mu.Unlock()
			if errors.Is(err, ErrClosed) {
				return
			}
			if err != nil {
				ps.log.Error("refill pool", "team", k.team, "template", k.template, "err", err)
				break
			}
			if pd != nil { // the pool went away or was drained meanwhile
				ps.discard(pd)
			}
		}
	}
}

// start starts one sandbox of pool k, owned from before the runtime
// starts it.
func (ps *Pools) start(k key) (*Idle, error) {
	var id string
	pd, err := ps.starter.StartIdle(k.team, k.template, func(claimed string) {
		id = claimed
		ps.mu.Lock()
		ps.ids[claimed] = true
		ps.mu.Unlock()
	})
	if err != nil {
		if id != "" {
			ps.Release(id)
		}
		return nil, err
	}
	return pd, nil
}

// Drain stops every pooled sandbox at server shutdown: pooled sandboxes
// have no record and are never adopted by the next start. It defends
// against a refill or a discard outliving the server half-made (a Start
// or Stop in flight finishing after the server closed its store and
// driver, its mounts and processes left to a process about to exit):
// refills stop starting sandboxes, Drain waits for the passes and the
// stops in flight (a pass stops what its last Start made), then stops
// the idle sandboxes and the taken ones no create has made live yet (a
// create still waiting for admission, say, which then gives back
// nothing). Afterwards Take misses, Refill, MakeRoom and DiscardLater do
// nothing: no pooled sandbox is started or stopped after Drain returns.
func (ps *Pools) Drain() {
	ps.mu.Lock()
	ps.closed = true
	ps.mu.Unlock()
	ps.inflight.Wait()
	ps.mu.Lock()
	var all []*Idle
	for _, p := range ps.byName {
		all = append(all, p.idle...)
		p.idle = nil
	}
	for _, pd := range ps.taken {
		all = append(all, pd)
	}
	clear(ps.taken)
	ps.mu.Unlock()
	for _, pd := range all {
		ps.discard(pd)
	}
}

// HostMemoryPressure reports whether the host's available memory is
// below MemoryFloor of its total (from /proc/meminfo).
func HostMemoryPressure() bool {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return false
	}
	defer f.Close()
	frac, ok := availableFraction(f)
	return ok && frac < MemoryFloor
}

// availableFraction reads MemAvailable/MemTotal from /proc/meminfo text;
// ok is false when either is missing.
func availableFraction(r io.Reader) (frac float64, ok bool) {
	var total, avail float64
	var haveAvail bool
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 {
			continue
		}
		v, err := strconv.ParseFloat(fs[1], 64)
		if err != nil {
			continue
		}
		switch fs[0] {
		case "MemTotal:":
			total = v
		case "MemAvailable:":
			avail, haveAvail = v, true
		}
	}
	if total <= 0 || !haveAvail {
		return 0, false
	}
	return avail / total, true
}
