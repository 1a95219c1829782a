package govern

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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
	ch := make(chan acquired, 1)
	go func() {
		tk, err := ta.Acquire(ctx, agent)
		ch <- acquired{tk, err}
	}()
	if got := <-ta.waits; got != agent {
		t.Fatalf("waiting create is for %q, want %q", got, agent)
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
	tk, err := a.Acquire(context.Background(), agent)
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
				tk, err := a.Acquire(context.Background(), s.agent)
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
		tk, err := a.Acquire(context.Background(), "a")
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
	_, err := a.Acquire(context.Background(), "c")
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
	if st := a.Stats(); st.Running != 0 || st.Waiting != 0 || len(st.PerAgent) != 0 {
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
	if st := a.Stats(); st.Waiting != 1 || st.Running != 3 || st.PerAgent["a"] != 1 {
		t.Fatalf("stats %+v", st)
	}
	ta.Release()
	if r := <-a2; r.err != nil || r.t.Agent() != "a" {
		t.Fatalf("after releasing a: %v %v, want the second a admitted", r.t, r.err)
	}
	want := map[string]int{"a": 1, "c": 1, "d": 1}
	if st := a.Stats(); fmt.Sprint(st.PerAgent) != fmt.Sprint(want) || st.Running != 3 || st.Waiting != 0 {
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
	tk, err := a.Acquire(context.Background(), "b")
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
	if tk, err := a.Acquire(ctx, "a"); tk != nil || !errors.Is(err, context.Canceled) {
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
	_, err := a.Acquire(ctx, "d")
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
	adopted := []*Ticket{a.Adopt("a"), a.Adopt("a"), a.Adopt("b")}
	if st := a.Stats(); st.Running != 3 || st.PerAgent["a"] != 2 || st.PerAgent["b"] != 1 {
		t.Fatalf("after adopting: %+v", st)
	}
	if _, err := a.Acquire(context.Background(), "c"); capLimit(err) != CapacityGlobal {
		t.Fatalf("create over adopted sandboxes: %v, want global", err)
	}
	adopted[2].Release()
	adopted[1].Release()
	if _, err := a.Acquire(context.Background(), "a"); capLimit(err) != CapacityAgent {
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
	if st := a.Stats(); st.Running != 1 || st.PerAgent["a"] != 1 {
		t.Errorf("after a double release: %+v", st)
	}
	t2.Release()
	if st := a.Stats(); st.Running != 0 || len(st.PerAgent) != 0 {
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
				tk, err := a.Acquire(context.Background(), fmt.Sprintf("agent%d", i%7))
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
					tk, err := a.Acquire(context.Background(), fmt.Sprintf("agent%d", i%7))
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
