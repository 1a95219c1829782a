package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestCommandRecordsCommitWithTheirCompanions: a command's start record
// is written in one transaction with its task's call counter (a counter
// that cannot be written leaves no command record) and its end record
// with its audit event (AppendEvents with EndsCommand stores both).
// Defends against a counted call without a record or a record without
// its count, and against an end record that the audit batch does not
// write.
func TestCommandRecordsCommitWithTheirCompanions(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		s, err := Open(bk.addr(t))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		now := time.Now().UTC().Truncate(time.Millisecond)
		if err := s.InsertSandbox(ctx, &Sandbox{ID: "sb", Template: "base", Runtime: "runc", Tier: "light", State: StateRunning, CreatedAt: now, ExpiresAt: now}); err != nil {
			t.Fatal(err)
		}
		tk := &Task{ID: "t1", Agent: "a", State: TaskOpen, Budgets: TaskBudgets{MaxCalls: 5}, OnTrip: "kill", CreatedAt: now}
		if err := s.InsertTask(ctx, tk); err != nil {
			t.Fatal(err)
		}
		// A task that does not exist: the command is not recorded either.
		if _, err := s.StartCommand(ctx, &Command{SandboxID: "sb", StartedAt: now, Command: "ls"}, &Task{ID: "missing"}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("start with a missing task: %v, want ErrNotFound", err)
		}
		if cmds, _ := s.ListCommands(ctx, "sb"); len(cmds) != 0 {
			t.Fatalf("a command was recorded without its counter: %+v", cmds)
		}
		tk.Usage.Calls = 1
		c := &Command{SandboxID: "sb", StartedAt: now, Command: "true", User: "user"}
		if c.ID, err = s.StartCommand(ctx, c, tk); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetTask(ctx, "t1")
		if err != nil || got.Usage.Calls != 1 {
			t.Fatalf("stored calls: %+v %v, want 1", got, err)
		}
		code := 0
		c.EndedAt, c.ExitCode = &now, &code
		if err := s.AppendEvents(ctx, []*Event{{SandboxID: "sb", Kind: "command", Data: []byte(`{}`), EndsCommand: c}}); err != nil {
			t.Fatal(err)
		}
		cmds, _ := s.ListCommands(ctx, "sb")
		if len(cmds) != 1 || cmds[0].EndedAt == nil || cmds[0].ExitCode == nil || *cmds[0].ExitCode != 0 {
			t.Fatalf("end record: %+v", cmds)
		}
		evs, err := s.ListEvents(ctx, EventFilter{SandboxID: "sb", Kind: "command"})
		if err != nil || len(evs) != 1 {
			t.Fatalf("command events: %d %v, want 1", len(evs), err)
		}
	})
}
