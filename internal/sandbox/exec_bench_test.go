package sandbox_test

import (
	"context"
	"testing"

	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/proto/process"
)

// BenchmarkStartProcess is the control plane's part of an exec round
// trip without root: a command of a task (call counter, start record,
// end record and audit event in a real SQLite store) run through the
// Manager to the fake driver's in-process agent and back. test/bench's
// BenchmarkExecRoundTrip measures the whole path with a real sandbox.
func BenchmarkStartProcess(b *testing.B) {
	h := newGovernedHarness(b, nil)
	ctx := context.Background()
	task, err := h.cfg.Governor.Create(ctx, govern.TaskRequest{Team: store.DefaultTeam, Agent: "b", MaxCalls: govern.MaxCallsCeiling, NoLoopCheck: true})
	if err != nil {
		b.Fatal(err)
	}
	sb, err := h.m.Create(ctx, sandbox.CreateRequest{Task: task.ID})
	if err != nil {
		b.Fatal(err)
	}
	req := &process.StartRequest{Process: &process.ProcessConfig{Cmd: "true"}}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		p, err := h.m.StartProcess(ctx, sb.ID, req, "", 0)
		if err != nil {
			b.Fatal(err)
		}
		for {
			msg, err := p.Receive()
			if err != nil || msg == nil {
				b.Fatalf("stream ended without an end event: %v", err)
			}
			if msg.GetEvent().GetEnd() != nil {
				break
			}
		}
		p.Close()
	}
}
