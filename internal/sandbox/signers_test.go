package sandbox

import (
	"fmt"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/store"
)

// newBareManager is a Manager with no store, runtime or templates, for
// tests of its in-memory bookkeeping: its watch loop never ticks.
func newBareManager(t *testing.T) *Manager {
	t.Helper()
	m := New(Config{WatchInterval: time.Hour}, nil, nil, nil, nil)
	t.Cleanup(func() { close(m.stop) })
	return m
}

// makeLive adds a live sandbox the way Create and the adoptions do.
func makeLive(m *Manager, id, token string) {
	m.mu.Lock()
	m.addLive(&liveSandbox{rec: &store.Sandbox{ID: id, AccessToken: token}})
	m.mu.Unlock()
}

// TestFindByTokenLockFree defends against the unauthenticated signed-URL
// lookup scanning the sandboxes under the Manager's global lock: one
// request with a large path then held every other call on the Manager
// (creates, kills, every envd request) for as long as it hashed, once
// per sandbox. FindByToken must answer while the lock is held by someone
// else, find what was made live, and no longer find what was forgotten.
func TestFindByTokenLockFree(t *testing.T) {
	m := newBareManager(t)
	for i := range 50 {
		makeLive(m, fmt.Sprintf("sb%02d", i), fmt.Sprintf("token-%02d", i))
	}
	find := func(token string) string {
		return m.FindByToken(func(tok string) bool { return tok == token })
	}

	m.mu.Lock()
	got := make(chan string, 1)
	go func() { got <- find("token-37") }()
	select {
	case id := <-got:
		if id != "sb37" {
			t.Errorf("FindByToken found %q, want sb37", id)
		}
	case <-time.After(30 * time.Second):
		t.Error("FindByToken waited for the Manager's lock")
	}
	m.mu.Unlock()
	if t.Failed() {
		return
	}

	if id := find("no-such-token"); id != "" {
		t.Fatalf("an unknown token matched %q", id)
	}
	m.forget("sb37")
	if id := find("token-37"); id != "" {
		t.Fatalf("a forgotten sandbox is still found: %q", id)
	}
	if id := find("token-12"); id != "sb12" {
		t.Fatalf("after a forget, another sandbox: %q, want sb12", id)
	}
}
