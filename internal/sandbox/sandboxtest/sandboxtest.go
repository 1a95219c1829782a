// Package sandboxtest holds helpers for tests that drive a
// sandbox.Manager over a real store: the Manager's own unit tests and the
// kube driver's replica tests share them.
package sandboxtest

import (
	"context"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
)

// InFlight is a create started by CreateInFlight.
type InFlight struct {
	// Record is the create's record, in the store while the create runs.
	Record *store.Sandbox
	res    chan result
}

type result struct {
	sb  *store.Sandbox
	err error
}

// CreateInFlight starts a create with the defaults on m, whose driver
// holds Start until the test lets it go, and waits (up to a minute) until
// the create's record is in st: the only running record of node. The
// create is then in flight, its record inserted and its sandbox not
// started. Wait returns the create's result.
func CreateInFlight(t testing.TB, m *sandbox.Manager, st *store.Store, node string) *InFlight {
	t.Helper()
	f := &InFlight{res: make(chan result, 1)}
	ctx := context.Background()
	go func() {
		sb, err := m.Create(ctx, sandbox.CreateRequest{})
		f.res <- result{sb, err}
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		recs, _ := st.ListSandboxes(ctx, store.SandboxFilter{Node: node, States: []string{store.StateRunning}})
		if len(recs) == 1 {
			f.Record = recs[0]
			return f
		}
		if time.Now().After(deadline) {
			t.Fatalf("the record of the create in flight on %s never appeared", node)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Wait returns the create's result, once its Start has been let go.
func (f *InFlight) Wait() (*store.Sandbox, error) {
	r := <-f.res
	return r.sb, r.err
}
