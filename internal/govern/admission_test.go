package govern

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/store"
)

// fakeClock is a clock that moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// testAdmission is an Admission with a fake clock, queue timeouts that
// fire only when the test closes timeout, and waits reported on waits.
type testAdmission struct {
	*Admission
	clock   *fakeClock
	timeout chan time.Time // closing it times out every waiter
	waits   chan string    // agent of each create that starts waiting
}

func newTestAdmission(cfg AdmissionConfig) *testAdmission {
	ta := &testAdmission{
		Admission: NewAdmission(cfg),
		clock:     &fakeClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)},
		timeout:   make(chan time.Time),
		waits:     make(chan string, 1000),
	}
	ta.now = ta.clock.Now
	ta.after = func(time.Duration) (<-chan time.Time, func() bool) { return ta.timeout, func() bool { return true } }
	ta.onWait = func(agent string) { ta.waits <- agent }
	return ta
}

// acquireAsync starts an Acquire and returns its result channel once the
// create waits in the queue.
func (ta *testAdmission) acquireAsync(t *testing.T, ctx context.Context, agent string) <-chan acquired {
	t.Helper()
	return ta.acquireAsyncReq(t, ctx, Request{Agent: agent})
}

// acquireAsyncReq is acquireAsync for a whole Request.
func (ta *testAdmission) acquireAsyncReq(t *testing.T, ctx context.Context, req Request) <-chan acquired {
	t.Helper()
	ch := make(chan acquired, 1)
	go func() {
		tk, err := ta.Acquire(ctx, req)
		ch <- acquired{tk, err}
	}()
	select {
	case got := <-ta.waits:
		if got != req.Agent {
			t.Fatalf("waiting create is for %q, want %q", got, req.Agent)
		}
	case r := <-ch:
		t.Fatalf("create %+v did not wait: %v %v", req, r.t, r.err)
	}
	return ch
}

type acquired struct {
	t   *Ticket
	err error
}

// mustAcquire acquires at once or fails the test.
func mustAcquire(t *testing.T, a *testAdmission, agent string) *Ticket {
	t.Helper()
	tk, err := a.Acquire(context.Background(), Request{Agent: agent})
	if err != nil {
		t.Fatalf("Acquire(%q): %v", agent, err)
	}
	return tk
}

// capLimit returns the Limit of a *CapacityError, or the error text.
func capLimit(err error) string {
	var ce *CapacityError
	if errors.As(err, &ce) {
		return ce.Limit
	}
	if err == nil {
		return ""
	}
	return "not a CapacityError: " + err.Error()
}

func TestAdmissionConfigDefaults(t *testing.T) {
	defaults := AdmissionConfig{MaxConcurrent: 10, MaxPerAgent: 5, AgentRate: 1, AgentBurst: 5, MaxQueue: 100}
	for _, tc := range []struct {
		in, want AdmissionConfig
	}{
		{AdmissionConfig{}, defaults},
		{AdmissionConfig{MaxConcurrent: -1, MaxPerAgent: -1, AgentRate: -1, AgentBurst: -1, QueueTimeout: -time.Second, MaxQueue: -1}, defaults},
		{
			AdmissionConfig{MaxConcurrent: 3, MaxPerAgent: 2, AgentRate: 0.5, AgentBurst: 1, QueueTimeout: time.Minute, MaxQueue: 7},
			AdmissionConfig{MaxConcurrent: 3, MaxPerAgent: 2, AgentRate: 0.5, AgentBurst: 1, QueueTimeout: time.Minute, MaxQueue: 7},
		},
	} {
		if got := NewAdmission(tc.in).Config(); got != tc.want {
			t.Errorf("NewAdmission(%+v).Config() = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

// TestAdmissionLimits runs sequences of creates and releases without
// waiting (QueueTimeout 0): each step acquires for an agent, expecting
// success or the named limit, or releases the ticket of an earlier step.
func TestAdmissionLimits(t *testing.T) {
	type step struct {
		agent   string
		release int    // if > 0: release the ticket of this (1-based) step instead
		want    string // "" = admitted, else CapacityError.Limit
	}
	for _, tc := range []struct {
		name    string
		cfg     AdmissionConfig
		steps   []step
		running int
	}{
		{
			name: "global limit",
			cfg:  AdmissionConfig{MaxConcurrent: 2},
			steps: []step{
				{agent: "a"}, {agent: "b"}, {agent: "c", want: CapacityGlobal},
				{release: 1}, {agent: "c"}, {agent: "a", want: CapacityGlobal},
			},
			running: 2,
		},
		{
			name: "per-agent limit",
			cfg:  AdmissionConfig{MaxPerAgent: 2},
			steps: []step{
				{agent: "a"}, {agent: "a"}, {agent: "a", want: CapacityAgent},
				{agent: "b"}, {release: 2}, {agent: "a"},
			},
			running: 3,
		},
		{
			name: "sandboxes without an agent count only globally",
			cfg:  AdmissionConfig{MaxConcurrent: 4, MaxPerAgent: 1, AgentBurst: 1},
			steps: []step{
				{agent: ""}, {agent: ""}, {agent: ""}, {agent: "a"}, {agent: "", want: CapacityGlobal},
			},
			running: 4,
		},
		{
			name: "rate limit, never waited for",
			cfg:  AdmissionConfig{AgentBurst: 2, QueueTimeout: time.Hour},
			steps: []step{
				{agent: "a"}, {agent: "a"}, {release: 1}, {release: 2},
				{agent: "a", want: CapacityAgentRate}, {agent: "b"},
			},
			running: 1,
		},
		{
			name: "refused creates give their token back",
			cfg:  AdmissionConfig{MaxConcurrent: 1, AgentBurst: 2},
			steps: []step{
				{agent: "a"},
				{agent: "b", want: CapacityGlobal}, {agent: "b", want: CapacityGlobal}, {agent: "b", want: CapacityGlobal},
				{release: 1}, {agent: "b"},
			},
			running: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newTestAdmission(tc.cfg)
			tickets := make([]*Ticket, len(tc.steps))
			for i, s := range tc.steps {
				if s.release > 0 {
					tickets[s.release-1].Release()
					continue
				}
				tk, err := a.Acquire(context.Background(), Request{Agent: s.agent})
				if got := capLimit(err); got != s.want {
					t.Fatalf("step %d: Acquire(%q) = %q, want %q", i+1, s.agent, got, s.want)
				}
				tickets[i] = tk
			}
			if st := a.Stats(); st.Running != tc.running || st.Waiting != 0 {
				t.Errorf("Stats() = %+v, want %d running", st, tc.running)
			}
		})
	}
}

// TestAdmissionRetryAfter: the rate limit says when the next token comes;
// the other limits estimate a second.
func TestAdmissionRetryAfter(t *testing.T) {
	a := newTestAdmission(AdmissionConfig{AgentRate: 0.5, AgentBurst: 2, MaxConcurrent: 1})
	mustAcquire(t, a, "a").Release()
	mustAcquire(t, a, "a").Release()
	for _, tc := range []struct {
		advance time.Duration
		want    time.Duration // 0: admitted
	}{
		{0, 2 * time.Second},
		{1500 * time.Millisecond, 500 * time.Millisecond},
		{-time.Hour, 500 * time.Millisecond}, // a clock going back refills nothing
		{time.Hour + 500*time.Millisecond, 0},
	} {
		a.clock.Advance(tc.advance)
		tk, err := a.Acquire(context.Background(), Request{Agent: "a"})
		var ce *CapacityError
		switch {
		case tc.want == 0 && err != nil:
			t.Errorf("after %v: %v, want admitted", tc.advance, err)
		case tc.want == 0:
			tk.Release()
		case !errors.As(err, &ce) || ce.Limit != CapacityAgentRate || ce.RetryAfter != tc.want:
			t.Errorf("after %v: %v, want agent_rate with Retry-After %v", tc.advance, err, tc.want)
		}
	}

	tk := mustAcquire(t, a, "b")
	_, err := a.Acquire(context.Background(), Request{Agent: "c"})
	var ce *CapacityError
	if !errors.As(err, &ce) || ce.Limit != CapacityGlobal || ce.RetryAfter != time.Second {
		t.Fatalf("global full: %v, want global with Retry-After 1s", err)
	}
	if ce.Code() != "capacity_exceeded" || !strings.HasPrefix(ce.Error(), "capacity_exceeded: all 1 sandbox slots are in use") {
		t.Errorf("Code() = %q, Error() = %q", ce.Code(), ce.Error())
	}
	tk.Release()
}

// TestAdmissionFIFO: waiters are served in arrival order, and a released
// slot goes to the first waiter, not to a later create.
func TestAdmissionFIFO(t *testing.T) {
	a := newTestAdmission(AdmissionConfig{MaxConcurrent: 1, QueueTimeout: time.Hour})
	ctx := context.Background()
	held := mustAcquire(t, a, "first")
	var waiting []<-chan acquired
	var names []string
	for i := range 4 {
		names = append(names, fmt.Sprintf("w%d", i))
		waiting = append(waiting, a.acquireAsync(t, ctx, names[i]))
	}
	for i := 0; i < len(waiting); i++ {
		held.Release()
		r := <-waiting[i]
		if r.err != nil || r.t.Agent() != names[i] {
			t.Fatalf("release %d admitted %v %v, want %s", i, r.t, r.err, names[i])
		}
		if st := a.Stats(); st.Running != 1 || st.Waiting != len(waiting)-i-1 {
			t.Fatalf("after release %d: %+v", i, st)
		}
		// A create arriving now finds the slot taken by the first waiter
		// and queues behind the others.
		if i == 0 {
			names = append(names, "late")
			waiting = append(waiting, a.acquireAsync(t, ctx, "late"))
		}
		held = r.t
	}
	held.Release()
	if st := a.Stats(); st.Running != 0 || st.Waiting != 0 || len(st.Teams[store.DefaultTeam].PerAgent) != 0 {
		t.Errorf("at the end: %+v", st)
	}
}

// TestAdmissionAgentLimitDoesNotBlockOthers: a waiter held back by its own
// agent's limit lets later creates of other agents pass, while a waiter for
// a global slot is served before later ones.
func TestAdmissionAgentLimitDoesNotBlockOthers(t *testing.T) {
	a := newTestAdmission(AdmissionConfig{MaxConcurrent: 3, MaxPerAgent: 1, QueueTimeout: time.Hour})
	ctx := context.Background()
	ta := mustAcquire(t, a, "a")
	a2 := a.acquireAsync(t, ctx, "a") // waits for agent a
	tb := mustAcquire(t, a, "b")      // passes the waiting a
	mustAcquire(t, a, "c")            // global now full
	d := a.acquireAsync(t, ctx, "d")  // waits for a global slot
	tb.Release()                      // a2 is still held back by agent a: d goes
	r := <-d
	if r.err != nil || r.t.Agent() != "d" {
		t.Fatalf("after releasing b: %v %v, want d admitted", r.t, r.err)
	}
	if st := a.Stats(); st.Waiting != 1 || st.Running != 3 || st.Teams[store.DefaultTeam].PerAgent["a"] != 1 {
		t.Fatalf("stats %+v", st)
	}
	ta.Release()
	if r := <-a2; r.err != nil || r.t.Agent() != "a" {
		t.Fatalf("after releasing a: %v %v, want the second a admitted", r.t, r.err)
	}
	want := map[string]int{"a": 1, "c": 1, "d": 1}
	if st := a.Stats(); fmt.Sprint(st.Teams[store.DefaultTeam].PerAgent) != fmt.Sprint(want) || st.Running != 3 || st.Waiting != 0 {
		t.Errorf("stats %+v, want per agent %v", st, want)
	}
}

// TestAdmissionWaitEnds: a waiter that times out or is cancelled leaves
// the queue, gives its rate token back, and gets no slot later.
func TestAdmissionWaitEnds(t *testing.T) {
	for _, tc := range []struct {
		name    string
		end     func(ta *testAdmission, cancel context.CancelFunc)
		wantErr func(error) bool
	}{
		{
			name: "timeout",
			end:  func(ta *testAdmission, _ context.CancelFunc) { close(ta.timeout) },
			wantErr: func(err error) bool {
				return capLimit(err) == CapacityGlobal && strings.Contains(err.Error(), "after waiting 1h0m0s")
			},
		},
		{
			name:    "cancel",
			end:     func(_ *testAdmission, cancel context.CancelFunc) { cancel() },
			wantErr: func(err error) bool { return errors.Is(err, context.Canceled) },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newTestAdmission(AdmissionConfig{MaxConcurrent: 1, AgentBurst: 1, QueueTimeout: time.Hour})
			held := mustAcquire(t, a, "a")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w := a.acquireAsync(t, ctx, "b")
			tc.end(a, cancel)
			if r := <-w; r.t != nil || !tc.wantErr(r.err) {
				t.Fatalf("wait ended with %v %v", r.t, r.err)
			}
			if st := a.Stats(); st.Waiting != 0 || st.Running != 1 {
				t.Fatalf("after the wait: %+v", st)
			}
			held.Release()
			if st := a.Stats(); st.Running != 0 {
				t.Fatalf("the slot went to a gone waiter: %+v", st)
			}
			// b's only token came back.
			mustAcquire(t, a, "b").Release()
		})
	}
}

// TestAdmissionAdmittedWhileTimingOut: a create admitted just as its wait
// times out keeps the slot.
func TestAdmissionAdmittedWhileTimingOut(t *testing.T) {
	a := newTestAdmission(AdmissionConfig{MaxConcurrent: 1, QueueTimeout: time.Hour})
	held := mustAcquire(t, a, "a")
	fired := make(chan time.Time)
	close(fired)
	a.after = func(time.Duration) (<-chan time.Time, func() bool) {
		held.Release() // the slot goes to the waiter, then its timer fires
		return fired, func() bool { return false }
	}
	tk, err := a.Acquire(context.Background(), Request{Agent: "b"})
	if err != nil || tk.Agent() != "b" {
		t.Fatalf("Acquire = %v %v, want a ticket", tk, err)
	}
	if st := a.Stats(); st.Running != 1 || st.Waiting != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestAdmissionCancelledContext: a create whose context has already ended
// is refused even if a slot is free.
func TestAdmissionCancelledContext(t *testing.T) {
	a := newTestAdmission(AdmissionConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if tk, err := a.Acquire(ctx, Request{Agent: "a"}); tk != nil || !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire = %v %v, want context.Canceled", tk, err)
	}
	if st := a.Stats(); st.Running != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestAdmissionQueueFull: past MaxQueue waiters, creates fail at once.
func TestAdmissionQueueFull(t *testing.T) {
	a := newTestAdmission(AdmissionConfig{MaxConcurrent: 1, MaxQueue: 2, QueueTimeout: time.Hour})
	ctx := context.Background()
	held := mustAcquire(t, a, "a")
	w1 := a.acquireAsync(t, ctx, "b")
	w2 := a.acquireAsync(t, ctx, "c")
	_, err := a.Acquire(ctx, Request{Agent: "d"})
	var ce *CapacityError
	if !errors.As(err, &ce) || ce.Limit != CapacityQueue || ce.RetryAfter <= 0 {
		t.Fatalf("third waiter: %v, want queue", err)
	}
	if st := a.Stats(); st.Waiting != 2 {
		t.Errorf("waiting %d, want 2", st.Waiting)
	}
	held.Release()
	r := <-w1
	r.t.Release()
	r = <-w2
	r.t.Release()
}

// TestAdmissionAdopt: adopted sandboxes are always counted, even past the
// limits, and hold back new creates until released.
func TestAdmissionAdopt(t *testing.T) {
	a := newTestAdmission(AdmissionConfig{MaxConcurrent: 2, MaxPerAgent: 1, AgentBurst: 1})
	adopted := []*Ticket{a.Adopt(Request{Agent: "a"}), a.Adopt(Request{Agent: "a"}), a.Adopt(Request{Agent: "b"})}
	if st := a.Stats(); st.Running != 3 || st.Teams[store.DefaultTeam].PerAgent["a"] != 2 || st.Teams[store.DefaultTeam].PerAgent["b"] != 1 {
		t.Fatalf("after adopting: %+v", st)
	}
	if _, err := a.Acquire(context.Background(), Request{Agent: "c"}); capLimit(err) != CapacityGlobal {
		t.Fatalf("create over adopted sandboxes: %v, want global", err)
	}
	adopted[2].Release()
	adopted[1].Release()
	if _, err := a.Acquire(context.Background(), Request{Agent: "a"}); capLimit(err) != CapacityAgent {
		t.Fatalf("create for a: %v, want agent", err)
	}
	mustAcquire(t, a, "c")
	// Adopting took no rate token: a still has its only one.
	adopted[0].Release()
	mustAcquire(t, a, "a")
}

// TestTicketRelease: releasing twice, or a nil ticket, does nothing.
func TestTicketRelease(t *testing.T) {
	a := newTestAdmission(AdmissionConfig{})
	t1 := mustAcquire(t, a, "a")
	t2 := mustAcquire(t, a, "a")
	t1.Release()
	t1.Release()
	if st := a.Stats(); st.Running != 1 || st.Teams[store.DefaultTeam].PerAgent["a"] != 1 {
		t.Errorf("after a double release: %+v", st)
	}
	t2.Release()
	if st := a.Stats(); st.Running != 0 || len(st.Teams[store.DefaultTeam].PerAgent) != 0 {
		t.Errorf("after releasing all: %+v", st)
	}
	var nilTicket *Ticket
	nilTicket.Release()
}

// TestAdmissionBounded: 100 concurrent creates with MaxConcurrent 10 never
// hold more than 10 tickets at once. First all 100 hold on to their
// tickets: exactly 10 are admitted and 90 wait, and each release admits
// exactly one more. Then 100 goroutines churn through acquire and release.
func TestAdmissionBounded(t *testing.T) {
	const (
		workers = 100
		limit   = 10
	)
	cfg := AdmissionConfig{MaxConcurrent: limit, MaxPerAgent: workers, AgentBurst: 1 << 20, QueueTimeout: time.Hour, MaxQueue: workers}
	var held, peak atomic.Int64
	take := func() {
		n := held.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
	}

	t.Run("hold", func(t *testing.T) {
		a := newTestAdmission(cfg)
		got := make(chan *Ticket, workers)
		errs := make(chan error, workers)
		for i := range workers {
			go func() {
				tk, err := a.Acquire(context.Background(), Request{Agent: fmt.Sprintf("agent%d", i%7)})
				if err != nil {
					errs <- err
					return
				}
				take()
				got <- tk
			}()
		}
		var tickets []*Ticket
		for range limit {
			tickets = append(tickets, <-got)
		}
		for range workers - limit {
			<-a.waits
		}
		if st := a.Stats(); st.Running != limit || st.Waiting != workers-limit {
			t.Fatalf("with all creates in: %+v", st)
		}
		admitted := limit
		for len(tickets) > 0 {
			tk := tickets[0]
			tickets = tickets[1:]
			waiting := a.Stats().Waiting
			held.Add(-1)
			tk.Release()
			if waiting > 0 {
				// The slot went to the first waiter, and to nobody else.
				tickets = append(tickets, <-got)
				admitted++
			}
			if n := held.Load(); n > limit {
				t.Fatalf("%d tickets held", n)
			}
			if st := a.Stats(); st.Running != len(tickets) || st.Waiting != max(waiting-1, 0) {
				t.Fatalf("after a release: %+v, want %d running, %d waiting", st, len(tickets), max(waiting-1, 0))
			}
		}
		if admitted != workers {
			t.Errorf("%d creates admitted, want %d", admitted, workers)
		}
		select {
		case err := <-errs:
			t.Fatalf("a create failed: %v", err)
		default:
		}
		if st := a.Stats(); st.Running != 0 || st.Waiting != 0 || len(got) != 0 {
			t.Errorf("at the end: %+v, %d tickets unclaimed", st, len(got))
		}
	})

	t.Run("churn", func(t *testing.T) {
		a := newTestAdmission(cfg)
		a.onWait = nil
		var wg sync.WaitGroup
		var failed atomic.Int64
		for i := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 50 {
					tk, err := a.Acquire(context.Background(), Request{Agent: fmt.Sprintf("agent%d", i%7)})
					if err != nil {
						failed.Add(1)
						return
					}
					take()
					runtime.Gosched()
					held.Add(-1)
					tk.Release()
				}
			}()
		}
		wg.Wait()
		if failed.Load() != 0 {
			t.Errorf("%d creates failed", failed.Load())
		}
		if st := a.Stats(); st.Running != 0 || st.Waiting != 0 {
			t.Errorf("at the end: %+v", st)
		}
	})

	if p := peak.Load(); p > limit || p < 1 {
		t.Errorf("peak of %d tickets held at once, limit %d", p, limit)
	}
}

// TestAdmissionBucketsBounded: rate-limit state is not kept for agents
// whose bucket has refilled.
func TestAdmissionBucketsBounded(t *testing.T) {
	a := newTestAdmission(AdmissionConfig{MaxConcurrent: 1})
	for i := range 1000 {
		mustAcquire(t, a, fmt.Sprintf("agent-%d", i)).Release()
		a.clock.Advance(time.Minute)
	}
	if n := a.limiter.Len(); n > 128 {
		t.Errorf("%d buckets kept for 1000 agents gone idle", n)
	}
}

func i64(v int64) *int64     { return &v }
func f64(v float64) *float64 { return &v }

// TestAdmissionTeamQuotas runs sequences of creates and releases without
// waiting against team quotas: each step acquires a Request, expecting
// success or the named limit, or releases the ticket of an earlier step.
// It defends against one team using more than its quota, against quota
// evasion by spreading creates over many agent names (the team limits
// count every agent, and the agent "" too), and against agents of
// different teams sharing a count because they share a name.
func TestAdmissionTeamQuotas(t *testing.T) {
	type step struct {
		req     Request
		release int    // if > 0: release the ticket of this (1-based) step instead
		want    string // "" = admitted, else CapacityError.Limit
		msg     string // if set, the refusal's message contains it
	}
	a := func(agent string) Request { return Request{Team: "a", Agent: agent} }
	b := func(agent string) Request { return Request{Team: "b", Agent: agent} }
	cpu := func(team string, n float64) Request { return Request{Team: team, CPUs: n} }
	mem := func(team string, n int64) Request { return Request{Team: team, MemoryMB: n} }
	tenths := func() []step {
		var s []step
		for range 10 {
			s = append(s, step{req: cpu("a", 0.1)})
		}
		return append(s, step{req: cpu("a", 0.001), want: CapacityTeamCPU, msg: `team "a" runs sandboxes of 1 CPUs; with this one's 0.001 it would exceed its quota team_cpu of 1`})
	}
	for _, tc := range []struct {
		name      string
		cfg       AdmissionConfig
		overrides map[string]store.TeamQuota
		steps     []step
	}{
		{
			name: "team sandboxes, over many agents",
			cfg:  AdmissionConfig{Team: TeamQuota{MaxSandboxes: 2}},
			steps: []step{
				{req: a("x")}, {req: a("y")},
				{req: a("z"), want: CapacityTeamSandboxes, msg: `team "a" runs 2 sandboxes (quota team_sandboxes 2)`},
				{req: a(""), want: CapacityTeamSandboxes},
				{req: b("x")}, {req: b("")},
				{release: 1}, {req: a("z")},
			},
		},
		{
			name: "team quotas before the global limit",
			cfg:  AdmissionConfig{MaxConcurrent: 2, Team: TeamQuota{MaxSandboxes: 1}},
			steps: []step{
				{req: a("")}, {req: b("")}, {req: a(""), want: CapacityTeamSandboxes}, {req: Request{Team: "c"}, want: CapacityGlobal},
			},
		},
		{
			name: "team per-agent quota under the global one",
			cfg:  AdmissionConfig{MaxPerAgent: 5, Team: TeamQuota{MaxPerAgent: 1}},
			steps: []step{
				{req: a("x")},
				{req: a("x"), want: CapacityTeamAgent, msg: `agent "x" of team "a" runs 1 sandboxes (quota team_agent 1 per agent)`},
				{req: a("y")}, {req: b("x")}, {req: a("")}, {req: a("")},
			},
		},
		{
			name: "global per-agent limit, agents per team",
			cfg:  AdmissionConfig{MaxPerAgent: 1, Team: TeamQuota{MaxPerAgent: 3}},
			steps: []step{
				{req: a("x")}, {req: b("x")},
				{req: a("x"), want: CapacityAgent, msg: `agent "x" of team "a" runs 1 sandboxes (limit 1)`},
			},
		},
		{
			name:  "team CPUs, summed exactly",
			cfg:   AdmissionConfig{MaxConcurrent: 20, Team: TeamQuota{MaxCPUs: 1}},
			steps: append(tenths(), step{req: cpu("b", 1)}, step{release: 3}, step{req: cpu("a", 0.1)}),
		},
		{
			name: "team memory",
			cfg:  AdmissionConfig{Team: TeamQuota{MaxMemoryMB: 512}},
			steps: []step{
				{req: mem("a", 256)}, {req: mem("a", 256)},
				{req: mem("a", 16), want: CapacityTeamMemory, msg: `team "a" runs sandboxes of 512 MiB; with this one's 16 MiB it would exceed its quota team_memory of 512 MiB`},
				{req: mem("b", 512)}, {release: 1}, {req: mem("a", 256)},
			},
		},
		{
			name: "a sandbox larger than the whole quota is refused at once, without waiting",
			cfg:  AdmissionConfig{QueueTimeout: time.Hour, Team: TeamQuota{MaxCPUs: 1, MaxMemoryMB: 256}},
			steps: []step{
				{req: cpu("a", 2), want: CapacityTeamCPU, msg: "even with none running"},
				{req: mem("a", 512), want: CapacityTeamMemory, msg: "even with none running"},
				{req: Request{Team: "a", CPUs: 1, MemoryMB: 256}},
			},
		},
		{
			name: "team rate, over many agents, refused creates give the token back",
			cfg:  AdmissionConfig{MaxConcurrent: 2, Team: TeamQuota{CreateRate: 0.5, CreateBurst: 3}},
			steps: []step{
				{req: a("x")}, {req: a("y")},
				{req: a("z"), want: CapacityGlobal}, // gives its token back
				{release: 1}, {release: 2},
				{req: a("z")},
				{req: a("w"), want: CapacityTeamRate, msg: `team "a" creates sandboxes faster than its quota team_rate of 0.5 per second (burst 3)`},
				{req: a(""), want: CapacityTeamRate},
				{req: b("x")},
			},
		},
		{
			name: "agent rate buckets are per team",
			cfg:  AdmissionConfig{AgentBurst: 1},
			steps: []step{
				{req: a("x")}, {req: b("x")}, {release: 1},
				{req: a("x"), want: CapacityAgentRate, msg: `agent "x" of team "a" creates sandboxes faster than 1 per second (burst 1)`},
			},
		},
		{
			name:      "an override replaces the defaults it sets; zero lifts a limit",
			cfg:       AdmissionConfig{Team: TeamQuota{MaxSandboxes: 1, MaxCPUs: 1}},
			overrides: map[string]store.TeamQuota{"a": {MaxSandboxes: i64(2)}, "b": {MaxSandboxes: i64(0), MaxCPUs: f64(0)}},
			steps: []step{
				{req: cpu("a", 0.5)}, {req: cpu("a", 0.5)}, {req: cpu("a", 0.5), want: CapacityTeamSandboxes},
				{req: cpu("b", 4)}, {req: cpu("b", 4)}, {req: cpu("b", 4)},
				{req: cpu("c", 0.5)}, {req: cpu("c", 0.5), want: CapacityTeamSandboxes},
			},
		},
		{
			name: "no team is the default team",
			cfg:  AdmissionConfig{Team: TeamQuota{MaxSandboxes: 1}},
			steps: []step{
				{req: Request{}}, {req: Request{Team: store.DefaultTeam}, want: CapacityTeamSandboxes, msg: `team "default"`},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ad := newTestAdmission(tc.cfg)
			for team, o := range tc.overrides {
				ad.SetTeamQuota(team, o)
			}
			tickets := make([]*Ticket, len(tc.steps))
			for i, s := range tc.steps {
				if s.release > 0 {
					tickets[s.release-1].Release()
					continue
				}
				tk, err := ad.Acquire(context.Background(), s.req)
				if got := capLimit(err); got != s.want {
					t.Fatalf("step %d: Acquire(%+v) = %q (%v), want %q", i+1, s.req, got, err, s.want)
				}
				if s.msg != "" && (err == nil || !strings.Contains(err.Error(), s.msg)) {
					t.Fatalf("step %d: refusal %v, want it to say %q", i+1, err, s.msg)
				}
				tickets[i] = tk
			}
			if st := ad.Stats(); st.Waiting != 0 {
				t.Errorf("Stats() = %+v, want nobody waiting", st)
			}
		})
	}
}

// TestAdmissionTeamFairness defends against a noisy neighbour: team A
// holds every global slot and floods the queue; team B's create, arriving
// after all of A's waiters, gets the next freed slot (B runs fewer
// sandboxes than A), and A's waiters are then served in their order.
func TestAdmissionTeamFairness(t *testing.T) {
	ad := newTestAdmission(AdmissionConfig{MaxConcurrent: 2, MaxPerAgent: 100, QueueTimeout: time.Hour})
	ctx := context.Background()
	held := []*Ticket{
		mustAcquireReq(t, ad, Request{Team: "a", Agent: "held0"}),
		mustAcquireReq(t, ad, Request{Team: "a", Agent: "held1"}),
	}
	var flood []<-chan acquired
	for i := range 5 {
		flood = append(flood, ad.acquireAsyncReq(t, ctx, Request{Team: "a", Agent: fmt.Sprintf("a%d", i)}))
	}
	bw := ad.acquireAsyncReq(t, ctx, Request{Team: "b", Agent: "b0"})
	if st := ad.Stats(); st.Waiting != 6 || st.Teams["a"].Waiting != 5 || st.Teams["b"].Waiting != 1 {
		t.Fatalf("with the flood in: %+v", st)
	}

	held[0].Release()
	// The slot is handed over within Release.
	if st := ad.Stats(); st.Teams["b"].Running != 1 {
		t.Fatalf("after the release: %+v, want team b's create admitted", st)
	}
	r := <-bw
	if r.err != nil || r.t.Team() != "b" {
		t.Fatalf("the freed slot went to %v %v, want team b's create", r.t, r.err)
	}
	// A's next waiter is first of its team, then the others in order.
	running := []*Ticket{held[1], r.t}
	for i := range flood {
		running[0].Release()
		r := <-flood[i]
		if r.err != nil || r.t.Agent() != fmt.Sprintf("a%d", i) {
			t.Fatalf("release %d admitted %v %v, want a%d", i, r.t, r.err, i)
		}
		running = append(running[1:], r.t)
	}
	for _, tk := range running {
		tk.Release()
	}
	if st := ad.Stats(); st.Running != 0 || st.Waiting != 0 || len(st.Teams) != 0 {
		t.Errorf("at the end: %+v", st)
	}
}

// TestAdmissionTeamFairnessOrder: a freed slot goes to the waiting team
// with the fewest sandboxes running, however late its create came; on a
// tie, to the earliest arrival.
func TestAdmissionTeamFairnessOrder(t *testing.T) {
	ad := newTestAdmission(AdmissionConfig{MaxConcurrent: 5, QueueTimeout: time.Hour})
	ctx := context.Background()
	mustAcquireReq(t, ad, Request{Team: "a"})
	mustAcquireReq(t, ad, Request{Team: "a"})
	tb := mustAcquireReq(t, ad, Request{Team: "b"})
	mustAcquireReq(t, ad, Request{Team: "c"})
	td := mustAcquireReq(t, ad, Request{Team: "d"})
	// Waiting in this order: a (2 running), c (1), b (1).
	wa := ad.acquireAsyncReq(t, ctx, Request{Team: "a", Agent: "wa"})
	wc := ad.acquireAsyncReq(t, ctx, Request{Team: "c", Agent: "wc"})
	wb := ad.acquireAsyncReq(t, ctx, Request{Team: "b", Agent: "wb"})
	expect := func(ch <-chan acquired, agent string) *Ticket {
		t.Helper()
		r := <-ch
		if r.err != nil || r.t.Agent() != agent {
			t.Fatalf("admitted %v %v, want %s", r.t, r.err, agent)
		}
		return r.t
	}
	tb.Release() // b runs 0: the fewest
	if st := ad.Stats(); st.Teams["b"].Running != 1 {
		t.Fatalf("after the release: %+v, want b's waiter admitted", st)
	}
	expect(wb, "wb").Release() // b runs 0 again, with no waiter; c runs 1, a 2
	expect(wc, "wc")
	wc2 := ad.acquireAsyncReq(t, ctx, Request{Team: "c", Agent: "wc2"})
	td.Release() // a and c run 2 each: a's waiter came first
	expect(wa, "wa")
	if st := ad.Stats(); st.Waiting != 1 || st.Teams["c"].Waiting != 1 || st.Running != 5 {
		t.Fatalf("stats %+v", st)
	}
	close(ad.timeout)
	if r := <-wc2; capLimit(r.err) != CapacityGlobal {
		t.Fatalf("the last waiter timed out with %v, want global", r.err)
	}
}

// mustAcquireReq acquires req at once or fails the test.
func mustAcquireReq(t *testing.T, a *testAdmission, req Request) *Ticket {
	t.Helper()
	tk, err := a.Acquire(context.Background(), req)
	if err != nil {
		t.Fatalf("Acquire(%+v): %v", req, err)
	}
	return tk
}

// TestAdmissionTeamQueueShare defends against one team filling the whole
// wait queue so that another team's create is refused at once: with the
// queue full of team A's waiters, team B's create takes the place of A's
// newest waiter, which is refused with "queue" and gives its tokens back;
// a create of A itself, with the queue full, is refused.
func TestAdmissionTeamQueueShare(t *testing.T) {
	ad := newTestAdmission(AdmissionConfig{MaxConcurrent: 1, MaxQueue: 3, AgentBurst: 1, QueueTimeout: time.Hour})
	ctx := context.Background()
	held := mustAcquireReq(t, ad, Request{Team: "a", Agent: "held"})
	var as []<-chan acquired
	for i := range 3 {
		as = append(as, ad.acquireAsyncReq(t, ctx, Request{Team: "a", Agent: fmt.Sprintf("a%d", i)}))
	}
	if _, err := ad.Acquire(ctx, Request{Team: "a", Agent: "a3"}); capLimit(err) != CapacityQueue {
		t.Fatalf("A's fourth waiter: %v, want queue", err)
	}
	bw := ad.acquireAsyncReq(t, ctx, Request{Team: "b", Agent: "b0"})
	r := <-as[2]
	if capLimit(r.err) != CapacityQueue || !strings.Contains(r.err.Error(), `team "a" has the most creates waiting (3)`) {
		t.Fatalf("A's newest waiter: %v %v, want refused with queue", r.t, r.err)
	}
	if st := ad.Stats(); st.Waiting != 3 || st.Teams["a"].Waiting != 2 || st.Teams["b"].Waiting != 1 {
		t.Fatalf("stats %+v", st)
	}
	// A holds the most places now: its create does not push out B's.
	if _, err := ad.Acquire(ctx, Request{Team: "a", Agent: "a4"}); capLimit(err) != CapacityQueue {
		t.Fatalf("A's create with A holding the most places: %v, want queue", err)
	}
	// Both teams run nothing once held is gone: the earliest arrivals go
	// first.
	prev := held
	for _, w := range []struct {
		ch    <-chan acquired
		agent string
	}{{as[0], "a0"}, {as[1], "a1"}, {bw, "b0"}} {
		prev.Release()
		r := <-w.ch
		if r.err != nil || r.t.Agent() != w.agent {
			t.Fatalf("admitted %v %v, want %s", r.t, r.err, w.agent)
		}
		prev = r.t
	}
	prev.Release()
	// a2's refusal gave its agent token back.
	mustAcquireReq(t, ad, Request{Team: "a", Agent: "a2"}).Release()
}

// TestAdmissionTeamFIFO: within a team no later create overtakes an
// earlier one held back by a team quota (a smaller sandbox behind a
// large one waits its turn), while another team's create passes both.
func TestAdmissionTeamFIFO(t *testing.T) {
	ad := newTestAdmission(AdmissionConfig{QueueTimeout: time.Hour, Team: TeamQuota{MaxCPUs: 2}})
	ctx := context.Background()
	held := mustAcquireReq(t, ad, Request{Team: "a", CPUs: 1.5})
	big := ad.acquireAsyncReq(t, ctx, Request{Team: "a", Agent: "big", CPUs: 1})
	small := ad.acquireAsyncReq(t, ctx, Request{Team: "a", Agent: "small", CPUs: 0.25})
	mustAcquireReq(t, ad, Request{Team: "b", CPUs: 2}).Release()
	if st := ad.Stats(); st.Teams["a"].Waiting != 2 {
		t.Fatalf("stats %+v: the small create overtook the big one", st)
	}
	held.Release()
	for _, w := range []struct {
		ch    <-chan acquired
		agent string
	}{{big, "big"}, {small, "small"}} {
		if r := <-w.ch; r.err != nil || r.t.Agent() != w.agent {
			t.Fatalf("admitted %v %v, want %s", r.t, r.err, w.agent)
		}
	}
	if st := ad.Stats().Teams["a"]; st.Running != 2 || st.CPUs != 1.25 || st.Waiting != 0 {
		t.Errorf("team a: %+v", st)
	}
}

// TestAdmissionTeamTimeoutNamesQuota: a create that waited in vain for
// its team's quota is refused naming that quota, as is one waiting
// behind it.
func TestAdmissionTeamTimeoutNamesQuota(t *testing.T) {
	ad := newTestAdmission(AdmissionConfig{QueueTimeout: time.Hour, Team: TeamQuota{MaxMemoryMB: 1024}})
	ctx := context.Background()
	mustAcquireReq(t, ad, Request{Team: "a", MemoryMB: 1024})
	first := ad.acquireAsyncReq(t, ctx, Request{Team: "a", Agent: "x", MemoryMB: 512})
	second := ad.acquireAsyncReq(t, ctx, Request{Team: "a", Agent: "y", MemoryMB: 16})
	close(ad.timeout)
	for _, ch := range []<-chan acquired{first, second} {
		r := <-ch
		if capLimit(r.err) != CapacityTeamMemory || !strings.Contains(r.err.Error(), "after waiting 1h0m0s") {
			t.Errorf("timed out with %v, want team_memory", r.err)
		}
	}
}

// TestAdmissionTeamRelease: a released sandbox gives its team's slot,
// CPUs and memory back (once, however often it is released), and a
// waiter they let in is admitted.
func TestAdmissionTeamRelease(t *testing.T) {
	ad := newTestAdmission(AdmissionConfig{QueueTimeout: time.Hour, Team: TeamQuota{MaxCPUs: 1.5, MaxMemoryMB: 2048}})
	ctx := context.Background()
	t1 := mustAcquireReq(t, ad, Request{Team: "a", Agent: "x", CPUs: 1, MemoryMB: 1024})
	t2 := mustAcquireReq(t, ad, Request{Team: "a", Agent: "x", CPUs: 0.5, MemoryMB: 512})
	if st := ad.TeamStats("a"); st.Running != 2 || st.CPUs != 1.5 || st.MemoryMB != 1536 || st.PerAgent["x"] != 2 {
		t.Fatalf("team a: %+v", st)
	}
	w := ad.acquireAsyncReq(t, ctx, Request{Team: "a", Agent: "y", CPUs: 1, MemoryMB: 1024})
	t1.Release()
	t1.Release()
	r := <-w
	if r.err != nil {
		t.Fatal(r.err)
	}
	if st := ad.TeamStats("a"); st.Running != 2 || st.CPUs != 1.5 || st.MemoryMB != 1536 || st.PerAgent["x"] != 1 {
		t.Fatalf("team a after a double release: %+v", st)
	}
	t2.Release()
	r.t.Release()
	if st := ad.TeamStats("a"); st.Running != 0 || st.CPUs != 0 || st.MemoryMB != 0 || len(st.PerAgent) != 0 {
		t.Errorf("team a at the end: %+v", st)
	}
}

// TestAdmissionSetTeamQuota: an override applies to the next create
// without a restart; a raised quota admits the waiters it lets in; a
// lowered one ends nothing; dropping it restores the defaults.
func TestAdmissionSetTeamQuota(t *testing.T) {
	ad := newTestAdmission(AdmissionConfig{QueueTimeout: time.Hour, Team: TeamQuota{MaxSandboxes: 1}})
	ctx := context.Background()
	held := mustAcquireReq(t, ad, Request{Team: "a"})
	w := ad.acquireAsyncReq(t, ctx, Request{Team: "a", Agent: "w"})
	ad.SetTeamQuota("a", store.TeamQuota{MaxSandboxes: i64(3)})
	if r := <-w; r.err != nil {
		t.Fatalf("waiter after the raise: %v", r.err)
	}
	if q := ad.TeamQuota("a"); q.MaxSandboxes != 3 {
		t.Errorf("TeamQuota = %+v", q)
	}
	mustAcquireReq(t, ad, Request{Team: "a"})
	ad.SetTeamQuota("a", store.TeamQuota{MaxSandboxes: i64(1), CreateRate: f64(1), CreateBurst: i64(1)})
	if st := ad.TeamStats("a"); st.Running != 3 {
		t.Errorf("a lowered quota ended sandboxes: %+v", st)
	}
	held.Release()
	over := ad.acquireAsyncReq(t, ctx, Request{Team: "a", Agent: "over"})
	close(ad.timeout)
	if r := <-over; capLimit(r.err) != CapacityTeamSandboxes {
		t.Errorf("over the lowered quota: %v", r.err)
	}
	// The refused create gave the new bucket's only token back: the next
	// one is refused for the quota again, not for the rate.
	if _, err := ad.Acquire(ctx, Request{Team: "a"}); capLimit(err) != CapacityTeamSandboxes {
		t.Errorf("the next create: %v, want team_sandboxes", err)
	}
	ad.SetTeamQuota("a", store.TeamQuota{})
	if q := ad.TeamQuota("a"); q != (TeamQuota{MaxSandboxes: 1}) {
		t.Errorf("after dropping the override: %+v", q)
	}
}

// TestAdmissionTeamAdopt: an adopted sandbox counts in its team's
// sandboxes, CPUs and memory, even past the quota, and holds back the
// team's creates until released.
func TestAdmissionTeamAdopt(t *testing.T) {
	ad := newTestAdmission(AdmissionConfig{Team: TeamQuota{MaxSandboxes: 1, MaxCPUs: 1}})
	adopted := []*Ticket{ad.Adopt(Request{Team: "a", CPUs: 1}), ad.Adopt(Request{Team: "a", CPUs: 1})}
	if st := ad.TeamStats("a"); st.Running != 2 || st.CPUs != 2 {
		t.Fatalf("after adopting: %+v", st)
	}
	if _, err := ad.Acquire(context.Background(), Request{Team: "a", CPUs: 0.1}); capLimit(err) != CapacityTeamSandboxes {
		t.Fatalf("create over adopted sandboxes: %v", err)
	}
	mustAcquireReq(t, ad, Request{Team: "b", CPUs: 1})
	adopted[0].Release()
	if _, err := ad.Acquire(context.Background(), Request{Team: "a", CPUs: 0.1}); capLimit(err) != CapacityTeamSandboxes {
		t.Fatalf("create with one adopted left: %v", err)
	}
	adopted[1].Release()
	mustAcquireReq(t, ad, Request{Team: "a", CPUs: 1})
}

// TestValidateQuota: a bad override value is refused naming its field;
// zero (no team limit) and the ceilings are accepted.
func TestValidateQuota(t *testing.T) {
	for _, tc := range []struct {
		o     store.TeamQuota
		field string // "" = valid
	}{
		{store.TeamQuota{}, ""},
		{store.TeamQuota{MaxSandboxes: i64(0), MaxPerAgent: i64(0), MaxCPUs: f64(0), MaxMemoryMB: i64(0), CreateRate: f64(0), CreateBurst: i64(0)}, ""},
		{store.TeamQuota{MaxSandboxes: i64(MaxQuotaSandboxes), MaxCPUs: f64(0.5), MaxMemoryMB: i64(MaxQuotaMemoryMB), CreateRate: f64(0.1)}, ""},
		{store.TeamQuota{MaxSandboxes: i64(-1)}, "max_sandboxes"},
		{store.TeamQuota{MaxSandboxes: i64(MaxQuotaSandboxes + 1)}, "max_sandboxes"},
		{store.TeamQuota{MaxPerAgent: i64(-1)}, "max_per_agent"},
		{store.TeamQuota{MaxCPUs: f64(-0.5)}, "max_cpus"},
		{store.TeamQuota{MaxCPUs: f64(math.Inf(1))}, "max_cpus"},
		{store.TeamQuota{MaxCPUs: f64(math.NaN())}, "max_cpus"},
		{store.TeamQuota{MaxMemoryMB: i64(-1)}, "max_memory_mb"},
		{store.TeamQuota{CreateRate: f64(-1)}, "create_rate"},
		{store.TeamQuota{CreateRate: f64(MaxQuotaRate * 2)}, "create_rate"},
		{store.TeamQuota{CreateBurst: i64(-3)}, "create_burst"},
	} {
		err := ValidateQuota(tc.o)
		var inv *InvalidError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("ValidateQuota(%+v) = %v, want valid", tc.o, err)
		case tc.field != "" && (!errors.As(err, &inv) || !strings.HasPrefix(inv.Msg, tc.field+" ")):
			t.Errorf("ValidateQuota(%+v) = %v, want an InvalidError naming %s", tc.o, err, tc.field)
		}
	}
}
