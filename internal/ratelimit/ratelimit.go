// Package ratelimit provides a token bucket per key (a sandbox id, an agent
// name) with bounded memory, built on [rate.Limiter].
//
// Callers pass the time to every method, so a fake clock can drive it.
package ratelimit

import (
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// MaxKeys is the most keys a [Keyed] tracks; past it the least recently
// seen key is forgotten.
const MaxKeys = 1 << 16

// sweepMin is the fewest new keys between two sweeps for full buckets.
const sweepMin = 64

// Keyed is a token bucket per key: each key may take burst tokens at once
// and perSecond on average. It is safe for concurrent use.
//
// Memory is bounded: a key whose bucket is full again is indistinguishable
// from a new key and may be forgotten, and at most [MaxKeys] keys are
// tracked. A clock that goes backwards refills nothing.
type Keyed struct {
	limit   rate.Limit
	burst   int
	maxKeys int // MaxKeys; smaller in tests

	mu      sync.Mutex
	keys    map[string]*entry
	inserts int // new keys since the last sweep
}

// entry is the bucket of one key.
type entry struct {
	lim *rate.Limiter
	// last is the latest time the key was seen. Every time passed to lim
	// is clamped to at least last, so lim never sees its clock go back
	// (rate.Limiter would count the time between twice).
	last time.Time
}

// New returns a Keyed allowing perSecond tokens per second per key with
// bursts of up to burst. It panics if perSecond is not a positive finite
// number or burst is less than 1.
func New(perSecond float64, burst int) *Keyed {
	if !(perSecond > 0) || math.IsInf(perSecond, 0) {
		panic(fmt.Sprintf("ratelimit: New: rate %v must be positive and finite", perSecond))
	}
	if burst < 1 {
		panic(fmt.Sprintf("ratelimit: New: burst %d must be at least 1", burst))
	}
	return &Keyed{
		limit:   rate.Limit(perSecond),
		burst:   burst,
		maxKeys: MaxKeys,
		keys:    map[string]*entry{},
	}
}

// Allow reports whether key may take a token at time now, and if so takes
// it.
func (k *Keyed) Allow(key string, now time.Time) bool {
	_, _, ok := k.Take(key, now)
	return ok
}

// Take takes a token of key at time now and reports true, or, if none is
// available, takes nothing and reports false and how long until one will
// be (rounded up to the nanosecond, and more than zero).
func (k *Keyed) Take(key string, now time.Time) (tok Token, wait time.Duration, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, t := k.lookup(key, now)
	// Check first: AllowN would also grant a token that is less than a
	// nanosecond away.
	if tokens := e.lim.TokensAt(t); tokens < 1 {
		return Token{}, k.waitFor(1 - tokens), false
	}
	e.lim.AllowN(t, 1) // succeeds: a whole token is there
	return Token{k: k, key: key}, 0, true
}

// Len returns the number of keys tracked.
func (k *Keyed) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.keys)
}

// Token is a token taken by [Keyed.Take]. The zero Token holds nothing.
type Token struct {
	k   *Keyed
	key string
}

// Return gives the token back at time now, so that its key has one token
// more (but never more than the burst), and clears t so that returning it
// again does nothing. If the key was forgotten meanwhile, nothing changes:
// a forgotten key starts anew with a full bucket. Return on the zero Token
// does nothing.
func (t *Token) Return(now time.Time) {
	k, key := t.k, t.key
	if k == nil {
		return
	}
	*t = Token{}
	k.mu.Lock()
	defer k.mu.Unlock()
	if e := k.keys[key]; e != nil {
		// Reservation.CancelAt cannot be used: it restores nothing once
		// time has passed since the take, and less than a token if the key
		// took tokens since. Taking -1 tokens adds exactly one; the limiter
		// caps its tokens at the burst whenever it reads them.
		e.lim.AllowN(e.seen(now), -1)
	}
}

// lookup returns the entry of key, created if new, and the time to pass to
// its limiter. k.mu must be held.
func (k *Keyed) lookup(key string, now time.Time) (*entry, time.Time) {
	if e := k.keys[key]; e != nil {
		return e, e.seen(now)
	}
	k.inserts++
	if k.inserts >= sweepMin && 2*k.inserts >= len(k.keys) {
		k.sweep(now)
	}
	if len(k.keys) >= k.maxKeys {
		k.evictOldest()
	}
	e := &entry{lim: rate.NewLimiter(k.limit, k.burst), last: now}
	k.keys[key] = e
	return e, now
}

// seen records that the key is used at now and returns the time to pass to
// its limiter: now, or the last time seen if the clock went back.
func (e *entry) seen(now time.Time) time.Time {
	if now.After(e.last) {
		e.last = now
	}
	return e.last
}

// sweep forgets every key whose bucket is full: forgetting it changes
// nothing. Amortized over the inserts that trigger it. k.mu must be held.
func (k *Keyed) sweep(now time.Time) {
	for key, e := range k.keys {
		if e.lim.TokensAt(later(now, e.last)) >= float64(k.burst) {
			delete(k.keys, key)
		}
	}
	k.inserts = 0
}

// evictOldest forgets the least recently seen key. k.mu must be held.
func (k *Keyed) evictOldest() {
	var oldest string
	var t time.Time
	first := true
	for key, e := range k.keys {
		if first || e.last.Before(t) {
			oldest, t, first = key, e.last, false
		}
	}
	delete(k.keys, oldest)
}

// waitFor returns how long the bucket takes to gain tokens, rounded up.
func (k *Keyed) waitFor(tokens float64) time.Duration {
	ns := math.Ceil(tokens / float64(k.limit) * float64(time.Second))
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
