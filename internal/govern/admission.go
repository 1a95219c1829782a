package govern

import (
	"container/list"
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/corralhq/corral/internal/ratelimit"
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
)

// AdmissionConfig sets the limits of an [Admission]. Zero (or negative)
// fields take the defaults, except QueueTimeout, where zero means no wait.
type AdmissionConfig struct {
	MaxConcurrent int           // global max running sandboxes; default 10
	MaxPerAgent   int           // per agent id; default 5
	AgentRate     float64       // creates per second per agent (token bucket); default 1
	AgentBurst    int           // default 5
	QueueTimeout  time.Duration // how long a create may wait for a free slot; 0 = fail at once
	MaxQueue      int           // waiting creates at most (default 100); beyond: fail at once
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
	return c
}

// CapacityError is the refusal of a sandbox create ("capacity_exceeded").
type CapacityError struct {
	Limit      string        // "global", "agent", "agent_rate" or "queue" (the Capacity* constants)
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
	Running  int            // sandboxes admitted and not released, adopted ones included
	PerAgent map[string]int // running sandboxes per agent ("" = anonymous); agents with none are absent
	Waiting  int            // creates waiting for a slot
}

// Admission decides whether a new sandbox may start: at most MaxConcurrent
// run at once, at most MaxPerAgent per agent, and each agent creates at
// most AgentRate per second on average (bursts of AgentBurst). It is safe
// for concurrent use.
//
// A create that finds no slot waits up to QueueTimeout in one FIFO queue of
// at most MaxQueue waiters. A released slot goes straight to the first
// waiter that may take it, so no later arrival can overtake a waiter: a
// waiter held back only by its own agent's limit lets those behind it
// (other agents) pass, but one waiting for a global slot holds back
// everyone behind it. The rate limit is never waited for: an agent over
// its rate is refused at once, with the time until its next token as
// Retry-After. A create that is refused or abandoned gives its rate token
// back, so only admitted creates count against the rate.
type Admission struct {
	cfg AdmissionConfig
	// now and after are the clock and timer, replaced in tests.
	now   func() time.Time
	after func(time.Duration) (<-chan time.Time, func() bool)
	// onWait, if set, is called (with mu held) when a create starts waiting.
	onWait func(agent string)
	// limiter holds the rate tokens of named agents; it has its own lock.
	limiter *ratelimit.Keyed

	mu       sync.Mutex
	running  int
	perAgent map[string]int
	queue    *list.List // of *admissionWaiter, first come first
}

// admissionWaiter is a create waiting in the queue.
type admissionWaiter struct {
	agent  string
	elem   *list.Element // nil once out of the queue
	ready  chan struct{} // closed when ticket is set
	ticket *Ticket
}

// Ticket is one admitted sandbox; [Ticket.Release] gives its slot back.
type Ticket struct {
	a        *Admission
	agent    string
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
		limiter:  ratelimit.New(cfg.AgentRate, cfg.AgentBurst),
		perAgent: map[string]int{},
		queue:    list.New(),
	}
}

// Config returns the limits in force, defaults filled in.
func (a *Admission) Config() AdmissionConfig { return a.cfg }

// Acquire admits one sandbox for agent ("" = anonymous: only the global
// limit applies)
// or returns *CapacityError. It waits up to QueueTimeout (and ctx) for a
// global or per-agent slot; the rate limit is never waited for. If ctx ends
// first, Acquire returns ctx.Err(). The caller must Release the ticket when
// the sandbox is gone (or was never started).
func (a *Admission) Acquire(ctx context.Context, agent string) (*Ticket, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	a.mu.Lock()
	tok, wait, ok := a.takeToken(agent)
	if !ok {
		a.mu.Unlock()
		return nil, &CapacityError{
			Limit:      CapacityAgentRate,
			RetryAfter: wait,
			Msg:        fmt.Sprintf("agent %q creates sandboxes faster than %g per second (burst %d)", agent, a.cfg.AgentRate, a.cfg.AgentBurst),
		}
	}
	// After every release the queue is served, so no waiter could take a
	// free slot now: admitting at once overtakes nobody.
	if a.fits(agent) {
		t := a.admit(agent)
		a.mu.Unlock()
		return t, nil
	}
	if a.cfg.QueueTimeout == 0 || a.queue.Len() >= a.cfg.MaxQueue {
		var err *CapacityError
		if a.cfg.QueueTimeout == 0 {
			err = a.slotError(agent)
		} else {
			err = &CapacityError{
				Limit:      CapacityQueue,
				RetryAfter: capacityRetryAfter,
				Msg:        fmt.Sprintf("%d creates are already waiting for a slot (limit %d)", a.queue.Len(), a.cfg.MaxQueue),
			}
		}
		tok.Return(a.now())
		a.mu.Unlock()
		return nil, err
	}
	w := &admissionWaiter{agent: agent, ready: make(chan struct{})}
	w.elem = a.queue.PushBack(w)
	if a.onWait != nil {
		a.onWait(agent)
	}
	a.mu.Unlock()

	timeout, stop := a.after(a.cfg.QueueTimeout)
	defer stop()
	var ctxErr error
	select {
	case <-w.ready:
		return w.ticket, nil
	case <-timeout:
	case <-ctx.Done():
		ctxErr = ctx.Err()
	}

	a.mu.Lock()
	if w.ticket != nil {
		// Admitted while timing out: a timed-out create keeps its slot;
		// a cancelled one gives it back.
		a.mu.Unlock()
		if ctxErr == nil {
			return w.ticket, nil
		}
		w.ticket.Release()
		tok.Return(a.now())
		return nil, ctxErr
	}
	a.queue.Remove(w.elem)
	w.elem = nil
	tok.Return(a.now())
	err := a.slotError(agent)
	a.mu.Unlock()
	if ctxErr != nil {
		return nil, ctxErr
	}
	err.Msg += fmt.Sprintf(" after waiting %v", a.cfg.QueueTimeout)
	return nil, err
}

// Adopt counts a sandbox that already runs, as found when the server
// restarts. It is never refused, takes no rate token, and may leave the
// counts above the limits; creates then wait until enough are released.
func (a *Admission) Adopt(agent string) *Ticket {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.admit(agent)
}

// Stats returns the current counts.
func (a *Admission) Stats() AdmissionStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	per := make(map[string]int, len(a.perAgent))
	for k, v := range a.perAgent {
		per[k] = v
	}
	return AdmissionStats{Running: a.running, PerAgent: per, Waiting: a.queue.Len()}
}

// Release gives the ticket's slot back, to the first waiter that may take
// it. Releasing twice, or a nil ticket, does nothing.
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
	a.running--
	if n := a.perAgent[t.agent] - 1; n > 0 {
		a.perAgent[t.agent] = n
	} else {
		delete(a.perAgent, t.agent)
	}
	a.serve()
}

// Agent returns the agent the ticket was admitted for.
func (t *Ticket) Agent() string { return t.agent }

// fits reports whether a sandbox of agent fits under both limits.
// Sandboxes without an agent name ("") count only against the global
// limit: the per-agent limit and rate apply to named agents.
func (a *Admission) fits(agent string) bool {
	return a.running < a.cfg.MaxConcurrent && (agent == "" || a.perAgent[agent] < a.cfg.MaxPerAgent)
}

// admit counts one more sandbox of agent.
func (a *Admission) admit(agent string) *Ticket {
	a.running++
	a.perAgent[agent]++
	return &Ticket{a: a, agent: agent}
}

// serve hands free slots to waiters in FIFO order. A waiter held back by
// its agent's limit is passed over; once the global slots are gone nobody
// further back is served.
func (a *Admission) serve() {
	for e := a.queue.Front(); e != nil && a.running < a.cfg.MaxConcurrent; {
		next := e.Next()
		w := e.Value.(*admissionWaiter)
		if a.perAgent[w.agent] < a.cfg.MaxPerAgent {
			a.queue.Remove(e)
			w.elem = nil
			w.ticket = a.admit(w.agent)
			close(w.ready)
		}
		e = next
	}
}

// slotError describes the limit that keeps agent from a slot now.
func (a *Admission) slotError(agent string) *CapacityError {
	if a.running >= a.cfg.MaxConcurrent {
		return &CapacityError{
			Limit:      CapacityGlobal,
			RetryAfter: capacityRetryAfter,
			Msg:        fmt.Sprintf("all %d sandbox slots are in use", a.cfg.MaxConcurrent),
		}
	}
	return &CapacityError{
		Limit:      CapacityAgent,
		RetryAfter: capacityRetryAfter,
		Msg:        fmt.Sprintf("agent %q runs %d sandboxes (limit %d)", agent, a.perAgent[agent], a.cfg.MaxPerAgent),
	}
}

// takeToken takes a rate token of agent, or returns how long until one is
// available. Anonymous creates ("") are not rate limited: their token is
// the zero Token.
func (a *Admission) takeToken(agent string) (ratelimit.Token, time.Duration, bool) {
	if agent == "" {
		return ratelimit.Token{}, 0, true
	}
	return a.limiter.Take(agent, a.now())
}
