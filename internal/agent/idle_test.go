package agent

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestIdleTrimmer: the agent returns its free memory to the host once
// the last request ended and none came for a while, never while a
// request (a streaming command, say) is in flight. It defends idle
// density: the heap a burst of requests grew to would otherwise stay
// resident in every idle sandbox.
func TestIdleTrimmer(t *testing.T) {
	var freed atomic.Int32
	tr := &idleTrimmer{after: 50 * time.Millisecond, free: func() { freed.Add(1) }}
	release := make(chan struct{})
	h := tr.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-release
		}
	}))
	serve := func(path string) { h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", path, nil)) }
	slowDone := make(chan struct{})
	go func() { serve("/slow"); close(slowDone) }()
	serve("/fast") // ends while /slow is in flight
	time.Sleep(300 * time.Millisecond)
	if n := freed.Load(); n != 0 {
		t.Fatalf("memory returned %d times while a request was in flight", n)
	}
	close(release)
	<-slowDone
	deadline := time.Now().Add(time.Minute)
	for freed.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("memory not returned after the last request ended")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	if n := freed.Load(); n != 1 {
		t.Fatalf("memory returned %d times for one idle period, want 1 (no timer while idle)", n)
	}
}

// TestIdleTrimmerArmedAtStart: an agent returns what its start-up left
// once it served nothing for a moment (the agent arms the trimmer when it
// starts to serve instead of returning the memory there and then, which
// delayed a create's first command); a request that comes first holds
// the trim off while it is in flight. It defends idle density (an agent
// that never gets a request still gives back its start-up heap) and the
// first command's latency.
func TestIdleTrimmerArmedAtStart(t *testing.T) {
	var freed atomic.Int32
	tr := &idleTrimmer{after: time.Hour, free: func() { freed.Add(1) }}
	tr.arm(10 * time.Millisecond)
	deadline := time.Now().Add(time.Minute)
	for freed.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("start-up memory not returned by an agent that had no request")
		}
		time.Sleep(5 * time.Millisecond)
	}

	var freed2 atomic.Int32
	tr2 := &idleTrimmer{after: time.Hour, free: func() { freed2.Add(1) }}
	release, entered := make(chan struct{}), make(chan struct{})
	h := tr2.wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		close(entered)
		<-release
	}))
	tr2.arm(50 * time.Millisecond)
	done := make(chan struct{})
	go func() { h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil)); close(done) }()
	<-entered
	time.Sleep(200 * time.Millisecond) // past the armed trim
	if n := freed2.Load(); n != 0 {
		t.Fatalf("memory returned %d times while the first request was in flight", n)
	}
	close(release)
	<-done
	if n := freed2.Load(); n != 0 {
		t.Fatalf("memory returned %d times right after the first request; want it idleTrimAfter later", n)
	}
}
