package agent

import (
	"net/http"
	"runtime/debug"
	"sync"
	"time"
)

// defaultIdleTrimAfter is how long the agent waits, with no request in
// flight, before it returns its free heap to the host.
const defaultIdleTrimAfter = 10 * time.Second

// idleGCPercent is the agent's GOGC when the environment sets none: a
// heap goal half the default's keeps what a burst of requests leaves
// resident small, at a little more collection work per request.
const idleGCPercent = 50

// idleTrimmer returns the agent's free memory to the host once no
// request has been in flight for idleTrimAfter. An agent idles most of
// its life, in every sandbox: without it, the heap a burst of requests
// grew to stays resident (Go's scavenger gives it back only slowly),
// multiplied by the number of idle sandboxes. No timer runs while a
// request is in flight or once the memory was returned.
type idleTrimmer struct {
	// after and free default to defaultIdleTrimAfter and
	// debug.FreeOSMemory (tests set them).
	after time.Duration
	free  func()

	mu sync.Mutex
	// inflight counts requests being served. Guarded by mu.
	inflight int
	// timer fires idleTrimAfter after the last request ended. Guarded by mu.
	timer *time.Timer
}

// startTrimAfter is how long after it started to serve an agent that
// had no request returns what its start-up allocated and dropped.
const startTrimAfter = time.Second

// arm makes the trimmer return the free memory after d unless a request
// comes first (then the memory goes back idleTrimAfter after the last
// request ends, as always). The agent arms it when it starts to serve,
// instead of returning the memory there and then: a create's first
// command follows the start at once, and a forced collection running
// when it arrives, and the faults of taking back the heap just given
// back, delayed that command by milliseconds.
func (t *idleTrimmer) arm(d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.inflight > 0 || t.timer != nil {
		return
	}
	t.timer = time.AfterFunc(d, t.trim)
}

// wrap counts the requests h serves.
func (t *idleTrimmer) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.mu.Lock()
		t.inflight++
		if t.timer != nil {
			t.timer.Stop()
		}
		t.mu.Unlock()
		defer t.done()
		h.ServeHTTP(w, r)
	})
}

func (t *idleTrimmer) done() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.inflight--
	if t.inflight > 0 {
		return
	}
	after := t.after
	if after == 0 {
		after = defaultIdleTrimAfter
	}
	if t.timer == nil {
		t.timer = time.AfterFunc(after, t.trim)
		return
	}
	t.timer.Reset(after)
}

func (t *idleTrimmer) trim() {
	t.mu.Lock()
	busy := t.inflight > 0
	t.mu.Unlock()
	if busy {
		return
	}
	if t.free != nil {
		t.free()
		return
	}
	debug.FreeOSMemory()
}
