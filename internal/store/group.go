package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// LazyCommitDelay is how long a write that nobody waits for at once (a
// batch of audit events, with the command end records it carries) may
// wait for company before it is committed alone: a write that must commit
// now (a command's start record) arriving meanwhile takes it along in
// its own commit, so that the two share one fsync instead of the second
// waiting behind the first. Until then the lazy write is not committed
// (docs/brakes.md, "Durability").
const LazyCommitDelay = 2 * time.Millisecond

// maxGroup bounds the writes committed in one transaction.
const maxGroup = 256

// ErrClosed is the error of a write submitted after the store closed.
var ErrClosed = errors.New("store closed")

// groupCommit is SQLite's group commit: the store's hot writes (command
// start records, task counters, audit event batches) are queued to one
// goroutine that runs the writes queued together in one transaction,
// each in a savepoint of its own (a write that fails is rolled back
// alone and reports its own error), and commits them with one fsync.
// Writes commit in the order they were queued. A write is eager (its
// caller waits for the commit: it is run with whatever is queued at
// once) or lazy (it may wait up to LazyCommitDelay for an eager one to
// join). SQLite has one writer anyway: grouping only saves fsyncs and
// the wait of one commit behind another.
type groupCommit struct {
	sql *db
	// delay is how long a lazy write waits (LazyCommitDelay; tests set
	// their own before the first write).
	delay time.Duration
	// commits counts the transactions committed and waiting the groups
	// of lazy writes waiting for company (for tests).
	commits, waiting atomic.Int64

	mu     sync.RWMutex // guards closed against submit
	closed bool
	reqs   chan *groupReq
	hurry  chan struct{}
	done   chan struct{}
}

// groupReq is one queued write.
type groupReq struct {
	fn func(*tx) error
	// lazyUntil: zero for an eager write; else the time by which a lazy
	// one is committed even alone.
	lazyUntil time.Time
	err       error
	done      chan error
}

func newGroupCommit(c *db) *groupCommit {
	g := &groupCommit{sql: c, delay: LazyCommitDelay, reqs: make(chan *groupReq, 4*maxGroup), hurry: make(chan struct{}, 1), done: make(chan struct{})}
	go g.run()
	return g
}

// submit queues fn (lazy: it may wait LazyCommitDelay for company) and
// returns the channel its result arrives on, once committed (or failed).
// fn must not be interrupted by its caller's cancellation (its
// statements run with a context without cancellation): an interrupted
// statement would roll back the transaction others share.
func (g *groupCommit) submit(fn func(*tx) error, lazy bool) <-chan error {
	r := &groupReq{fn: fn, done: make(chan error, 1)}
	if lazy {
		r.lazyUntil = time.Now().Add(g.delay)
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.closed {
		r.done <- ErrClosed
		return r.done
	}
	g.reqs <- r
	return r.done
}

// Hurry makes a lazy write waiting for company commit now.
func (g *groupCommit) Hurry() {
	select {
	case g.hurry <- struct{}{}:
	default:
	}
}

// close commits what is queued and stops the goroutine.
func (g *groupCommit) close() {
	g.mu.Lock()
	if !g.closed {
		g.closed = true
		close(g.reqs)
	}
	g.mu.Unlock()
	<-g.done
}

func (g *groupCommit) run() {
	defer close(g.done)
	var group []*groupReq
	for {
		r, ok := <-g.reqs
		if !ok {
			return
		}
		group = append(group[:0], r)
		open := g.take(&group)
		if open && lazyGroup(group) {
			open = g.wait(&group)
		}
		g.commit(group)
		if !open {
			// The queue closed: commit what is left, group by group.
			for len(g.reqs) > 0 {
				group = group[:0]
				g.take(&group)
				g.commit(group)
			}
			return
		}
	}
}

// take adds what is queued now to group (up to maxGroup); false when the
// queue closed.
func (g *groupCommit) take(group *[]*groupReq) bool {
	for len(*group) < maxGroup {
		select {
		case r, ok := <-g.reqs:
			if !ok {
				return false
			}
			*group = append(*group, r)
		default:
			return true
		}
	}
	return true
}

// lazyGroup reports whether every write of group is lazy.
func lazyGroup(group []*groupReq) bool {
	for _, r := range group {
		if r.lazyUntil.IsZero() {
			return false
		}
	}
	return true
}

// wait holds a group of lazy writes until the first one's time is up,
// an eager write joins, Hurry is called or the group is full; false
// when the queue closed.
func (g *groupCommit) wait(group *[]*groupReq) bool {
	t := time.NewTimer(time.Until((*group)[0].lazyUntil))
	defer t.Stop()
	g.waiting.Add(1)
	defer g.waiting.Add(-1)
	for len(*group) < maxGroup {
		select {
		case r, ok := <-g.reqs:
			if !ok {
				return false
			}
			*group = append(*group, r)
			if r.lazyUntil.IsZero() {
				return g.take(group)
			}
		case <-g.hurry:
			return g.take(group)
		case <-t.C:
			return g.take(group)
		}
	}
	return true
}

// commit runs group in one transaction, each write in a savepoint of
// its own, commits, and answers each write.
func (g *groupCommit) commit(group []*groupReq) {
	if len(group) == 0 {
		return
	}
	err := g.run1(group)
	for _, r := range group {
		if r.err == nil {
			r.err = err
		}
		r.done <- r.err
	}
}

func (g *groupCommit) run1(group []*groupReq) error {
	ctx := context.Background()
	t, err := g.sql.sql.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer t.Rollback()
	tt := &tx{t, g.sql.d, g.sql.wstmts}
	if len(group) == 1 {
		if group[0].err = group[0].fn(tt); group[0].err != nil {
			return nil // rolled back by the deferred Rollback
		}
		return g.commitTx(t)
	}
	for i, r := range group {
		sp := "g" + strconv.Itoa(i)
		if _, err := t.ExecContext(ctx, "SAVEPOINT "+sp); err != nil {
			return fmt.Errorf("group commit: %w", err)
		}
		if r.err = r.fn(tt); r.err != nil {
			if _, err := t.ExecContext(ctx, "ROLLBACK TO "+sp); err != nil {
				return fmt.Errorf("group commit: %w", err)
			}
		}
		if _, err := t.ExecContext(ctx, "RELEASE "+sp); err != nil {
			return fmt.Errorf("group commit: %w", err)
		}
	}
	return g.commitTx(t)
}

func (g *groupCommit) commitTx(t *sql.Tx) error {
	if err := t.Commit(); err != nil {
		return err
	}
	g.commits.Add(1)
	return nil
}
