package govern

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/store"
)

type recorded struct {
	mu    sync.Mutex
	kinds []string
}

func (r *recorded) RecordTask(_, _, kind string, _ any) {
	r.mu.Lock()
	r.kinds = append(r.kinds, kind)
	r.mu.Unlock()
}

func (r *recorded) RecordTaskBy(_ context.Context, s, t, kind string, d any) {
	r.RecordTask(s, t, kind, d)
}

func (r *recorded) has(kind string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range r.kinds {
		if k == kind {
			return true
		}
	}
	return false
}

type fixture struct {
	g     *Governor
	st    *store.Store
	rec   *recorded
	now   time.Time
	trips chan *store.Task
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f := &fixture{st: st, rec: &recorded{}, now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), trips: make(chan *store.Task, 10)}
	f.g = New(Config{Audit: f.rec, Now: func() time.Time { return f.now }, OnTrip: func(t *store.Task) { f.trips <- t }}, st)
	return f
}

func tripCode(err error) string {
	var te *TripError
	if errors.As(err, &te) {
		return te.Code + "/" + te.Budget
	}
	return ""
}

func TestCallBudgetTripsAndReset(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	tk, err := f.g.Create(ctx, TaskRequest{Agent: "a", MaxCalls: 2})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		c, err := f.g.BeginCall(ctx, tk.ID, "sb", "echo "+string(rune('a'+i)), nil)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		c.End(0, false)
	}
	_, err = f.g.BeginCall(ctx, tk.ID, "sb", "echo c", nil)
	if got := tripCode(err); got != "budget_exhausted/max_calls" {
		t.Fatalf("third call: %v (%s)", err, got)
	}
	if !strings.Contains(err.Error(), "summarise") {
		t.Fatalf("refusal does not tell the agent to stop: %q", err)
	}
	tripped := <-f.trips
	if tripped.Breaker.Budget != BudgetCalls || tripped.State != store.TaskTripped {
		t.Fatalf("OnTrip got %+v", tripped)
	}
	// Persisted: a fresh governor over the same store sees the open breaker.
	g2 := New(Config{}, f.st)
	if got, _ := g2.Get(ctx, tk.ID); !got.Breaker.Open || got.Usage.Calls != 2 {
		t.Fatalf("after reload: %+v", got)
	}
	calls := int64(5)
	if _, err := f.g.Change(ctx, tk.ID, BudgetChange{MaxCalls: &calls, Reset: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.g.BeginCall(ctx, tk.ID, "sb", "echo d", nil); err != nil {
		t.Fatalf("after reset: %v", err)
	}
	for _, k := range []string{"task.created", "task.breaker_open", "task.call_refused", "task.changed"} {
		if !f.rec.has(k) {
			t.Errorf("no %s event", k)
		}
	}
}

func TestOtherBudgets(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		req    TaskRequest
		spend  func(f *fixture, id string)
		budget string
	}{
		{"tokens", TaskRequest{MaxTokens: 100}, func(f *fixture, id string) {
			if _, err := f.g.ReportTokens(ctx, id, 101); err != nil {
				t.Fatal(err)
			}
		}, BudgetTokens},
		{"duration", TaskRequest{MaxDurationS: 60}, func(f *fixture, id string) { f.now = f.now.Add(61 * time.Second) }, BudgetDuration},
		{"cpu", TaskRequest{MaxCPUSeconds: 10}, func(f *fixture, id string) {
			f.g.UpdateCPU(id, "s1", 6)
			f.g.UpdateCPU(id, "s2", 5)
		}, BudgetCPUSeconds},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			tk, err := f.g.Create(ctx, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			tc.spend(f, tk.ID)
			_, err = f.g.BeginCall(ctx, tk.ID, "sb", "ls", nil)
			if got := tripCode(err); got != "budget_exhausted/"+tc.budget {
				t.Fatalf("call after spending: %v (%s)", err, got)
			}
			if err := f.g.AdmitSandbox(ctx, tk.ID, "new"); tripCode(err) != "budget_exhausted/"+tc.budget {
				t.Fatalf("new sandbox after spending: %v", err)
			}
		})
	}
}

func TestMaxSandboxesAndEnd(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	tk, err := f.g.Create(ctx, TaskRequest{MaxSandboxes: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.g.AdmitSandbox(ctx, tk.ID, "s1"); err != nil {
		t.Fatal(err)
	}
	if err := f.g.AdmitSandbox(ctx, tk.ID, "s2"); tripCode(err) != "budget_exhausted/max_sandboxes" {
		t.Fatalf("second sandbox: %v", err)
	}
	if got, _ := f.g.Get(ctx, tk.ID); got.Breaker.Open {
		t.Fatal("max_sandboxes opened the breaker")
	}
	f.g.SandboxEnded(tk.ID, "s1")
	if err := f.g.AdmitSandbox(ctx, tk.ID, "s2"); err != nil {
		t.Fatalf("after s1 ended: %v", err)
	}
	if _, err := f.g.EndTask(ctx, tk.ID); err != nil {
		t.Fatal(err)
	}
	if ended := <-f.trips; ended.State != store.TaskEnded {
		t.Fatalf("OnTrip got %+v", ended)
	}
	if _, err := f.g.BeginCall(ctx, tk.ID, "s2", "ls", nil); tripCode(err) != "task_ended/" {
		t.Fatalf("call after end: %v", err)
	}
	if err := f.g.Refusal(ctx, tk.ID); tripCode(err) != "task_ended/" {
		t.Fatalf("Refusal after end: %v", err)
	}
}

func TestLoopOpensBreaker(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	tk, err := f.g.Create(ctx, TaskRequest{MaxCalls: 100})
	if err != nil {
		t.Fatal(err)
	}
	var warned bool
	for i := 0; i < 20; i++ {
		c, err := f.g.BeginCall(ctx, tk.ID, "sb", "pip install requests==2.99", nil)
		if err != nil {
			if tripCode(err) != "loop_detected/" {
				t.Fatalf("call %d: %v", i, err)
			}
			if !warned {
				t.Fatal("tripped without a loop_suspected warning first")
			}
			return
		}
		for _, w := range c.End(1, true) {
			if strings.HasPrefix(w, "loop_suspected") {
				warned = true
			}
		}
	}
	t.Fatal("20 identical failing calls never tripped")
}

func TestBadTaskRequests(t *testing.T) {
	f := newFixture(t)
	for _, req := range []TaskRequest{
		{MaxCalls: -1}, {MaxCalls: MaxCallsCeiling + 1}, {MaxDurationS: -5}, {MaxTokens: -1},
		{MaxSandboxes: MaxSandboxesCeiling + 1}, {MaxCPUSeconds: -1}, {OnTrip: "explode"},
		{Agent: strings.Repeat("a", 200)}, {Artifacts: []string{"relative/path"}},
	} {
		var inv *InvalidError
		if _, err := f.g.Create(context.Background(), req); !errors.As(err, &inv) {
			t.Errorf("%+v: got %v, want InvalidError", req, err)
		}
	}
	if _, err := f.g.Get(context.Background(), "nope"); !errors.Is(err, ErrNoTask) {
		t.Fatalf("unknown task: %v", err)
	}
}

// TestImplicitTaskEndsWithItsSandbox: an implicit task is closed and
// leaves memory when its sandbox ends; a tripped one keeps its breaker.
func TestImplicitTaskEndsWithItsSandbox(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	tk, err := f.g.CreateImplicit(ctx, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.g.AdmitSandbox(ctx, tk.ID, "s1"); err != nil {
		t.Fatal(err)
	}
	f.g.SandboxEnded(tk.ID, "s1")
	if n := len(f.g.tasks); n != 0 {
		t.Fatalf("%d tasks kept in memory", n)
	}
	got, err := f.st.GetTask(ctx, tk.ID)
	if err != nil || got.State != store.TaskEnded || got.EndedAt == nil {
		t.Fatalf("implicit task after its sandbox ended: %+v %v", got, err)
	}

	tripped, _ := f.g.CreateImplicit(ctx, "", "")
	_ = f.g.AdmitSandbox(ctx, tripped.ID, "s2")
	if _, err := f.g.ReportTokens(ctx, tripped.ID, DefaultBudgets.MaxTokens+1); err != nil {
		t.Fatal(err)
	}
	<-f.trips
	f.g.SandboxEnded(tripped.ID, "s2")
	if err := f.g.Refusal(ctx, tripped.ID); tripCode(err) != "budget_exhausted/max_tokens" {
		t.Fatalf("a tripped implicit task after its sandbox ended: %v", err)
	}
}
