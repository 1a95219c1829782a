// Package audit writes corral's audit log: an append-only list of events
// (sandbox lifecycle, egress attempts, policy changes, warnings) kept in
// the store, outside every sandbox. Each event's data is redacted of every
// registered secret value before it is stored. Events are queued and
// written in batches, in the order they were recorded; Record blocks when
// the queue is full rather than dropping an event.
package audit

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corralhq/corral/internal/actor"
	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/store"
)

// QueueSize is how many events may wait to be written before Record blocks.
const QueueSize = 4096

// UnavailableRetry is how long a batch of events is retried while the
// store cannot be reached (store.IsUnavailable) before it is given up
// and the error logged.
const UnavailableRetry = 2 * time.Minute

// maxBatch is the most events written in one transaction.
const maxBatch = 256

// Log is the audit log writer. It is safe for concurrent use.
type Log struct {
	st  *store.Store
	red *egress.Redactor
	log *slog.Logger

	ch   chan item
	done chan struct{}
	// failures counts the batches the store refused after every retry.
	failures atomic.Int64

	closeOnce sync.Once
	mu        sync.RWMutex // guards closed against Record
	closed    bool

	observe func(*store.Event) // set by Observe before use

	wmu     sync.Mutex
	written chan struct{} // closed (and replaced) when a batch is stored; guarded by wmu
}

// Observe makes f see every event as it is recorded (redacted, before it
// is stored), e.g. to count it. f must be quick and must not record
// events. Call it before the log is used.
func (l *Log) Observe(f func(*store.Event)) { l.observe = f }

type item struct {
	ev   *store.Event
	sync chan struct{} // when set: a Sync marker, closed once written
	// err, for an event with a sandbox's end (RecordSandboxEnd), receives
	// the error of that end when the batch could not be stored.
	err *error
}

// New starts a writer for st. red (may be nil) redacts each event's data.
func New(st *store.Store, red *egress.Redactor, log *slog.Logger) *Log {
	if log == nil {
		log = slog.Default()
	}
	l := &Log{st: st, red: red, log: log, ch: make(chan item, QueueSize), done: make(chan struct{}), written: make(chan struct{})}
	go l.run()
	return l
}

// Record queues one event. data is marshalled to a JSON object; kind is a
// dotted name such as "egress.http" or "sandbox.created". An event of a
// sandbox is stored with the sandbox's task (the store looks it up), so
// callers never pass it.
func (l *Log) Record(sandbox, kind string, data any) {
	l.RecordTask(sandbox, "", kind, data)
}

// RecordBy is Record for an event caused by a request: the event also
// records the team and API key id of the actor ctx carries (never the
// key). An event of a sandbox belongs to the sandbox's team whoever
// caused it.
func (l *Log) RecordBy(ctx context.Context, sandbox, kind string, data any) {
	l.record(actor.From(ctx), sandbox, "", kind, data)
}

// RecordTask is Record for an event that belongs to a task, for events
// of a task itself (budgets, breakers) that may name no sandbox.
func (l *Log) RecordTask(sandbox, task, kind string, data any) {
	l.record(actor.Actor{}, sandbox, task, kind, data)
}

// RecordTaskBy is RecordTask for an event caused by a request (see
// RecordBy).
func (l *Log) RecordTaskBy(ctx context.Context, sandbox, task, kind string, data any) {
	l.record(actor.From(ctx), sandbox, task, kind, data)
}

// RecordCommandEnd is RecordBy for the event of a command's end: cmd's
// end record (store.Store.EndCommand) is written in the transaction that
// stores the event, so that the two commit together, in one commit,
// without the caller waiting for it. Until then (and if the control
// plane crashes first) the command's record has no end; the recovery at
// the next start closes it (see sandbox.Manager.Reconcile).
func (l *Log) RecordCommandEnd(ctx context.Context, sandbox string, cmd *store.Command, kind string, data any) {
	l.recordEvent(actor.From(ctx), sandbox, "", kind, data, cmd)
}

// RecordSandboxEnd is RecordBy for the event of a sandbox's end: end is
// written in the transaction that stores the event, before it, and the
// event is stored only if end ended the record (store.Event.EndsSandbox).
// It defends against two ends of one sandbox racing (an owner's TTL or
// kill and another control plane's kill, under a shared runtime) both
// recording sandbox.ended while the record has one end: the store's
// conditional update decides both. It waits for the commit (the events
// recorded before it are stored first) and reports whether end ended
// the record; only then does the event count (Observe).
func (l *Log) RecordSandboxEnd(ctx context.Context, end *store.SandboxEnd, kind string, data any) (bool, error) {
	ev := l.event(actor.From(ctx), end.ID, "", kind, data)
	ev.EndsSandbox = end
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		l.log.Error("audit event after close", "sandbox", end.ID, "kind", kind)
		err := l.st.AppendEvents(context.WithoutCancel(ctx), []*store.Event{ev})
		return end.Ended, err
	}
	done := make(chan struct{})
	var err error
	l.ch <- item{ev: ev, sync: done, err: &err}
	l.mu.RUnlock()
	l.st.Hurry()
	<-done
	if end.Ended && l.observe != nil {
		l.observe(ev)
	}
	return end.Ended, err
}

func (l *Log) record(by actor.Actor, sandbox, task, kind string, data any) {
	l.recordEvent(by, sandbox, task, kind, data, nil)
}

// event makes the event to store: data marshalled and redacted.
func (l *Log) event(by actor.Actor, sandbox, task, kind string, data any) *store.Event {
	b, err := json.Marshal(data)
	if err != nil || len(b) == 0 || b[0] != '{' {
		b = []byte("{}")
	}
	if l.red != nil {
		b = l.red.RedactBytes(b)
	}
	return &store.Event{At: time.Now().UTC(), SandboxID: sandbox, TaskID: task, Team: by.Team, KeyID: by.KeyID, Kind: kind, Data: json.RawMessage(b)}
}

func (l *Log) recordEvent(by actor.Actor, sandbox, task, kind string, data any, ends *store.Command) {
	ev := l.event(by, sandbox, task, kind, data)
	ev.EndsCommand = ends
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		l.log.Error("audit event after close", "sandbox", sandbox, "kind", kind)
		if ends != nil {
			// Not lost with the event: written at once.
			if err := l.st.EndCommand(context.Background(), ends); err != nil {
				l.log.Error("record command end", "sandbox", sandbox, "err", err)
			}
		}
		return
	}
	if l.observe != nil {
		l.observe(ev)
	}
	l.ch <- item{ev: ev}
}

// Stats returns the events waiting to be written (the queue holds at
// most QueueSize; Record blocks when it is full) and how many batches
// the store refused after every retry since the log started (their
// events are lost; the log says so).
func (l *Log) Stats() (queued int, writeFailures int64) {
	return len(l.ch), l.failures.Load()
}

// Written returns a channel that is closed once the next batch of events
// is stored. A follower takes it before it reads the store, so an event
// stored after that read closes the channel it waits on and none is
// missed (the event stream, GET /v1/events/stream).
func (l *Log) Written() <-chan struct{} {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return l.written
}

// Sync returns once every event recorded before it was called is stored.
func (l *Log) Sync() {
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return
	}
	done := make(chan struct{})
	l.ch <- item{sync: done}
	l.mu.RUnlock()
	// A batch waiting for company (store.AppendEventsLazy) commits now.
	l.st.Hurry()
	<-done
}

// Close writes what is queued and stops the writer.
func (l *Log) Close() {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		close(l.ch)
		l.mu.Unlock()
		<-l.done
	})
}

func (l *Log) run() {
	defer close(l.done)
	var batch []*store.Event
	var syncs []chan struct{}
	var ends []item // the items of batch with a sandbox's end
	flush := func() {
		if len(batch) > 0 {
			// Retry a failed write a few times, and while the store
			// cannot be reached (a PostgreSQL store restarting or
			// failing over) for up to UnavailableRetry: an event is
			// never dropped silently (Record blocks once the queue is
			// full); if the store stays broken the error is logged.
			var err error
			start := time.Now()
			for try := 0; ; try++ {
				// Nobody waits for a batch without a Sync marker: it may
				// share the commit of a command start that follows within
				// store.LazyCommitDelay (docs/brakes.md, "Durability").
				if len(syncs) == 0 {
					err = l.st.AppendEventsLazy(context.Background(), batch)
				} else {
					err = l.st.AppendEvents(context.Background(), batch)
				}
				if err == nil {
					break
				}
				if try >= 4 && (!store.IsUnavailable(err) || time.Since(start) > UnavailableRetry) {
					break
				}
				time.Sleep(min(time.Duration(try+1)*50*time.Millisecond, time.Second))
			}
			if err != nil {
				l.log.Error("audit log write failed", "events", len(batch), "err", err)
				l.failures.Add(1)
				// The events are lost; the command end records they
				// carried are tried alone.
				for _, ev := range batch {
					if ev.EndsCommand != nil {
						if err := l.st.EndCommand(context.Background(), ev.EndsCommand); err != nil {
							l.log.Error("record command end", "sandbox", ev.SandboxID, "err", err)
						}
					}
				}
				// And so are the sandbox ends, whose callers wait.
				for _, it := range ends {
					e := it.ev.EndsSandbox
					e.Ended, *it.err = l.st.EndSandboxFirst(context.Background(), e.ID, e.Reason, e.Error, e.At)
				}
			}
			batch, ends = batch[:0], ends[:0]
			l.wmu.Lock()
			close(l.written)
			l.written = make(chan struct{})
			l.wmu.Unlock()
		}
		for _, s := range syncs {
			close(s)
		}
		syncs = syncs[:0]
	}
	for it := range l.ch {
		l.add(it, &batch, &syncs, &ends)
		// Take whatever else is already queued, up to a batch.
	more:
		for len(batch) < maxBatch {
			select {
			case it2, ok := <-l.ch:
				if !ok {
					break more
				}
				l.add(it2, &batch, &syncs, &ends)
			default:
				break more
			}
		}
		flush()
	}
	flush()
}

func (l *Log) add(it item, batch *[]*store.Event, syncs *[]chan struct{}, ends *[]item) {
	if it.sync != nil {
		*syncs = append(*syncs, it.sync)
	}
	if it.ev == nil {
		return
	}
	*batch = append(*batch, it.ev)
	if it.ev.EndsSandbox != nil {
		*ends = append(*ends, it)
	}
}
