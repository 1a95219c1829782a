package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// openGrouped opens a SQLite store whose lazy writes wait delay for
// company.
func openGrouped(t *testing.T, delay time.Duration) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.db.group.delay = delay
	return s
}

// lazyEvents queues a batch of n events lazily (the audit writer's way)
// and returns the channel of its result.
func lazyEvents(s *Store, kind string, n int) <-chan error {
	done := make(chan error, 1)
	go func() {
		evs := make([]*Event, n)
		for i := range evs {
			evs[i] = &Event{SandboxID: "sb", Kind: kind, Data: []byte(`{}`)}
		}
		done <- s.AppendEventsLazy(context.Background(), evs)
	}()
	return done
}

// waitCommitted polls until n events of kind are stored.
func waitCommitted(t *testing.T, s *Store, kind string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		evs, err := s.ListEvents(context.Background(), EventFilter{Kind: kind})
		if err == nil && len(evs) == n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%d %s events never committed", n, kind)
}

// TestGroupCommitSharesOneCommit: an audit batch waiting for company
// and a command start record queued after it commit in one transaction
// (one fsync), both stored. Defends against the start record of the
// next command waiting for the previous command's end-and-event commit
// to finish before its own (two fsyncs on the exec path, the second
// waiting behind the first).
func TestGroupCommitSharesOneCommit(t *testing.T) {
	s := openGrouped(t, time.Hour)
	ctx := context.Background()
	before := s.db.group.commits.Load()
	lazy := lazyEvents(s, "lazy", 3)
	// The lazy batch is held (an hour) until the start record comes.
	deadline := time.Now().Add(30 * time.Second)
	for s.db.group.waiting.Load() != 1 {
		select {
		case err := <-lazy:
			t.Fatalf("a lazy batch committed alone at once: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the lazy batch never waited for company")
		}
		time.Sleep(time.Millisecond)
	}
	id, err := s.StartCommand(ctx, &Command{SandboxID: "sb", StartedAt: time.Now(), Command: "true"}, nil)
	if err != nil || id == 0 {
		t.Fatalf("start command: %d, %v", id, err)
	}
	if err := <-lazy; err != nil {
		t.Fatalf("lazy batch: %v", err)
	}
	if n := s.db.group.commits.Load() - before; n != 1 {
		t.Fatalf("%d commits for a lazy batch and a start record, want 1", n)
	}
	waitCommitted(t, s, "lazy", 3)
	cmds, err := s.ListCommands(ctx, "sb")
	if err != nil || len(cmds) != 1 || cmds[0].ID != id {
		t.Fatalf("commands %+v, %v; want the one started", cmds, err)
	}
}

// TestGroupCommitLazyAlone: a lazy batch that no eager write joins is
// committed alone once its delay is up, and at once on Hurry. Defends
// against audit events left uncommitted (lost at a crash long after they
// were recorded) while no command starts, and against a Sync (GET
// /v1/audit) waiting out the delay.
func TestGroupCommitLazyAlone(t *testing.T) {
	t.Run("delay", func(t *testing.T) {
		s := openGrouped(t, time.Millisecond)
		if err := <-lazyEvents(s, "alone", 2); err != nil {
			t.Fatal(err)
		}
		waitCommitted(t, s, "alone", 2)
	})
	t.Run("hurry", func(t *testing.T) {
		s := openGrouped(t, time.Hour)
		lazy := lazyEvents(s, "hurried", 2)
		deadline := time.Now().Add(30 * time.Second)
		for {
			s.Hurry()
			select {
			case err := <-lazy:
				if err != nil {
					t.Fatal(err)
				}
				waitCommitted(t, s, "hurried", 2)
				return
			case <-time.After(10 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatal("a hurried lazy batch never committed")
			}
		}
	})
}

// TestGroupCommitFailureIsolated: in a group of writes that share a
// transaction, one that fails is rolled back alone (its rows are
// absent) and reports its own error; the others commit. Defends against
// one bad write of a group losing the others' records, or committing
// half of itself.
func TestGroupCommitFailureIsolated(t *testing.T) {
	s := openGrouped(t, time.Hour)
	ctx := context.Background()
	boom := errors.New("boom")
	insert := func(kind string, fail bool) func(*tx) error {
		return func(tx *tx) error {
			if err := appendEvents(ctx, tx, []*Event{{SandboxID: "sb", Kind: kind, Data: []byte(`{}`)}}); err != nil {
				return err
			}
			if fail {
				return boom
			}
			return nil
		}
	}
	a := s.db.queue(insert("a", false), true)
	bad := s.db.queue(insert("bad", true), true)
	c := s.db.queue(insert("c", false), false) // eager: commits the group
	if err := <-a; err != nil {
		t.Fatalf("a: %v", err)
	}
	if err := <-bad; !errors.Is(err, boom) {
		t.Fatalf("bad: %v, want its own error", err)
	}
	if err := <-c; err != nil {
		t.Fatalf("c: %v", err)
	}
	for kind, want := range map[string]int{"a": 1, "bad": 0, "c": 1} {
		evs, err := s.ListEvents(ctx, EventFilter{Kind: kind})
		if err != nil || len(evs) != want {
			t.Errorf("%s events: %d (%v), want %d", kind, len(evs), err, want)
		}
	}
}

// TestQueuedTaskUpdatesCommitInOrder: task writes queued one after
// another (as the governor queues them under its lock and waits after
// releasing it) are stored in the order queued: the last one wins.
// Defends against a call counter that goes back in the store when an
// older snapshot commits after a newer one.
func TestQueuedTaskUpdatesCommitInOrder(t *testing.T) {
	s := openGrouped(t, time.Hour)
	ctx := context.Background()
	task := &Task{ID: "t1", Team: DefaultTeam, Agent: "a", State: TaskOpen, OnTrip: "kill", CreatedAt: time.Now()}
	if err := s.InsertTask(ctx, task); err != nil {
		t.Fatal(err)
	}
	var waits []func() (int64, error)
	const n = 200
	for i := 1; i <= n; i++ {
		task.Usage.Calls = int64(i)
		waits = append(waits, s.QueueStartCommand(ctx, &Command{SandboxID: "sb", StartedAt: time.Now(), Command: "true"}, task))
	}
	// Waited for in reverse: the order of waiting changes nothing.
	for i := len(waits) - 1; i >= 0; i-- {
		if _, err := waits[i](); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.GetTask(ctx, "t1")
	if err != nil || got.Usage.Calls != n {
		t.Fatalf("stored calls %+v (%v), want %d", got, err, n)
	}
	cmds, err := s.ListCommands(ctx, "sb")
	if err != nil || len(cmds) != n {
		t.Fatalf("%d command records (%v), want %d", len(cmds), err, n)
	}
}
