package sandbox_test

import (
	"context"
	"sync"
	"testing"

	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
)

// events keeps the audit events a Manager records. A sandbox's end it
// writes to the harness's store (useStore), keeping its event only if
// that end ended the record, as the audit log does.
type events struct {
	mu   sync.Mutex
	data map[string][]any // by kind
	st   *store.Store
}

func (e *events) useStore(st *store.Store) { e.st = st }

func (e *events) RecordSandboxEnd(ctx context.Context, end *store.SandboxEnd, kind string, data any) (bool, error) {
	ok, err := e.st.EndSandboxFirst(ctx, end.ID, end.Reason, end.Error, end.At)
	if ok {
		e.Record(end.ID, kind, data)
	}
	return ok, err
}

func (e *events) Record(_, kind string, data any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.data == nil {
		e.data = map[string][]any{}
	}
	e.data[kind] = append(e.data[kind], data)
}

func (e *events) RecordBy(_ context.Context, sandbox, kind string, data any) {
	e.Record(sandbox, kind, data)
}

// TestCreateRecordsPhases: a cold create's sandbox.created event carries
// the time of each phase the manager saw (admission, store, network,
// finish; the fake driver records none of its own), so that the
// breakdown docs/performance.md publishes is measured on every create.
func TestCreateRecordsPhases(t *testing.T) {
	var ev events
	cfg := testConfig(t)
	cfg.Audit = &ev
	h := newHarness(t, cfg)
	h.create(sandbox.CreateRequest{})
	ev.mu.Lock()
	defer ev.mu.Unlock()
	created := ev.data["sandbox.created"]
	if len(created) != 1 {
		t.Fatalf("sandbox.created events: %d, want 1", len(created))
	}
	phases, ok := created[0].(map[string]any)["phases_ms"].(map[string]float64)
	if !ok {
		t.Fatalf("sandbox.created has no phases_ms: %#v", created[0])
	}
	for _, p := range []string{runtime.PhaseAdmission, runtime.PhaseStore, runtime.PhaseNetwork, runtime.PhaseFinish} {
		if v, ok := phases[p]; !ok || v < 0 {
			t.Errorf("phase %s = %v, %v; want a duration", p, v, ok)
		}
	}
	for p := range phases {
		known := false
		for _, n := range runtime.PhaseNames {
			known = known || n == p
		}
		if !known {
			t.Errorf("phase %q is not in runtime.PhaseNames", p)
		}
	}
}
