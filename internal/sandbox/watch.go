package sandbox

import (
	"context"
	"errors"
	"time"

	"connectrpc.com/connect"
	"github.com/corralhq/corral/proto/process"

	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/watchdog"
)

// Targets lists the running (not paused, not ending) sandboxes for the
// watchdog; with Stats it makes the Manager a watchdog.Source.
func (m *Manager) Targets() []watchdog.Target {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]watchdog.Target, 0, len(m.live))
	for id, ls := range m.live {
		if ls.ending || ls.paused {
			continue
		}
		r := ls.rec.Resources
		out = append(out, watchdog.Target{ID: id, CPULimit: r.CPU, MemoryBytes: r.MemoryMB << 20,
			DiskBytes: r.DiskMB << 20, Pids: r.Pids, Tier: ls.rec.Tier})
	}
	return out
}

// OnWatchdogEvent records a watchdog event in the audit log.
func (m *Manager) OnWatchdogEvent(ev watchdog.Event) {
	data := map[string]any{"value": ev.Value, "limit": ev.Limit, "message": ev.Message}
	if ev.Kind == watchdog.KindCPURunaway {
		data["demand"] = ev.Demand
	}
	m.audit(ev.Sandbox, ev.Kind, data)
	m.log.Warn("watchdog", "sandbox", ev.Sandbox, "kind", ev.Kind, "message", ev.Message)
}

// OnRunaway applies the cpu_runaway policy to a sandbox the watchdog
// found CPU-bound for the runaway period (at its quota, or starved below
// it on a busy host): the sandbox is killed and recorded with end reason
// cpu_runaway.
//
// With Config.RunawayAction "command", the sandbox's running commands
// are killed instead (SIGKILL to each process the agent started) and the
// sandbox lives on.
func (m *Manager) OnRunaway(id string) {
	if m.cfg.RunawayAction == RunawayKillCommands {
		killed, err := m.killCommands(id)
		if err == nil {
			m.audit(id, "watchdog.runaway_action", map[string]any{"action": RunawayKillCommands, "killed_pids": killed})
			return
		}
		m.log.Error("kill runaway commands; killing the sandbox", "id", id, "err", err)
	}
	if err := m.end(context.Background(), id, EndCPURunaway, "CPU-bound for the runaway period"); err != nil && !errors.Is(err, ErrNotFound) {
		m.log.Error("stop runaway sandbox", "id", id, "err", err)
	}
}

// Runaway actions (Config.RunawayAction).
const (
	RunawayKillSandbox  = "sandbox"
	RunawayKillCommands = "command"
)

// killCommands sends SIGKILL to every process the sandbox's agent started.
func (m *Manager) killCommands(id string) ([]uint32, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pc := m.ProcessClient(id)
	resp, err := pc.List(ctx, connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		return nil, err
	}
	var killed []uint32
	for _, p := range resp.Msg.GetProcesses() {
		_, err := pc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{
			Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: p.GetPid()}},
			Signal:  process.Signal_SIGNAL_SIGKILL,
		}))
		if err == nil {
			killed = append(killed, p.GetPid())
		}
	}
	return killed, nil
}

// chargeCPU passes the watchdog's latest CPU readings to the tasks.
func (m *Manager) chargeCPU() {
	wd := m.wd.Load()
	if wd == nil || m.cfg.Governor == nil {
		return
	}
	m.mu.Lock()
	type pair struct{ id, task string }
	var ps []pair
	for id, ls := range m.live {
		if ls.rec.TaskID != "" {
			ps = append(ps, pair{id, ls.rec.TaskID})
		}
	}
	m.mu.Unlock()
	for _, p := range ps {
		if s, ok := wd.Latest(p.id); ok {
			m.cfg.Governor.UpdateCPU(p.task, p.id, s.CPUSeconds)
		}
	}
	m.cfg.Governor.Sweep()
}

// SetWatchdog attaches the watchdog (made after the manager, which is its
// source). Call it before Reconcile.
func (m *Manager) SetWatchdog(w *watchdog.Watchdog) { m.wd.Store(w) }

// Watchdog returns the attached watchdog, or nil.
func (m *Manager) Watchdog() *watchdog.Watchdog { return m.wd.Load() }

// Processes lists a live sandbox's processes (a diagnostic).
func (m *Manager) Processes(id string) ([]runtime.Process, error) {
	m.mu.Lock()
	ls, ok := m.live[id]
	ok = ok && !ls.ending
	m.mu.Unlock()
	if !ok {
		return nil, ErrNotFound
	}
	return m.driver.Processes(id)
}
