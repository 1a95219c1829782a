package store

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestEventRetention defends against an audit log that only grows (issue
// 10 item 4: nothing ever deleted events): the retention bounds by age
// and by count pick the oldest events, DeleteEventsThrough deletes
// exactly those, oldest first and across several batches, and the table
// stays append-only for everything else — a delete of any other event,
// or of every event, is still refused, also in a database made before
// retention existed (its unconditional trigger is replaced on open).
func TestEventRetention(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		path := bk.addr(t)
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		// A SQLite database of the previous release: the old trigger.
		// (PostgreSQL stores began after retention.)
		if bk.name == "sqlite" {
			if _, err := s.db.Exec(`DROP TRIGGER events_append_only_delete; DROP TABLE events_prune;
			CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;`); err != nil {
				t.Fatal(err)
			}
		}
		s.Close()
		if s, err = Open(path); err != nil {
			t.Fatal(err)
		}
		defer s.Close()

		const n = 2*pruneBatch + 100
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		evs := make([]*Event, n)
		for i := range evs {
			evs[i] = &Event{At: t0.Add(time.Duration(i) * time.Second), Kind: "test", Data: []byte(fmt.Sprintf(`{"i":%d}`, i))}
		}
		if err := s.AppendEvents(ctx, evs); err != nil {
			t.Fatal(err)
		}
		first := evs[0].ID
		tests := []struct {
			name   string
			before time.Time
			keep   int64
			want   int64 // cut id, relative to the first event (-1: none)
		}{
			{"no bounds", time.Time{}, 0, -1},
			{"age", t0.Add(10 * time.Second), 0, 9},
			{"size", time.Time{}, n - 25, 24},
			{"both: the larger cut wins", t0.Add(10 * time.Second), n - 25, 24},
			{"within both", t0.Add(-time.Hour), n, -1},
		}
		for _, tc := range tests {
			cut, err := s.EventsBeyond(ctx, tc.before, tc.keep)
			if err != nil {
				t.Fatal(err)
			}
			want := int64(0)
			if tc.want >= 0 {
				want = first + tc.want
			}
			if cut != want {
				t.Errorf("%s: cut %d, want %d", tc.name, cut, want)
			}
		}
		// Nothing but retention deletes: not the newest, not all.
		for _, q := range []string{`DELETE FROM events WHERE id = (SELECT MAX(id) FROM events)`, `DELETE FROM events`} {
			if _, err := s.db.Exec(q); err == nil {
				t.Fatalf("%s succeeded", q)
			}
		}
		cut := first + 2*pruneBatch + 9 // more than one batch
		got, err := s.DeleteEventsThrough(ctx, cut)
		if err != nil || got != 2*pruneBatch+10 {
			t.Fatalf("deleted %d (%v), want %d", got, err, 2*pruneBatch+10)
		}
		left, err := s.ListEvents(ctx, EventFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(left) != n-(2*pruneBatch+10) || left[0].ID != cut+1 {
			t.Fatalf("%d events left starting at %d, want %d from %d", len(left), left[0].ID, n-(2*pruneBatch+10), cut+1)
		}
		if c, _ := s.CountEvents(ctx); c != int64(len(left)) {
			t.Fatalf("CountEvents %d, want %d", c, len(left))
		}
		for _, q := range []string{`DELETE FROM events WHERE id = (SELECT MAX(id) FROM events)`, `DELETE FROM events`} {
			if _, err := s.db.Exec(q); err == nil {
				t.Fatalf("after a prune, %s succeeded", q)
			}
		}
	})
}

// TestPruneCommands: command records of ended commands go by age and by
// count, oldest first; a command still running is kept whatever its age.
func TestPruneCommands(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		var ids []int64
		for i := 0; i < 10; i++ {
			c := &Command{SandboxID: "sb", StartedAt: t0.Add(time.Duration(i) * time.Hour), Command: fmt.Sprint("cmd ", i)}
			id, err := s.StartCommand(ctx, c, nil)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
			if i == 0 {
				continue // still running
			}
			end := c.StartedAt.Add(time.Minute)
			c.ID, c.EndedAt = id, &end
			if err := s.EndCommand(ctx, c); err != nil {
				t.Fatal(err)
			}
		}
		remaining := func() []string {
			cs, err := s.ListCommands(ctx, "sb")
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, c := range cs {
				out = append(out, c.Command)
			}
			return out
		}
		if n, err := s.PruneCommands(ctx, t0.Add(3*time.Hour), 0); err != nil || n != 2 {
			t.Fatalf("age: pruned %d (%v), want 2 (commands 1 and 2)", n, err)
		}
		if n, err := s.PruneCommands(ctx, time.Time{}, 4); err != nil || n != 3 {
			t.Fatalf("size: pruned %d (%v), want 3 (commands 3, 4, 5)", n, err)
		}
		if got := fmt.Sprint(remaining()); got != "[cmd 0 cmd 6 cmd 7 cmd 8 cmd 9]" {
			t.Fatalf("left %s", got)
		}
		if n, err := s.PruneCommands(ctx, time.Time{}, 0); err != nil || n != 0 {
			t.Fatalf("no bounds: pruned %d (%v)", n, err)
		}
	})
}
