package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestTasksRoundTrip(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		path := bk.addr(t)
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now().UTC().Truncate(time.Millisecond)
		tk := &Task{ID: "t1", Agent: "a", State: TaskOpen, Budgets: TaskBudgets{MaxCalls: 30, MaxTokens: 1000},
			OnTrip: "kill", Artifacts: []string{"/home/user/out"}, CreatedAt: now}
		if err := s.InsertTask(ctx, tk); err != nil {
			t.Fatal(err)
		}
		tk.Usage.Calls = 3
		tk.State = TaskTripped
		tk.Breaker = Breaker{Open: true, Code: "budget_exhausted", Budget: "max_calls", At: &now}
		if err := s.UpdateTask(ctx, tk); err != nil {
			t.Fatal(err)
		}
		if err := s.InsertSandbox(ctx, &Sandbox{ID: "s1", Template: "base", Runtime: "runc", Tier: "light", Network: "none",
			State: StateRunning, CreatedAt: now, ExpiresAt: now, TaskID: "t1"}); err != nil {
			t.Fatal(err)
		}
		s.Close()
		s, err = Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		got, err := s.GetTask(ctx, "t1")
		if err != nil {
			t.Fatal(err)
		}
		if got.Usage.Calls != 3 || got.State != TaskTripped || !got.Breaker.Open || got.Breaker.Budget != "max_calls" ||
			got.Budgets.MaxCalls != 30 || len(got.Artifacts) != 1 {
			t.Fatalf("task after reopen: %+v", got)
		}
		ids, err := s.TaskSandboxes(ctx, "t1", StateRunning)
		if err != nil || len(ids) != 1 || ids[0] != "s1" {
			t.Fatalf("task sandboxes %v %v", ids, err)
		}
		list, err := s.ListTasks(ctx, TaskFilter{States: []string{TaskOpen}})
		if err != nil || len(list) != 0 {
			t.Fatalf("open tasks %v %v", list, err)
		}
		if _, err := s.GetTask(ctx, "nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("missing task: %v", err)
		}
	})
}
