package sandbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/sandbox"
)

// TestShutdownStartsNothingMore guards against a sandbox outliving the
// server that started it: a create waiting for admission when the server
// shuts down with killAll was admitted by the slot the shutdown freed and
// started a sandbox nobody would kill (integration runs found such leaked
// sandboxes holding their runtime and shim for good). Shutdown now stops
// every create in flight: the waiting one fails with ErrShuttingDown and
// the driver holds no sandbox afterwards.
func TestShutdownStartsNothingMore(t *testing.T) {
	cfg := testConfig(t)
	cfg.Admission = govern.NewAdmission(govern.AdmissionConfig{MaxConcurrent: 1, MaxPerAgent: 1,
		AgentRate: 1000, AgentBurst: 1000, QueueTimeout: time.Minute})
	h := newHarness(t, cfg)
	h.create(sandbox.CreateRequest{})
	errc := make(chan error, 1)
	go func() {
		_, err := h.m.Create(context.Background(), sandbox.CreateRequest{})
		errc <- err
	}()
	eventually(t, "the second create to wait for a slot", func() bool { return cfg.Admission.Stats().Waiting == 1 })
	h.m.Shutdown(context.Background(), true)
	if err := <-errc; !errors.Is(err, sandbox.ErrShuttingDown) {
		t.Errorf("a create waiting when the server shut down: %v; want ErrShuttingDown", err)
	}
	if held := h.held(); len(held) != 0 {
		t.Errorf("the driver still holds %v after a shutdown that kills all", held)
	}
	h.m = h.open() // the harness's cleanup shuts this one down
}
