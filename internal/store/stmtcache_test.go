package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// TestStmtCacheInTransaction: a query first run inside a transaction of
// the one-connection writer pool runs unprepared and is prepared in the
// background once that connection is free; later transactions use the
// prepared statement, with the same results. Defends against the
// statement cache deadlocking the store (an earlier cache prepared on a
// miss, and a prepare inside a transaction, or under the governor's lock
// held across a commit, waits forever for the connection the
// transaction holds) and against a cached statement giving other
// results than the query.
func TestStmtCacheInTransaction(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const q = `INSERT INTO commands (sandbox_id, started_at, command, cwd, "user") VALUES (?,?,?,?,?) RETURNING id`
	insert := func() (ids []int64) {
		t.Helper()
		done := make(chan error, 1)
		go func() {
			done <- s.db.inTx(ctx, false, func(tx *tx) error {
				for range 3 {
					var id int64
					if err := tx.QueryRowContext(ctx, q, "sb", 1, "true", "", "user").Scan(&id); err != nil {
						return err
					}
					ids = append(ids, id)
				}
				return nil
			})
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(time.Minute):
			t.Fatal("a transaction using the statement cache never finished (deadlock)")
		}
		return ids
	}
	first := insert()
	deadline := time.Now().Add(30 * time.Second)
	for s.db.wstmts.get(q) == nil {
		if time.Now().After(deadline) {
			t.Fatal("the statement was never prepared")
		}
		time.Sleep(5 * time.Millisecond)
	}
	second := insert()
	want := []int64{1, 2, 3, 4, 5, 6}
	got := append(first, second...)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("ids %v, want %v", got, want)
		}
	}
	cmds, err := s.ListCommands(ctx, "sb")
	if err != nil || len(cmds) != 6 {
		t.Fatalf("%d commands (%v), want 6", len(cmds), err)
	}
}

// TestStmtCacheCloseWaitsForPrepares: close returns only once the
// prepares it started have finished. Defends against a prepare outliving
// the store: one waiting for the pool's connection when the store closed
// ran after Close returned, holding or creating the database's files
// while the caller removed the data dir (a test's TempDir cleanup failed
// with "directory not empty").
func TestStmtCacheCloseWaitsForPrepares(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	c := newStmtCache(s.db.sql)
	// Hold the writer pool's one connection: the prepare waits for it.
	conn, err := s.db.sql.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const q = `SELECT count(*) FROM commands`
	if st := c.get(q); st != nil {
		t.Fatal("a first get returned a statement")
	}
	closed := make(chan struct{})
	go func() {
		c.close()
		close(closed)
	}()
	// While the prepare waits for the connection, close does not return.
	// (Without the wait, it returns at once.)
	select {
	case <-closed:
		t.Fatal("close returned while its prepare was still waiting for a connection")
	case <-time.After(2 * time.Second):
	}
	conn.Close() // the prepare may now run, and close may return
	<-closed
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.preparing) != 0 || len(c.stmts) != 0 {
		t.Fatalf("after close: %d prepares in flight, %d statements kept; want none", len(c.preparing), len(c.stmts))
	}
}
