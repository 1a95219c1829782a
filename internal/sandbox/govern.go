package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/corralhq/corral/internal/agentclient"
	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/store"
)

// End reasons of sandboxes stopped by a brake. A tripped task's reasons
// are its breaker codes, defined once in govern.
const (
	EndBudget     = govern.CodeBudgetExhausted
	EndLoop       = govern.CodeLoopDetected
	EndTaskEnded  = govern.CodeTaskEnded
	EndCPURunaway = "cpu_runaway"
)

// MaxArtifactBytes bounds one archived artifact file.
const MaxArtifactBytes = 64 << 20

// admit runs admission control and the task's budgets for a new sandbox.
// It fills rec.TaskID (creating an implicit task when req names none) and
// returns a release function to call if the sandbox does not start.
func (m *Manager) admit(ctx context.Context, req *CreateRequest, rec *store.Sandbox) (release func(), err error) {
	release = func() {}
	gov, adm := m.cfg.Governor, m.cfg.Admission
	agent := req.Agent
	var task *store.Task
	if gov != nil && req.Task != "" {
		task, err = gov.Get(ctx, req.Task)
		if err == nil && task.Team != rec.Team {
			err = govern.ErrNoTask // another team's task is absent
		}
		if errors.Is(err, govern.ErrNoTask) {
			return release, invalid("task %q not found", req.Task)
		}
		if err != nil {
			return release, err
		}
		if agent == "" {
			agent = task.Agent
		}
	}
	tk, err := adm.Acquire(ctx, admissionRequest(rec, agent))
	if err != nil {
		return release, err
	}
	release = func() { tk.Release() }
	m.mu.Lock()
	m.tickets[rec.ID] = tk
	m.mu.Unlock()
	if gov == nil {
		return release, nil
	}
	if task == nil {
		task, err = gov.CreateImplicit(ctx, rec.Team, agent)
		if err != nil {
			release()
			return func() {}, err
		}
	}
	if err := gov.AdmitSandbox(ctx, task.ID, rec.ID); err != nil {
		release()
		return func() {}, err
	}
	rec.TaskID = task.ID
	rel := release
	release = func() { rel(); gov.SandboxEnded(task.ID, rec.ID) }
	return release, nil
}

// admissionRequest is what a sandbox asks of admission: its team's
// slot, its agent's, its CPUs and its memory.
func admissionRequest(rec *store.Sandbox, agent string) govern.Request {
	return govern.Request{Team: rec.Team, Agent: agent, CPUs: rec.Resources.CPU, MemoryMB: rec.Resources.MemoryMB}
}

// Admission is the admission controller the Manager creates through.
func (m *Manager) Admission() *govern.Admission { return m.cfg.Admission }

// SetTeamQuota validates and stores an admin's quota override of a team
// (the fields o sets replace the server's defaults; none drops it) and
// applies it to the next create. A bad value is an *InvalidError naming
// the field, and nothing is stored.
func (m *Manager) SetTeamQuota(ctx context.Context, o store.TeamQuota) error {
	if err := govern.ValidateQuota(o); err != nil {
		return err
	}
	if err := m.store.PutTeamQuota(ctx, &o); err != nil {
		return err
	}
	m.cfg.Admission.SetTeamQuota(o.Team, o)
	return nil
}

// LoadTeamQuotas applies the stored quota overrides to admission, as a
// server start does before it adopts or admits a sandbox.
func (m *Manager) LoadTeamQuotas(ctx context.Context) error {
	qs, err := m.store.ListTeamQuotas(ctx)
	if err != nil {
		return err
	}
	for _, q := range qs {
		m.cfg.Admission.SetTeamQuota(q.Team, *q)
	}
	return nil
}

// releaseSandbox gives back what admit took for a sandbox that ended.
func (m *Manager) releaseSandbox(id, task string) {
	m.mu.Lock()
	tk := m.tickets[id]
	delete(m.tickets, id)
	m.mu.Unlock()
	if tk != nil {
		tk.Release()
	}
	if m.cfg.Governor != nil && task != "" {
		m.cfg.Governor.SandboxEnded(task, id)
	}
}

// taskOf returns the task of a live sandbox.
func (m *Manager) taskOf(id string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ls, ok := m.live[id]; ok {
		return ls.rec.TaskID
	}
	return ""
}

// OnTrip is the governor's callback when a task's breaker opens or the
// task ends: with on_trip "kill" (the default) or an ended task, every
// live sandbox of the task has its artifacts archived and is killed.
func (m *Manager) OnTrip(t *store.Task) {
	reason := EndBudget
	switch {
	case t.State == store.TaskEnded:
		reason = EndTaskEnded
	case t.Breaker.Code == govern.CodeLoopDetected:
		reason = EndLoop
	case t.OnTrip == "keep":
		return
	}
	m.mu.Lock()
	var ids []string
	for id, ls := range m.live {
		if ls.rec.TaskID == t.ID && !ls.ending {
			ids = append(ids, id)
		}
	}
	m.mu.Unlock()
	for _, id := range ids {
		if len(t.Artifacts) > 0 && m.Running(id) {
			m.archive(t, id)
		}
		if err := m.end(context.Background(), id, reason, ""); err != nil && !errors.Is(err, ErrNotFound) {
			m.log.Error("stop sandbox of tripped task", "task", t.ID, "id", id, "err", err)
		}
	}
}

// archive copies the task's artifact files out of a sandbox into
// DATA/artifacts/TASK/SANDBOX/ before it is killed. Missing files are
// recorded, not fatal.
func (m *Manager) archive(t *store.Task, id string) {
	if m.cfg.ArtifactDir == "" {
		return
	}
	dir := filepath.Join(m.cfg.ArtifactDir, t.ID, id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		m.log.Error("artifact dir", "err", err)
		return
	}
	c := m.AgentHTTP(id)
	for _, p := range t.Artifacts {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		n, err := fetchArtifact(ctx, c, p, filepath.Join(dir, strings.ReplaceAll(strings.TrimPrefix(p, "/"), "/", "_")))
		cancel()
		data := map[string]any{"path": p, "bytes": n}
		if err != nil {
			data["error"] = err.Error()
		}
		m.audit(id, "task.artifact", data)
	}
}

func fetchArtifact(ctx context.Context, c *http.Client, path, dst string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", agentclient.BaseURL+"/files?path="+url.QueryEscape(path)+"&username=root", nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("agent answered %d", resp.StatusCode)
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(f, io.LimitReader(resp.Body, MaxArtifactBytes))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// BrakeError returns the refusal of the sandbox's task when the sandbox is
// gone (or going) and its task's breaker is open or the task has ended, so
// that an agent calling into it hears why; otherwise nil.
func (m *Manager) BrakeError(ctx context.Context, id string) error {
	if m.cfg.Governor == nil {
		return nil
	}
	rec, err := m.store.GetSandbox(ctx, id)
	if err != nil || rec.TaskID == "" {
		return nil
	}
	return m.cfg.Governor.Refusal(ctx, rec.TaskID)
}

// BeginToolCall admits one tool call that is not a command (a code run)
// in running sandbox id: it counts against the sandbox's task's call
// budget and goes to its loop detector like a command, or is refused
// with a *govern.TripError. what describes the call for the loop
// detector (the same text, the same call). The caller must End the
// ticket (nil when the server keeps no tasks).
func (m *Manager) BeginToolCall(ctx context.Context, id, what string) (*govern.CallTicket, error) {
	if !m.Running(id) {
		return nil, ErrNotFound
	}
	task := m.taskOf(id)
	if m.cfg.Governor == nil || task == "" {
		return nil, nil
	}
	return m.cfg.Governor.BeginCall(ctx, task, id, what, nil)
}
