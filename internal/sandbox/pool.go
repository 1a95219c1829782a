package sandbox

import (
	"bufio"
	"context"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/store"
)

// Pool limits and defaults.
const (
	// MaxPoolSize bounds a pool's max.
	MaxPoolSize = 100
	// DefaultPoolMaxIdle is how long a pooled sandbox may wait before it
	// is replaced by a fresh one.
	DefaultPoolMaxIdle = 30 * time.Minute
	// PoolMemoryFloor: below this fraction of available host memory pools
	// stop refilling and give back their idle sandboxes.
	PoolMemoryFloor = 0.10
)

// PoolConfig is the warm pool of one template: idle sandboxes started
// ahead of time with the template's defaults (tier light, runc, no
// network), each handed to exactly one create and never reused.
type PoolConfig struct {
	Template string        `json:"template"`
	Min      int           `json:"min"`      // idle sandboxes kept ready
	Max      int           `json:"max"`      // idle sandboxes at most (the target grows to it on misses)
	MaxIdle  time.Duration `json:"max_idle"` // a pooled sandbox older than this is replaced
}

// PoolStats describes one pool.
type PoolStats struct {
	PoolConfig
	Idle         int     `json:"idle"`
	Target       int     `json:"target"`
	Hits         int64   `json:"hits"`
	Misses       int64   `json:"misses"`
	Refills      int64   `json:"refills"`
	RefillMSAvg  float64 `json:"refill_ms_avg"`
	Evicted      int64   `json:"evicted"`
	LastRefillMS float64 `json:"last_refill_ms"`
}

// pooled is one idle sandbox: started, not recorded, not listed.
type pooled struct {
	id, token string
	rec       *store.Sandbox
	started   time.Time
}

type pool struct {
	cfg     PoolConfig
	target  int
	idle    []*pooled
	filling int
	stats   PoolStats
}

// pools holds the warm pools; guarded by its mutex.
type pools struct {
	mu     sync.Mutex
	byName map[string]*pool
	// ids are the sandboxes the pools own (idle or starting), which the
	// reaper must leave alone.
	ids map[string]bool
	// refilling keeps one refill pass at a time.
	refilling sync.Mutex
}

// isPooled reports whether id is a sandbox a pool owns.
func (m *Manager) isPooled(id string) bool {
	m.pools.mu.Lock()
	defer m.pools.mu.Unlock()
	return m.pools.ids[id]
}

var noPolicy = egress.Policy{Mode: egress.ModeNone}

// poolable reports whether a create request can be served by a pooled
// sandbox: template defaults only (no env, network, secrets, snapshot,
// runtime, tier or resources other than the defaults). TTL, metadata,
// task, agent and command timeout are applied when it is taken.
func poolable(req *CreateRequest) bool {
	return len(req.Env) == 0 && (req.Network == "" || req.Network == "none") && len(req.Allow) == 0 &&
		len(req.Secrets) == 0 && req.Snapshot == "" && (req.Runtime == "" || req.Runtime == string(runtime.Runc)) &&
		(req.Tier == "" || req.Tier == DefaultTier) && req.Resources == nil && len(req.Volumes) == 0
}

// SetPool creates or changes the pool of a template (min 0 and max 0
// removes it, killing its idle sandboxes).
func (m *Manager) SetPool(ctx context.Context, c PoolConfig) (PoolStats, error) {
	if c.Template == "" {
		c.Template = m.cfg.DefaultTemplate
	}
	if !templateNameRe.MatchString(c.Template) || strings.HasPrefix(c.Template, SnapshotPrefix) {
		return PoolStats{}, invalid("template %q is not a valid template name", c.Template)
	}
	if _, err := m.resolveTemplate(ctx, c.Template); err != nil {
		return PoolStats{}, err
	}
	if c.Max == 0 {
		c.Max = c.Min
	}
	if c.Min < 0 || c.Max < c.Min || c.Max > MaxPoolSize {
		return PoolStats{}, invalid("pool sizes must satisfy 0 <= min <= max <= %d", MaxPoolSize)
	}
	if c.MaxIdle == 0 {
		c.MaxIdle = DefaultPoolMaxIdle
	}
	if c.MaxIdle < time.Minute || c.MaxIdle > 24*time.Hour {
		return PoolStats{}, invalid("max idle age must be between 1m and 24h")
	}
	if err := m.store.PutPool(ctx, c.Template, c.Min, c.Max, int64(c.MaxIdle/time.Second)); err != nil {
		return PoolStats{}, err
	}
	m.pools.mu.Lock()
	p := m.pools.byName[c.Template]
	if p == nil {
		p = &pool{}
		m.pools.byName[c.Template] = p
	}
	p.cfg = c
	p.target = max(c.Min, min(p.target, c.Max))
	var drop []*pooled
	for len(p.idle) > c.Max {
		drop = append(drop, p.idle[0])
		p.idle = p.idle[1:]
	}
	st := p.statsLocked()
	if c.Max == 0 {
		delete(m.pools.byName, c.Template)
	}
	m.pools.mu.Unlock()
	for _, d := range drop {
		m.stopPooled(d)
	}
	m.audit("", "pool.set", map[string]any{"template": c.Template, "min": c.Min, "max": c.Max, "max_idle_s": int64(c.MaxIdle / time.Second)})
	go m.RefillPools()
	return st, nil
}

// Pools returns every pool's configuration and counters.
func (m *Manager) Pools() []PoolStats {
	m.pools.mu.Lock()
	defer m.pools.mu.Unlock()
	out := make([]PoolStats, 0, len(m.pools.byName))
	for _, p := range m.pools.byName {
		out = append(out, p.statsLocked())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Template < out[j].Template })
	return out
}

func (p *pool) statsLocked() PoolStats {
	s := p.stats
	s.PoolConfig, s.Idle, s.Target = p.cfg, len(p.idle), p.target
	return s
}

// loadPools reads the pools' configuration from the store (at start).
func (m *Manager) loadPools(ctx context.Context) {
	list, err := m.store.ListPools(ctx)
	if err != nil {
		m.log.Error("load pools", "err", err)
		return
	}
	m.pools.mu.Lock()
	for _, c := range list {
		m.pools.byName[c.Template] = &pool{cfg: PoolConfig{Template: c.Template, Min: c.Min, Max: c.Max,
			MaxIdle: time.Duration(c.MaxIdleS) * time.Second}, target: c.Min}
	}
	m.pools.mu.Unlock()
}

// takePooled hands out an idle pooled sandbox of template, if any, that
// runs version (the template's current version; older ones are dropped).
// On a miss the pool's target grows (up to its max).
func (m *Manager) takePooled(template, version string) *pooled {
	m.pools.mu.Lock()
	defer m.pools.mu.Unlock()
	p := m.pools.byName[template]
	if p == nil {
		return nil
	}
	for len(p.idle) > 0 {
		pd := p.idle[0]
		p.idle = p.idle[1:]
		if pd.rec.TemplateVersion == version && m.driver.Alive(pd.id) {
			// It stays in ids (the reaper leaves it alone) until the
			// create has made it live (unpool) or given it up (stopPooled).
			p.stats.Hits++
			return pd
		}
		go m.stopPooled(pd)
	}
	p.stats.Misses++
	p.target = min(p.target+1, p.cfg.Max)
	return nil
}

// idleCount is the number of pooled sandboxes (idle or being started).
func (m *Manager) idleCount() int {
	m.pools.mu.Lock()
	defer m.pools.mu.Unlock()
	n := 0
	for _, p := range m.pools.byName {
		n += len(p.idle) + p.filling
	}
	return n
}

// evictOne stops one idle pooled sandbox (the oldest) to make room for a
// user's sandbox; it reports whether there was one.
func (m *Manager) evictOne() bool {
	m.pools.mu.Lock()
	var oldest *pooled
	var from *pool
	for _, p := range m.pools.byName {
		if len(p.idle) > 0 && (oldest == nil || p.idle[0].started.Before(oldest.started)) {
			oldest, from = p.idle[0], p
		}
	}
	if from != nil {
		from.idle = from.idle[1:]
		from.stats.Evicted++
	}
	m.pools.mu.Unlock()
	if oldest == nil {
		return false
	}
	m.stopPooled(oldest)
	return true
}

func (m *Manager) stopPooled(pd *pooled) {
	if err := m.driver.Stop(context.Background(), pd.id, 0); err != nil {
		m.log.Error("stop pooled sandbox", "id", pd.id, "err", err)
	}
	m.pools.mu.Lock()
	delete(m.pools.ids, pd.id)
	m.pools.mu.Unlock()
}

// unpool drops a taken pooled sandbox from the pools' ids once it is live.
func (m *Manager) unpool(id string) {
	m.pools.mu.Lock()
	delete(m.pools.ids, id)
	m.pools.mu.Unlock()
}

// capacityLeft is how many more sandboxes (user or pooled) the global
// limit allows.
func (m *Manager) capacityLeft() int {
	m.mu.Lock()
	n := len(m.live)
	m.mu.Unlock()
	return m.cfg.Admission.Config().MaxConcurrent - n - m.idleCount()
}

// RefillPools replaces pooled sandboxes past their idle age, tops every
// pool up to its target within the global limit, and empties pools under
// memory pressure. The watch loop runs it every second and SetPool after
// each change; a call while another pass runs returns at once.
func (m *Manager) RefillPools() {
	if !m.pools.refilling.TryLock() {
		return
	}
	defer m.pools.refilling.Unlock()
	now := time.Now()
	pressure := m.memoryPressure()
	m.pools.mu.Lock()
	var stale []*pooled
	type job struct {
		p *pool
		n int
	}
	var jobs []job
	for _, p := range m.pools.byName {
		keep := p.idle[:0]
		for _, pd := range p.idle {
			if pressure || now.Sub(pd.started) > p.cfg.MaxIdle {
				stale = append(stale, pd)
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
	m.pools.mu.Unlock()
	if pressure && len(stale) > 0 {
		// Recorded first, so that whoever sees the sandboxes gone finds why.
		m.log.Warn("memory pressure: pools emptied", "stopped", len(stale))
		m.audit("", "pool.emptied", map[string]any{"reason": "memory_pressure", "stopped": len(stale)})
	}
	for _, pd := range stale {
		m.stopPooled(pd)
	}
	for _, j := range jobs {
		for i := 0; i < j.n && m.capacityLeft() > 1; i++ {
			m.pools.mu.Lock()
			j.p.filling++
			tmpl := j.p.cfg.Template
			m.pools.mu.Unlock()
			t0 := time.Now()
			pd, err := m.startPooled(tmpl)
			m.pools.mu.Lock()
			j.p.filling--
			if err == nil {
				if m.pools.byName[tmpl] == j.p && len(j.p.idle) < j.p.cfg.Max {
					j.p.idle = append(j.p.idle, pd)
					ms := float64(time.Since(t0).Microseconds()) / 1000
					j.p.stats.Refills++
					j.p.stats.LastRefillMS = ms
					j.p.stats.RefillMSAvg += (ms - j.p.stats.RefillMSAvg) / float64(j.p.stats.Refills)
					pd = nil
				}
			}
			m.pools.mu.Unlock()
			if err != nil {
				m.log.Error("refill pool", "template", tmpl, "err", err)
				break
			}
			if pd != nil { // the pool went away meanwhile
				m.stopPooled(pd)
			}
		}
	}
}

// startPooled starts one sandbox with the template's defaults, without a
// record: it gets one when a create takes it.
func (m *Manager) startPooled(template string) (*pooled, error) {
	req := CreateRequest{Template: template}
	rec, rc, err := m.validateBase(&req)
	if err != nil {
		return nil, err
	}
	if err := m.prepareNetwork(rec, &rc, noPolicy, nil); err != nil {
		return nil, err
	}
	m.pools.mu.Lock()
	m.pools.ids[rec.ID] = true
	m.pools.mu.Unlock()
	if _, err := m.driver.Start(context.Background(), rc); err != nil {
		m.pools.mu.Lock()
		delete(m.pools.ids, rec.ID)
		m.pools.mu.Unlock()
		return nil, err
	}
	return &pooled{id: rec.ID, token: rec.AccessToken, rec: rec, started: time.Now()}, nil
}

// drainPools stops every idle pooled sandbox (server shutdown).
func (m *Manager) drainPools() {
	m.pools.mu.Lock()
	var all []*pooled
	for _, p := range m.pools.byName {
		all = append(all, p.idle...)
		p.idle = nil
	}
	m.pools.mu.Unlock()
	for _, pd := range all {
		m.stopPooled(pd)
	}
}

// memoryPressure reports whether warm pools must give memory back:
// Config.MemoryPressure, or hostMemoryPressure.
func (m *Manager) memoryPressure() bool {
	if f := m.cfg.MemoryPressure; f != nil {
		return f()
	}
	return hostMemoryPressure()
}

// hostMemoryPressure reports whether the host's available memory is below
// PoolMemoryFloor of its total (from /proc/meminfo).
func hostMemoryPressure() bool {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return false
	}
	defer f.Close()
	frac, ok := availableFraction(f)
	return ok && frac < PoolMemoryFloor
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
