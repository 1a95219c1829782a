package store

import (
	"context"
	"database/sql"
	"sync"
)

// maxCachedStmts bounds a statement cache: the store's queries are
// constants, but a few are built from a filter (ListSandboxes,
// ListEvents), so their number is bounded only by the filters' shapes.
const maxCachedStmts = 256

// stmtCache keeps a pool's prepared statements by query text, so that
// SQLite does not parse a hot query again on every call. A statement is
// prepared on the pool (a *sql.Stmt of the *sql.DB, which database/sql
// prepares again on each connection it runs on), never on a connection
// or a transaction, and always in the background after the first miss:
// no caller ever waits for a prepare. That is what makes it safe with
// the writer pool's single connection: a prepare inside a transaction
// (or under a lock held across a commit) would wait for the one
// connection that transaction holds, forever. A transaction uses a
// cached statement through Tx.StmtContext, which runs it on the
// transaction's own connection.
type stmtCache struct {
	pool *sql.DB

	mu sync.Mutex
	// stmts are the prepared statements; preparing marks the queries
	// being prepared; closed: no more are kept. Guarded by mu.
	stmts     map[string]*sql.Stmt
	preparing map[string]bool
	closed    bool
	// prepares counts the background prepares not yet finished; close
	// waits for them.
	prepares sync.WaitGroup
}

func newStmtCache(pool *sql.DB) *stmtCache {
	return &stmtCache{pool: pool, stmts: map[string]*sql.Stmt{}, preparing: map[string]bool{}}
}

// get returns the prepared statement of q, or nil (the caller runs q
// unprepared) after starting its prepare in the background.
func (c *stmtCache) get(q string) *sql.Stmt {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.stmts[q]; st != nil {
		return st
	}
	if c.closed || c.preparing[q] || len(c.stmts)+len(c.preparing) >= maxCachedStmts {
		return nil
	}
	c.preparing[q] = true
	c.prepares.Add(1)
	go c.prepare(q)
	return nil
}

func (c *stmtCache) prepare(q string) {
	defer c.prepares.Done()
	st, err := c.pool.PrepareContext(context.Background(), q)
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.preparing, q)
	if err != nil {
		return // run unprepared; the next miss tries again
	}
	if c.closed {
		st.Close()
		return
	}
	c.stmts[q] = st
}

// close closes the prepared statements (before the pool closes) and
// waits for the prepares in flight. Defends against a prepare outliving
// the store: one still waiting for a connection would otherwise run
// after Close returned, opening the database's files while the caller
// removes its data directory.
func (c *stmtCache) close() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.closed = true
	for q, st := range c.stmts {
		st.Close()
		delete(c.stmts, q)
	}
	c.mu.Unlock()
	c.prepares.Wait()
}
