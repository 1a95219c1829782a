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
