package sandbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/corralhq/corral/internal/audit"
	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/proto/process"
)

// TestCommandsReuseAgentConnection: commands run one after another reuse
// one connection to the agent. Defends against the stream of an ended
// command being cancelled before its end of stream was read, which made
// the HTTP client close the connection and dial the agent again for
// every command (an extra connect and accept on the exec round trip).
func TestCommandsReuseAgentConnection(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testConfig(t))
	sb := h.create(sandbox.CreateRequest{})
	const n = 5
	for range n {
		if r := execOut(t, h, sb.ID, "true"); r.exit != 0 {
			t.Fatalf("true exited %d", r.exit)
		}
	}
	if d := h.d.Dials(sb.ID); d != 1 {
		t.Fatalf("%d commands dialled the agent %d times, want once", n, d)
	}
}

// droppedEnds is an audit recorder that loses every command's end with
// its event, as a control-plane crash does between a command's answer
// and the audit writer's commit.
type droppedEnds struct{ events }

func (d *droppedEnds) RecordCommandEnd(ctx context.Context, sandbox string, _ *store.Command, kind string, data any) {
}

// TestCommandEndLostInCrashIsInterrupted: a command whose end record was
// not yet committed when the control plane crashed (the end record is
// written with the command's audit event after the answer) is found
// without an end at the next start and closed as
// control_plane_restarted, with a command.interrupted event; its
// sandbox is adopted. Defends against a crash leaving a command that
// looks as if it still ran forever.
func TestCommandEndLostInCrashIsInterrupted(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	rec := &droppedEnds{}
	cfg.Audit = rec
	h := newHarness(t, cfg)
	sb := h.create(sandbox.CreateRequest{})
	if r := execOut(t, h, sb.ID, "true"); r.exit != 0 {
		t.Fatalf("true exited %d", r.exit)
	}
	cmds, err := h.st.ListCommands(context.Background(), sb.ID)
	if err != nil || len(cmds) != 1 || cmds[0].EndedAt != nil {
		t.Fatalf("before the restart: commands %+v, %v; want one without an end", cmds, err)
	}
	h.restart()
	cmds, err = h.st.ListCommands(context.Background(), sb.ID)
	if err != nil || len(cmds) != 1 || cmds[0].EndedAt == nil || cmds[0].EndReason != "control_plane_restarted" {
		t.Fatalf("after the restart: commands %+v, %v; want one ended control_plane_restarted", cmds, err)
	}
	rec.mu.Lock()
	n := len(rec.data["command.interrupted"])
	rec.mu.Unlock()
	if n != 1 {
		t.Fatalf("command.interrupted events: %d, want 1", n)
	}
	if !h.m.Running(sb.ID) {
		t.Fatal("the sandbox was not adopted")
	}
}

// TestParallelCallsAtLimit: many commands of one task started at once
// against its max_calls budget: exactly max_calls run and are recorded
// (each with its end, committed with its audit event), the rest are
// refused with budget_exhausted, and the stored call count is
// max_calls. Defends against the call counter and the command record,
// now written in one transaction, admitting more calls than the budget
// or counting fewer than ran.
func TestParallelCallsAtLimit(t *testing.T) {
	t.Parallel()
	h := newGovernedHarness(t, nil)
	ctx := context.Background()
	const maxCalls, tries = 7, 40
	task, err := h.cfg.Governor.Create(ctx, govern.TaskRequest{Team: store.DefaultTeam, Agent: "t", MaxCalls: maxCalls, NoLoopCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	sb := h.create(sandbox.CreateRequest{Task: task.ID})
	var ran, refused atomic.Int64
	var wg sync.WaitGroup
	for range tries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := h.m.StartProcess(ctx, sb.ID, &process.StartRequest{Process: &process.ProcessConfig{Cmd: "true"}}, "", 0)
			if err != nil {
				var te *govern.TripError
				if errors.As(err, &te) && te.Code == govern.CodeBudgetExhausted {
					refused.Add(1)
				} else {
					t.Errorf("start: %v", err)
				}
				return
			}
			defer p.Close()
			for {
				msg, err := p.Receive()
				if err != nil || msg == nil {
					t.Errorf("stream ended without an end event: %v", err)
					return
				}
				if msg.GetEvent().GetEnd() != nil {
					ran.Add(1)
					return
				}
			}
		}()
	}
	wg.Wait()
	if ran.Load() != maxCalls || refused.Load() != tries-maxCalls {
		t.Fatalf("ran %d, refused %d; want %d and %d", ran.Load(), refused.Load(), maxCalls, tries-maxCalls)
	}
	h.cfg.Audit.(*audit.Log).Sync()
	cmds, err := h.st.ListCommands(ctx, sb.ID)
	if err != nil || len(cmds) != maxCalls {
		t.Fatalf("command records: %d (%v), want %d", len(cmds), err, maxCalls)
	}
	for _, c := range cmds {
		if c.EndedAt == nil || c.ExitCode == nil || *c.ExitCode != 0 {
			t.Errorf("command %d has no end record: %+v", c.ID, c)
		}
	}
	stored, err := h.st.GetTask(ctx, task.ID)
	if err != nil || stored.Usage.Calls != maxCalls {
		t.Fatalf("stored calls: %+v (%v), want %d", stored, err, maxCalls)
	}
}

// TestTrippingCallKeepsItsResult: the call whose end opens its task's
// breaker (a detected loop) is still a live result, though the kill the
// breaker causes ends the sandbox right after. Defends against the
// relay (the E2B process API) dropping that call's end event and cutting
// the client's stream ("incomplete envelope") because it looked at the
// sandbox after the kill: the drill's looping agent saw a protocol error
// instead of its last result and then loop_detected.
func TestTrippingCallKeepsItsResult(t *testing.T) {
	t.Parallel()
	killed := make(chan struct{})
	h := newGovernedHarness(t, func(h *harness, tk *store.Task) {
		h.m.OnTrip(tk)
		close(killed)
	})
	ctx := context.Background()
	task, err := h.cfg.Governor.Create(ctx, govern.TaskRequest{Team: store.DefaultTeam, Agent: "t", MaxCalls: 100})
	if err != nil {
		t.Fatal(err)
	}
	sb := h.create(sandbox.CreateRequest{Task: task.ID})
	for i := 1; ; i++ {
		p, err := h.m.StartProcess(ctx, sb.ID, &process.StartRequest{Process: &process.ProcessConfig{Cmd: "exit", Args: []string{"3"}}}, "", 0)
		if err != nil {
			t.Fatalf("call %d: %v (the breaker never opened)", i, err)
		}
		var end *process.ProcessEvent_EndEvent
		for end == nil {
			msg, err := p.Receive()
			if err != nil || msg == nil {
				t.Fatalf("call %d: stream ended without an end event: %v", i, err)
			}
			end = msg.GetEvent().GetEnd()
		}
		p.Close()
		if w := strings.Join(p.Warnings(), " "); !strings.Contains(w, govern.CodeLoopDetected) {
			continue // no trip yet
		}
		<-killed
		// This call's end opened the breaker, and the kill it caused
		// has ended the sandbox: the end event is still a result.
		if h.m.Running(sb.ID) {
			t.Fatal("the sandbox still runs after its task's breaker opened with on_trip kill")
		}
		if !p.Live() || end.GetExitCode() != 3 {
			t.Fatalf("call %d opened the breaker: Live %v, exit %d; want its result kept (Live, exit 3)", i, p.Live(), end.GetExitCode())
		}
		return
	}
}
