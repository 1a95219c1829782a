package ratelimit

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func TestAllow(t *testing.T) {
	type step struct {
		key  string
		at   time.Duration
		want bool
	}
	tests := []struct {
		name  string
		rate  float64
		burst int
		steps []step
	}{
		{"burst then refuse", 1, 3, []step{
			{"a", 0, true}, {"a", 0, true}, {"a", 0, true}, {"a", 0, false},
		}},
		{"refill one per second", 1, 2, []step{
			{"a", 0, true}, {"a", 0, true}, {"a", 0, false},
			{"a", 500 * time.Millisecond, false}, {"a", time.Second, true}, {"a", time.Second, false},
		}},
		{"keys are independent", 1, 1, []step{
			{"a", 0, true}, {"a", 0, false}, {"b", 0, true}, {"b", 0, false},
		}},
		{"refill caps at burst", 10, 2, []step{
			{"a", 0, true}, {"a", time.Hour, true}, {"a", time.Hour, true}, {"a", time.Hour, false},
		}},
		{"clock going backwards refills nothing", 1, 1, []step{
			{"a", 10 * time.Second, true}, {"a", 0, false}, {"a", 10 * time.Second, false}, {"a", 11 * time.Second, true},
		}},
		{"token taken while the clock is back counts from the latest time", 1, 2, []step{
			{"a", 10 * time.Second, true}, {"a", 0, true}, {"a", 0, false},
			{"a", 10 * time.Second, false}, {"a", 11 * time.Second, true}, {"a", 11 * time.Second, false},
		}},
		{"fractional rate", 0.5, 1, []step{
			{"a", 0, true}, {"a", time.Second, false}, {"a", 2 * time.Second, true},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := New(tc.rate, tc.burst)
			for i, s := range tc.steps {
				if got := k.Allow(s.key, t0.Add(s.at)); got != s.want {
					t.Fatalf("step %d (%s at %v): got %v want %v", i, s.key, s.at, got, s.want)
				}
			}
		})
	}
}

// TestTakeWait: a refused Take says how long until the next token, and
// takes nothing.
func TestTakeWait(t *testing.T) {
	tests := []struct {
		name  string
		rate  float64
		burst int
		taken int           // tokens taken at t0
		at    time.Duration // when Take is refused
		want  time.Duration
	}{
		{"drained", 1, 1, 1, 0, time.Second},
		{"partly refilled", 1, 1, 1, 250 * time.Millisecond, 750 * time.Millisecond},
		{"rounded up", 3, 1, 1, 0, 333_333_334},
		{"slow rate", 0.001, 2, 2, 0, 1000 * time.Second},
		{"clock gone back", 2, 1, 1, -time.Hour, 500 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := New(tc.rate, tc.burst)
			for range tc.taken {
				if _, _, ok := k.Take("a", t0); !ok {
					t.Fatal("Take refused within the burst")
				}
			}
			for i := range 3 { // refusals take nothing, so the wait stays
				tok, wait, ok := k.Take("a", t0.Add(tc.at))
				if ok || wait != tc.want || tok != (Token{}) {
					t.Fatalf("Take %d = %+v, %v, %v; want zero Token, %v, false", i, tok, wait, ok, tc.want)
				}
			}
			if _, wait, ok := k.Take("a", t0.Add(max(tc.at, 0)+tc.want)); !ok || wait != 0 {
				t.Fatalf("Take after the wait = %v, %v; want 0, true", wait, ok)
			}
		})
	}
}

// TestTokenReturn: a returned token can be taken again, exactly once, and
// never lifts a bucket above its burst.
func TestTokenReturn(t *testing.T) {
	tests := []struct {
		name     string
		rate     float64
		burst    int
		take     int           // tokens taken at t0; the first is returned
		returnAt time.Duration // when it is returned
		at       time.Duration // when the bucket is read
		allowed  int           // Allows that then succeed
		wait     time.Duration // wait reported after them
	}{
		{"drained bucket", 1, 3, 3, 0, 0, 1, time.Second},
		{"returned later", 1, 2, 2, 500 * time.Millisecond, 500 * time.Millisecond, 1, 500 * time.Millisecond},
		{"read later", 1, 3, 3, 0, 1500 * time.Millisecond, 2, 500 * time.Millisecond},
		{"not above burst", 1, 2, 1, 10 * time.Second, 10 * time.Second, 2, time.Second},
		{"clock gone back", 1, 2, 2, -time.Hour, 0, 1, time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := New(tc.rate, tc.burst)
			var toks []Token
			for range tc.take {
				tok, _, ok := k.Take("a", t0)
				if !ok {
					t.Fatal("Take refused within the burst")
				}
				toks = append(toks, tok)
			}
			toks[0].Return(t0.Add(tc.returnAt))
			toks[0].Return(t0.Add(tc.returnAt)) // cleared: does nothing
			now := t0.Add(tc.at)
			for i := range tc.allowed {
				if !k.Allow("a", now) {
					t.Fatalf("Allow %d refused", i)
				}
			}
			if _, wait, ok := k.Take("a", now); ok || wait != tc.wait {
				t.Fatalf("Take after %d Allows = %v, %v; want %v, false", tc.allowed, wait, ok, tc.wait)
			}
		})
	}
}

func TestTokenReturnNoop(t *testing.T) {
	var zero Token
	zero.Return(t0) // must not panic

	// A token of a forgotten key changes nothing: the key starts anew.
	k := New(1, 2)
	k.maxKeys = 1
	tok, _, _ := k.Take("a", t0)
	k.Allow("b", t0) // evicts a
	tok.Return(t0)
	if n := k.Len(); n != 1 {
		t.Fatalf("Len = %d after returning a forgotten key's token, want 1", n)
	}
	if !k.Allow("b", t0) || k.Allow("b", t0) {
		t.Fatal("returning a's token changed b's bucket")
	}
}

// TestEvictsIdle: keys whose buckets refilled are forgotten, so memory
// stays bounded by the keys active recently.
func TestEvictsIdle(t *testing.T) {
	k := New(10, 5)
	for i := range 10000 {
		// Each key is used once; after a second all buckets are full again.
		k.Allow(fmt.Sprintf("sb-%d", i), t0.Add(time.Duration(i)*time.Second))
	}
	// A sweep runs once 64 keys were added since the last one, and leaves
	// only the newest key, so 64 keys are tracked at most.
	if n := k.Len(); n < 1 || n > 64 {
		t.Fatalf("%d keys tracked after 10000 idle ones, want 1 to 64", n)
	}
	// An active, drained key survives sweeps with its state.
	now := t0.Add(time.Hour)
	for range 5 {
		k.Allow("busy", now)
	}
	for i := range 1000 {
		k.Allow(fmt.Sprintf("new-%d", i), now)
	}
	if k.Allow("busy", now) {
		t.Fatal("drained key was reset by eviction")
	}
}

// TestMaxKeys: past the cap, the least recently seen key is forgotten.
func TestMaxKeys(t *testing.T) {
	if k := New(1, 1); k.maxKeys != MaxKeys {
		t.Fatalf("maxKeys = %d, want %d", k.maxKeys, MaxKeys)
	}
	k := New(0.001, 1) // drained buckets stay drained for the test
	k.maxKeys = 4
	for i, key := range []string{"a", "b", "c", "d"} {
		k.Allow(key, t0.Add(time.Duration(i)*time.Second))
	}
	k.Allow("a", t0.Add(4*time.Second)) // refused, but seen: b is now oldest
	if !k.Allow("e", t0.Add(5*time.Second)) {
		t.Fatal("new key e refused")
	}
	if n := k.Len(); n != 4 {
		t.Fatalf("Len = %d, want 4", n)
	}
	now := t0.Add(6 * time.Second)
	for _, key := range []string{"a", "c", "d", "e"} {
		if k.Allow(key, now) {
			t.Fatalf("key %s was forgotten, want b forgotten", key)
		}
	}
	if !k.Allow("b", now) {
		t.Fatal("key b was kept, want it forgotten")
	}
	if n := k.Len(); n != 4 {
		t.Fatalf("Len = %d, want 4", n)
	}
}

func TestConcurrent(t *testing.T) {
	k := New(1, 100)
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				tok, _, ok := k.Take("shared", t0)
				k.Allow(fmt.Sprintf("g%d-%d", g, i), t0)
				if !ok {
					continue
				}
				if i%2 == 1 {
					tok.Return(t0) // net zero
					continue
				}
				mu.Lock()
				allowed++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// A keeper can be refused while another goroutine holds a token it
	// returns later, so count what is left: returned tokens are all back
	// and none was granted twice.
	left := 0
	for k.Allow("shared", t0) {
		left++
	}
	if allowed < 1 || allowed+left != 100 {
		t.Fatalf("kept %d of 400 concurrent tokens and %d were left, want 100 in all", allowed, left)
	}
	if n := k.Len(); n != 1+8*50 {
		t.Fatalf("Len = %d, want %d", n, 1+8*50)
	}
}

func TestNewPanics(t *testing.T) {
	for _, tc := range []struct {
		rate  float64
		burst int
		want  string // in the panic message
	}{
		{0, 1, "rate 0 "},
		{-1, 1, "rate -1 "},
		{math.NaN(), 1, "rate NaN "},
		{math.Inf(1), 1, "rate +Inf "},
		{1, 0, "burst 0 "},
		{1, -3, "burst -3 "},
	} {
		func() {
			defer func() {
				msg, _ := recover().(string)
				if !strings.Contains(msg, tc.want) {
					t.Errorf("New(%v, %d) panicked with %q, want it to contain %q", tc.rate, tc.burst, msg, tc.want)
				}
			}()
			New(tc.rate, tc.burst)
		}()
	}
}
