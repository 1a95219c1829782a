package govern

import (
	"container/list"
	"context"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/corralhq/corral/internal/ratelimit"
	"github.com/corralhq/corral/internal/store"
)

// Admission defaults; see [AdmissionConfig].
const (
	// DefaultMaxConcurrent is the default global limit of running sandboxes.
	DefaultMaxConcurrent = 10
	// DefaultMaxPerAgent is the default limit of running sandboxes per agent.
	DefaultMaxPerAgent = 5
	// DefaultAgentRate is the default rate of creates per second per agent.
	DefaultAgentRate = 1.0
	// DefaultAgentBurst is the default burst of creates per agent.
	DefaultAgentBurst = 5
	// DefaultMaxQueue is the default number of creates that may wait.
	DefaultMaxQueue = 100
	// capacityRetryAfter is the Retry-After given when a slot is lacking:
	// when one frees cannot be known, so this is an estimate.
	capacityRetryAfter = time.Second
)

// Ceilings of a team quota's fields ([ValidateQuota]): larger values are
// refused, not clamped, as they can only be mistakes.
const (
	MaxQuotaSandboxes = 1_000_000
	MaxQuotaCPUs      = 1_000_000
	MaxQuotaMemoryMB  = 1 << 40
	MaxQuotaRate      = 1_000_000
	MaxQuotaBurst     = 1_000_000
)

// Values of [CapacityError.Limit]: which limit refused the create.
const (
	// CapacityGlobal: every global sandbox slot is taken.
	CapacityGlobal = "global"
	// CapacityAgent: the agent runs as many sandboxes as it may.
	CapacityAgent = "agent"
	// CapacityAgentRate: the agent creates sandboxes too fast.
	CapacityAgentRate = "agent_rate"
	// CapacityQueue: too many creates are waiting already.
	CapacityQueue = "queue"
	// CapacityTeamSandboxes: the team runs as many sandboxes as its quota
	// allows.
	CapacityTeamSandboxes = "team_sandboxes"
	// CapacityTeamAgent: the agent runs as many sandboxes as its team's
	// per-agent quota allows.
	CapacityTeamAgent = "team_agent"
	// CapacityTeamCPU: the team's running sandboxes and this one would
	// have more CPUs than its quota.
	CapacityTeamCPU = "team_cpu"
	// CapacityTeamMemory: the team's running sandboxes and this one would
	// have more memory than its quota.
	CapacityTeamMemory = "team_memory"
	// CapacityTeamRate: the team creates sandboxes faster than its quota.
	CapacityTeamRate = "team_rate"
)

// TeamQuota is what one team's sandboxes may use together. Zero fields
// set no team limit (the global limits still apply). Paused sandboxes
// count, as they keep their admission slot until they end.
type TeamQuota struct {
	MaxSandboxes int     `json:"max_sandboxes"` // running sandboxes of the team
	MaxPerAgent  int     `json:"max_per_agent"` // running sandboxes per named agent of the team
	MaxCPUs      float64 `json:"max_cpus"`      // sum of resources.cpu of its running sandboxes
	MaxMemoryMB  int64   `json:"max_memory_mb"` // sum of resources.memory_mb of its running sandboxes
	CreateRate   float64 `json:"create_rate"`   // creates per second (token bucket)
	CreateBurst  int     `json:"create_burst"`  // burst of the bucket; 0: the rate rounded up, at least 1
}

// With returns q with the fields o sets replaced.
func (q TeamQuota) With(o store.TeamQuota) TeamQuota {
	if o.MaxSandboxes != nil {
		q.MaxSandboxes = int(*o.MaxSandboxes)
	}
	if o.MaxPerAgent != nil {
		q.MaxPerAgent = int(*o.MaxPerAgent)
	}
	if o.MaxCPUs != nil {
		q.MaxCPUs = *o.MaxCPUs
	}
	if o.MaxMemoryMB != nil {
		q.MaxMemoryMB = *o.MaxMemoryMB
	}
	if o.CreateRate != nil {
		q.CreateRate = *o.CreateRate
	}
	if o.CreateBurst != nil {
		q.CreateBurst = int(*o.CreateBurst)
	}
	return q
}

// burst is the bucket size of a team rate: CreateBurst, or the rate
// rounded up (at least 1) when CreateBurst is 0.
func (q TeamQuota) burst() int {
	if q.CreateBurst > 0 {
		return q.CreateBurst
	}
	return max(1, int(math.Ceil(q.CreateRate)))
}

// ValidateQuota checks a team's quota override: every field it sets is a
// finite number from 0 (no team limit) to its ceiling. The
// *InvalidError names the field as the API spells it.
func ValidateQuota(o store.TeamQuota) error {
	type field struct {
		name string
		v    *float64
		max  float64
	}
	f := func(p *int64) *float64 {
		if p == nil {
			return nil
		}
		v := float64(*p)
		return &v
	}
	for _, c := range []field{
		{"max_sandboxes", f(o.MaxSandboxes), MaxQuotaSandboxes},
		{"max_per_agent", f(o.MaxPerAgent), MaxQuotaSandboxes},
		{"max_cpus", o.MaxCPUs, MaxQuotaCPUs},
		{"max_memory_mb", f(o.MaxMemoryMB), MaxQuotaMemoryMB},
		{"create_rate", o.CreateRate, MaxQuotaRate},
		{"create_burst", f(o.CreateBurst), MaxQuotaBurst},
	} {
		if c.v != nil && (math.IsNaN(*c.v) || *c.v < 0 || *c.v > c.max) {
			return &InvalidError{Msg: fmt.Sprintf("%s must be between 0 (no team limit) and %g, not %g", c.name, c.max, *c.v)}
		}
	}
	return nil
}

// AdmissionConfig sets the limits of an [Admission]. Zero (or negative)
// fields take the defaults, except QueueTimeout, where zero means no wait,
// and Team, whose zero fields set no team limit.
type AdmissionConfig struct {
	MaxConcurrent int // global max running sandboxes; default 10
	// MaxConcurrentNote says why MaxConcurrent is lower than the
	// operator asked (the kernel's key quota); it ends the refusal of a
	// create beyond it.
	MaxConcurrentNote string
	MaxPerAgent       int           // per agent id of a team; default 5
	AgentRate         float64       // creates per second per agent of a team (token bucket); default 1
	AgentBurst        int           // default 5
	QueueTimeout      time.Duration // how long a create may wait for a free slot; 0 = fail at once
	MaxQueue          int           // waiting creates at most (default 100); beyond: fail at once
	// Team is every team's quota unless [Admission.SetTeamQuota] gives a
	// team its own.
	Team TeamQuota
}

func (c AdmissionConfig) withDefaults() AdmissionConfig {
	if c.MaxConcurrent <= 0 {
		c.MaxConcurrent = DefaultMaxConcurrent
	}
	if c.MaxPerAgent <= 0 {
		c.MaxPerAgent = DefaultMaxPerAgent
	}
	if !(c.AgentRate > 0) || math.IsInf(c.AgentRate, 0) {
		c.AgentRate = DefaultAgentRate
	}
	if c.AgentBurst <= 0 {
		c.AgentBurst = DefaultAgentBurst
	}
	c.QueueTimeout = max(c.QueueTimeout, 0)
	if c.MaxQueue <= 0 {
		c.MaxQueue = DefaultMaxQueue
	}
	c.Team.MaxSandboxes = max(c.Team.MaxSandboxes, 0)
	c.Team.MaxPerAgent = max(c.Team.MaxPerAgent, 0)
	if !(c.Team.MaxCPUs > 0) || math.IsInf(c.Team.MaxCPUs, 0) {
		c.Team.MaxCPUs = 0
	}
	c.Team.MaxMemoryMB = max(c.Team.MaxMemoryMB, 0)
	if !(c.Team.CreateRate > 0) || math.IsInf(c.Team.CreateRate, 0) {
		c.Team.CreateRate = 0
	}
	c.Team.CreateBurst = max(c.Team.CreateBurst, 0)
	return c
}

// CapacityError is the refusal of a sandbox create ("capacity_exceeded").
type CapacityError struct {
	Limit      string        // which limit refused: one of the Capacity* constants
	RetryAfter time.Duration // when trying again may succeed
	Msg        string        // human text
}

// Error returns "capacity_exceeded: " followed by the message and the
// Retry-After.
func (e *CapacityError) Error() string {
	return fmt.Sprintf("capacity_exceeded: %s (retry after %v)", e.Msg, e.RetryAfter)
}

// Code returns the error code of a capacity refusal, "capacity_exceeded".
func (e *CapacityError) Code() string { return "capacity_exceeded" }

// AdmissionStats is a snapshot of an [Admission].
type AdmissionStats struct {
	Running int                  // sandboxes admitted and not released, adopted ones included
	Waiting int                  // creates waiting for a slot
	Teams   map[string]TeamStats // per team that has sandboxes or waiting creates
}

// TeamStats is what one team's admitted sandboxes use.
type TeamStats struct {
	Running  int            `json:"running"`
	Waiting  int            `json:"waiting"`
	CPUs     float64        `json:"cpus"`
	MemoryMB int64          `json:"memory_mb"`
	PerAgent map[string]int `json:"-"` // running sandboxes per named agent; agents with none are absent
}

// Request is what a create asks admission for.
type Request struct {
	Team     string  // "" is store.DefaultTeam
	Agent    string  // "" = anonymous: no per-agent limit or rate
	CPUs     float64 // the sandbox's resources.cpu
	MemoryMB int64   // the sandbox's resources.memory_mb
}

// Admission decides whether a new sandbox may start. Per team first: at
// most the team quota's sandboxes, sandboxes per agent, CPUs and memory,
// and creates per second ([TeamQuota]); then globally: at most
// MaxConcurrent run at once, at most MaxPerAgent per agent of a team, and
// each agent of a team creates at most AgentRate per second on average
// (bursts of AgentBurst). Agents are per team: agent "a" of team X is not
// agent "a" of team Y. It is safe for concurrent use.
//
// It defends against a noisy neighbour: one team's flood of creates must
// not take every slot from the others. A create that finds no slot waits
// up to QueueTimeout, in its team's FIFO queue. A released slot goes to
// the waiting team with the fewest sandboxes running (max-min fairness;
// ties to the earliest arrival), and within a team to its first waiter
// that may take it, so no later arrival overtakes an earlier one of its
// team: a waiter held back only by its agent's limit lets those of its
// team behind it pass, a waiter held back by a team quota holds back its
// whole team, one waiting for a global slot waits its team's turn. At most
// MaxQueue creates wait; when the queue is full, a create of a team with
// fewer waiters than the team with the most takes the place of that
// team's newest waiter (refused with "queue"), so one team cannot fill
// the queue either. The rate limits are never waited for: a create over
// a rate is refused at once, with the time until the next token as
// Retry-After. A create that is refused or abandoned gives its tokens
// back, so only admitted creates count against the rates.
type Admission struct {
	cfg AdmissionConfig
	// now and after are the clock and timer, replaced in tests.
	now   func() time.Time
	after func(time.Duration) (<-chan time.Time, func() bool)
	// onWait, if set, is called (with mu held) when a create starts waiting.
	onWait func(agent string)
	// limiter holds the rate tokens of named agents (keyed by team and
	// agent); it has its own lock.
	limiter *ratelimit.Keyed

	mu        sync.Mutex
	running   int
	waiting   int
	seq       uint64                     // arrival counter of waiters
	teams     map[string]*teamState      // every team seen since start
	overrides map[string]store.TeamQuota // teams with their own quota
}

// teamState is what admission keeps of one team. Teams are made by
// admins (API keys), so their number is bounded; their states are kept
// for as long as the server runs, so that a team's rate bucket cannot be
// reset by letting its sandboxes end.
type teamState struct {
	name     string
	quota    TeamQuota
	running  int
	milliCPU int64 // sum of the running sandboxes' CPUs, in thousandths
	memoryMB int64
	perAgent map[string]int
	queue    *list.List       // of *admissionWaiter, first come first
	bucket   *ratelimit.Keyed // the team's create rate; nil without one
}

// admissionWaiter is a create waiting in its team's queue.
type admissionWaiter struct {
	req    Request
	team   *teamState
	seq    uint64
	elem   *list.Element // nil once out of the queue
	ready  chan struct{} // closed when ticket or refused is set
	ticket *Ticket
	// refused is set when a create of another team took the waiter's
	// place in a full queue.
	refused *CapacityError
}

// Ticket is one admitted sandbox; [Ticket.Release] gives its slot back.
type Ticket struct {
	a        *Admission
	team     *teamState
	req      Request
	released bool // guarded by a.mu
}

// NewAdmission returns an admission controller with the given limits; zero
// fields take the defaults.
func NewAdmission(cfg AdmissionConfig) *Admission {
	cfg = cfg.withDefaults()
	return &Admission{
		cfg: cfg,
		now: time.Now,
		after: func(d time.Duration) (<-chan time.Time, func() bool) {
			t := time.NewTimer(d)
			return t.C, t.Stop
		},
		limiter:   ratelimit.New(cfg.AgentRate, cfg.AgentBurst),
		teams:     map[string]*teamState{},
		overrides: map[string]store.TeamQuota{},
	}
}

// Config returns the limits in force, defaults filled in.
func (a *Admission) Config() AdmissionConfig { return a.cfg }

// SetTeamQuota gives team its own quota: the fields o sets replace the
// server's defaults (Config().Team); an o that sets none drops the
// override. It applies to the next create: running sandboxes over a
// lowered quota keep running, and waiters a raised one lets in are
// admitted at once. o must have passed [ValidateQuota].
func (a *Admission) SetTeamQuota(team string, o store.TeamQuota) {
	team = teamOf(team)
	a.mu.Lock()
	defer a.mu.Unlock()
	if o.IsZero() {
		delete(a.overrides, team)
	} else {
		a.overrides[team] = o
	}
	if ts := a.teams[team]; ts != nil {
		a.requota(ts)
		a.serve()
	}
}

// TeamQuota returns the quota in force for team: its override over the
// server's defaults.
func (a *Admission) TeamQuota(team string) TeamQuota {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.quotaOf(teamOf(team))
}

// quotaOf is the quota in force for team. a.mu must be held.
func (a *Admission) quotaOf(team string) TeamQuota {
	return a.cfg.Team.With(a.overrides[team])
}

// requota applies the team's quota in force to its state; a changed rate
// or burst starts the team's bucket anew (full). a.mu must be held.
func (a *Admission) requota(ts *teamState) {
	q := a.quotaOf(ts.name)
	old := ts.quota
	ts.quota = q
	switch {
	case q.CreateRate == 0:
		ts.bucket = nil
	case ts.bucket == nil || old.CreateRate != q.CreateRate || old.burst() != q.burst():
		ts.bucket = ratelimit.New(q.CreateRate, q.burst())
	}
}

// team returns the state of team, made on first use. a.mu must be held.
func (a *Admission) team(name string) *teamState {
	ts := a.teams[name]
	if ts == nil {
		ts = &teamState{name: name, perAgent: map[string]int{}, queue: list.New()}
		a.requota(ts)
		a.teams[name] = ts
	}
	return ts
}

// teamOf is the team of a request: "" is store.DefaultTeam.
func teamOf(team string) string {
	if team == "" {
		return store.DefaultTeam
	}
	return team
}

// tokens are the rate tokens one create took.
type tokens struct{ team, agent ratelimit.Token }

func (t *tokens) giveBack(now time.Time) {
	t.team.Return(now)
	t.agent.Return(now)
}

// Acquire admits one sandbox for req or returns *CapacityError. It waits
// up to QueueTimeout (and ctx) for a slot; the rate limits are never
// waited for, and neither is a sandbox larger than its team's whole CPU
// or memory quota. If ctx ends first, Acquire returns ctx.Err(). The
// caller must Release the ticket when the sandbox is gone (or was never
// started).
func (a *Admission) Acquire(ctx context.Context, req Request) (*Ticket, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	req.Team = teamOf(req.Team)
	a.mu.Lock()
	ts := a.team(req.Team)
	tok, err := a.takeTokens(ts, req)
	if err != nil {
		a.mu.Unlock()
		return nil, err
	}
	if err := ts.neverFits(req); err != nil {
		tok.giveBack(a.now())
		a.mu.Unlock()
		return nil, err
	}
	w := &admissionWaiter{req: req, team: ts, seq: a.seq, ready: make(chan struct{})}
	a.seq++
	w.elem = ts.queue.PushBack(w)
	a.waiting++
	// Every change of the counts serves the queues, so the only waiter
	// this can admit is w: admitting it overtakes nobody.
	a.serve()
	if w.ticket != nil {
		a.mu.Unlock()
		return w.ticket, nil
	}
	if a.cfg.QueueTimeout == 0 {
		err := a.blockedBy(w)
		a.leave(w)
		tok.giveBack(a.now())
		a.mu.Unlock()
		return nil, err
	}
	if a.waiting > a.cfg.MaxQueue && !a.makeRoom(w) {
		err := &CapacityError{
			Limit:      CapacityQueue,
			RetryAfter: capacityRetryAfter,
			Msg:        fmt.Sprintf("%d creates are already waiting for a slot (limit %d; team %q has %d of them)", a.waiting-1, a.cfg.MaxQueue, req.Team, ts.queue.Len()-1),
		}
		a.leave(w)
		tok.giveBack(a.now())
		a.mu.Unlock()
		return nil, err
	}
	if a.onWait != nil {
		a.onWait(req.Agent)
	}
	a.mu.Unlock()

	timeout, stop := a.after(a.cfg.QueueTimeout)
	defer stop()
	var ctxErr error
	select {
	case <-w.ready:
		if w.ticket != nil {
			return w.ticket, nil
		}
		tok.giveBack(a.now())
		return nil, w.refused
	case <-timeout:
	case <-ctx.Done():
		ctxErr = ctx.Err()
	}

	a.mu.Lock()
	switch {
	case w.ticket != nil:
		// Admitted while timing out: a timed-out create keeps its slot;
		// a cancelled one gives it back.
		a.mu.Unlock()
		if ctxErr == nil {
			return w.ticket, nil
		}
		w.ticket.Release()
		tok.giveBack(a.now())
		return nil, ctxErr
	case w.refused != nil:
		a.mu.Unlock()
		tok.giveBack(a.now())
		if ctxErr != nil {
			return nil, ctxErr
		}
		return nil, w.refused
	}
	cerr := a.blockedBy(w)
	a.leave(w)
	tok.giveBack(a.now())
	a.mu.Unlock()
	if ctxErr != nil {
		return nil, ctxErr
	}
	cerr.Msg += fmt.Sprintf(" after waiting %v", a.cfg.QueueTimeout)
	return nil, cerr
}

// takeTokens takes the team's and the agent's rate tokens of a create,
// or returns the rate refusal (team first). a.mu must be held.
func (a *Admission) takeTokens(ts *teamState, req Request) (tokens, error) {
	var tok tokens
	now := a.now()
	if ts.bucket != nil {
		t, wait, ok := ts.bucket.Take("", now)
		if !ok {
			return tok, &CapacityError{
				Limit:      CapacityTeamRate,
				RetryAfter: wait,
				Msg:        fmt.Sprintf("team %q creates sandboxes faster than its quota team_rate of %g per second (burst %d)", ts.name, ts.quota.CreateRate, ts.quota.burst()),
			}
		}
		tok.team = t
	}
	// Anonymous creates ("") are not rate limited per agent.
	if req.Agent != "" {
		t, wait, ok := a.limiter.Take(ts.name+"\x00"+req.Agent, now)
		if !ok {
			tok.giveBack(now)
			return tok, &CapacityError{
				Limit:      CapacityAgentRate,
				RetryAfter: wait,
				Msg:        fmt.Sprintf("agent %q of team %q creates sandboxes faster than %g per second (burst %d)", req.Agent, ts.name, a.cfg.AgentRate, a.cfg.AgentBurst),
			}
		}
		tok.agent = t
	}
	return tok, nil
}

// makeRoom makes room in the full queue for w by refusing the newest
// waiter of the team with the most waiters, if that team has more than
// w's team (w not counted). It reports whether it did. a.mu must be held.
func (a *Admission) makeRoom(w *admissionWaiter) bool {
	var most *teamState
	for _, ts := range a.teams {
		if ts != w.team && (most == nil || ts.queue.Len() > most.queue.Len()) {
			most = ts
		}
	}
	if most == nil || most.queue.Len() <= w.team.queue.Len()-1 {
		return false
	}
	v := most.queue.Back().Value.(*admissionWaiter)
	v.refused = &CapacityError{
		Limit:      CapacityQueue,
		RetryAfter: capacityRetryAfter,
		Msg:        fmt.Sprintf("the wait queue is full (limit %d) and team %q has the most creates waiting (%d): this one gave its place to another team", a.cfg.MaxQueue, most.name, most.queue.Len()),
	}
	a.leave(v)
	close(v.ready)
	return true
}

// leave takes w out of its team's queue; those behind it may now fit.
// a.mu must be held.
func (a *Admission) leave(w *admissionWaiter) {
	if w.elem == nil {
		return
	}
	w.team.queue.Remove(w.elem)
	w.elem = nil
	a.waiting--
	a.serve()
}

// Adopt counts a sandbox that already runs, as found when the server
// restarts. It is never refused, takes no rate token, and may leave the
// counts above the limits and quotas; creates then wait until enough are
// released.
func (a *Admission) Adopt(req Request) *Ticket {
	req.Team = teamOf(req.Team)
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.admit(a.team(req.Team), req)
}

// Stats returns the current counts.
func (a *Admission) Stats() AdmissionStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := AdmissionStats{Running: a.running, Waiting: a.waiting, Teams: map[string]TeamStats{}}
	for name, ts := range a.teams {
		if ts.running == 0 && ts.queue.Len() == 0 {
			continue
		}
		st.Teams[name] = ts.stats()
	}
	return st
}

// TeamStats returns the counts of one team (zero if it has nothing).
func (a *Admission) TeamStats(team string) TeamStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ts := a.teams[teamOf(team)]; ts != nil {
		return ts.stats()
	}
	return TeamStats{PerAgent: map[string]int{}}
}

// Teams returns the teams that have sandboxes or waiting creates, sorted.
func (a *Admission) Teams() []string {
	st := a.Stats()
	out := make([]string, 0, len(st.Teams))
	for name := range st.Teams {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// stats is the team's counts. a.mu must be held.
func (ts *teamState) stats() TeamStats {
	per := make(map[string]int, len(ts.perAgent))
	for k, v := range ts.perAgent {
		per[k] = v
	}
	return TeamStats{Running: ts.running, Waiting: ts.queue.Len(), CPUs: float64(ts.milliCPU) / 1000, MemoryMB: ts.memoryMB, PerAgent: per}
}

// Release gives the ticket's slot (and its team's CPUs and memory) back,
// to the waiter that may take it. Releasing twice, or a nil ticket, does
// nothing.
func (t *Ticket) Release() {
	if t == nil {
		return
	}
	a := t.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if t.released {
		return
	}
	t.released = true
	ts := t.team
	a.running--
	ts.running--
	ts.milliCPU -= milli(t.req.CPUs)
	ts.memoryMB -= t.req.MemoryMB
	if n := ts.perAgent[t.req.Agent] - 1; n > 0 {
		ts.perAgent[t.req.Agent] = n
	} else {
		delete(ts.perAgent, t.req.Agent)
	}
	a.serve()
}

// Agent returns the agent the ticket was admitted for.
func (t *Ticket) Agent() string { return t.req.Agent }

// Team returns the team the ticket was admitted for.
func (t *Ticket) Team() string { return t.req.Team }

// milli is a number of CPUs in thousandths, so that sums are exact.
func milli(cpus float64) int64 { return int64(math.Round(cpus * 1000)) }

// admit counts one more sandbox of req. a.mu must be held.
func (a *Admission) admit(ts *teamState, req Request) *Ticket {
	a.running++
	ts.running++
	ts.milliCPU += milli(req.CPUs)
	ts.memoryMB += req.MemoryMB
	ts.perAgent[req.Agent]++
	return &Ticket{a: a, team: ts, req: req}
}

// teamLimit is the team quota (sandboxes, CPUs, memory) that keeps req
// from starting now, or nil. ts.quota is the quota in force.
func (ts *teamState) teamLimit(req Request) *CapacityError {
	q := ts.quota
	switch {
	case q.MaxSandboxes > 0 && ts.running >= q.MaxSandboxes:
		return &CapacityError{Limit: CapacityTeamSandboxes, RetryAfter: capacityRetryAfter,
			Msg: fmt.Sprintf("team %q runs %d sandboxes (quota team_sandboxes %d)", ts.name, ts.running, q.MaxSandboxes)}
	case q.MaxCPUs > 0 && ts.milliCPU+milli(req.CPUs) > milli(q.MaxCPUs):
		return &CapacityError{Limit: CapacityTeamCPU, RetryAfter: capacityRetryAfter,
			Msg: fmt.Sprintf("team %q runs sandboxes of %g CPUs; with this one's %g it would exceed its quota team_cpu of %g", ts.name, float64(ts.milliCPU)/1000, req.CPUs, q.MaxCPUs)}
	case q.MaxMemoryMB > 0 && ts.memoryMB+req.MemoryMB > q.MaxMemoryMB:
		return &CapacityError{Limit: CapacityTeamMemory, RetryAfter: capacityRetryAfter,
			Msg: fmt.Sprintf("team %q runs sandboxes of %d MiB; with this one's %d MiB it would exceed its quota team_memory of %d MiB", ts.name, ts.memoryMB, req.MemoryMB, q.MaxMemoryMB)}
	}
	return nil
}

// neverFits refuses a sandbox larger than its team's whole CPU or memory
// quota: waiting for it is pointless.
func (ts *teamState) neverFits(req Request) *CapacityError {
	empty := &teamState{name: ts.name, quota: ts.quota}
	if err := empty.teamLimit(req); err != nil {
		err.Msg += " even with none running"
		return err
	}
	return nil
}

// agentLimit is the per-agent limit (the team's or the global one,
// whichever is lower) that keeps req from starting now, or nil. Sandboxes
// without an agent name ("") have no per-agent limit.
func (a *Admission) agentLimit(ts *teamState, req Request) *CapacityError {
	if req.Agent == "" {
		return nil
	}
	n := ts.perAgent[req.Agent]
	if q := ts.quota.MaxPerAgent; q > 0 && q <= a.cfg.MaxPerAgent && n >= q {
		return &CapacityError{Limit: CapacityTeamAgent, RetryAfter: capacityRetryAfter,
			Msg: fmt.Sprintf("agent %q of team %q runs %d sandboxes (quota team_agent %d per agent)", req.Agent, ts.name, n, q)}
	}
	if n >= a.cfg.MaxPerAgent {
		return &CapacityError{Limit: CapacityAgent, RetryAfter: capacityRetryAfter,
			Msg: fmt.Sprintf("agent %q of team %q runs %d sandboxes (limit %d)", req.Agent, ts.name, n, a.cfg.MaxPerAgent)}
	}
	return nil
}

// candidate is the waiter of ts that a free global slot would admit: its
// first waiter within the team's quota and its agent's limit. A waiter
// over its agent's limit is passed over; one over a team quota holds back
// the rest of its team (FIFO within the team). a.mu must be held.
func (a *Admission) candidate(ts *teamState) *admissionWaiter {
	for e := ts.queue.Front(); e != nil; e = e.Next() {
		w := e.Value.(*admissionWaiter)
		if ts.teamLimit(w.req) != nil {
			return nil
		}
		if a.agentLimit(ts, w.req) == nil {
			return w
		}
	}
	return nil
}

// serve hands free global slots to waiters: each to the candidate of the
// team with the fewest sandboxes running, the earliest arrival on a tie.
// a.mu must be held.
func (a *Admission) serve() {
	for a.running < a.cfg.MaxConcurrent && a.waiting > 0 {
		var best *admissionWaiter
		for _, ts := range a.teams {
			w := a.candidate(ts)
			if w == nil {
				continue
			}
			if best == nil || ts.running < best.team.running || (ts.running == best.team.running && w.seq < best.seq) {
				best = w
			}
		}
		if best == nil {
			return
		}
		best.team.queue.Remove(best.elem)
		best.elem = nil
		a.waiting--
		best.ticket = a.admit(best.team, best.req)
		close(best.ready)
	}
}

// blockedBy describes the limit that keeps the waiter w from a slot now:
// its team's quotas first, then its agent's limit, then the global one.
// a.mu must be held and w in its queue.
func (a *Admission) blockedBy(w *admissionWaiter) *CapacityError {
	ts := w.team
	if err := ts.teamLimit(w.req); err != nil {
		return err
	}
	for e := ts.queue.Front(); e != nil && e != w.elem; e = e.Next() {
		if err := ts.teamLimit(e.Value.(*admissionWaiter).req); err != nil {
			err.Msg = "behind an earlier create of its team: " + err.Msg
			return err
		}
	}
	if err := a.agentLimit(ts, w.req); err != nil {
		return err
	}
	return &CapacityError{
		Limit:      CapacityGlobal,
		RetryAfter: capacityRetryAfter,
		Msg:        fmt.Sprintf("all %d sandbox slots are in use", a.cfg.MaxConcurrent) + noteSuffix(a.cfg.MaxConcurrentNote),
	}
}

// noteSuffix is note as the end of a message: " (note)", or "".
func noteSuffix(note string) string {
	if note == "" {
		return ""
	}
	return " (" + note + ")"
}
