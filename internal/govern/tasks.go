package govern

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/corralhq/corral/internal/idgen"
	"github.com/corralhq/corral/internal/safetext"
	"github.com/corralhq/corral/internal/store"
)

// Error codes of refused calls (stable; docs/api.md).
const (
	CodeBudgetExhausted = "budget_exhausted"
	CodeLoopDetected    = "loop_detected"
	CodeTaskEnded       = "task_ended"
)

// Budget names, as they appear in errors, events and the API.
const (
	BudgetCalls      = "max_calls"
	BudgetDuration   = "max_duration"
	BudgetTokens     = "max_tokens"
	BudgetSandboxes  = "max_sandboxes"
	BudgetCPUSeconds = "max_cpu_seconds"
)

// Defaults are the server-wide budgets a task gets when it names none.
type Defaults struct {
	MaxCalls      int64         // 30
	MaxDuration   time.Duration // 1 h
	MaxTokens     int64         // 2,000,000
	MaxSandboxes  int64         // 5 at once
	MaxCPUSeconds float64       // 3600
}

// The default budgets of a task, of a server that configures none.
const (
	DefaultMaxCalls      = 30
	DefaultMaxDuration   = time.Hour
	DefaultMaxTokens     = 2_000_000
	DefaultMaxSandboxes  = 5
	DefaultMaxCPUSeconds = 3600.0
)

// DefaultBudgets are the defaults of a server that configures none.
var DefaultBudgets = Defaults{MaxCalls: DefaultMaxCalls, MaxDuration: DefaultMaxDuration, MaxTokens: DefaultMaxTokens,
	MaxSandboxes: DefaultMaxSandboxes, MaxCPUSeconds: DefaultMaxCPUSeconds}

// Hard ceilings on budgets a caller may ask for.
const (
	MaxCallsCeiling      = 1_000_000
	MaxDurationCeiling   = 7 * 24 * time.Hour
	MaxTokensCeiling     = 1 << 40
	MaxSandboxesCeiling  = 1000
	MaxCPUSecondsCeiling = 1e7
	maxAgentLen          = 128
	maxArtifacts         = 32
)

// TripError refuses a call because a task's breaker is open (or the task
// has ended). The message tells an agent what to do.
type TripError struct {
	Code   string // CodeBudgetExhausted, CodeLoopDetected or CodeTaskEnded
	Budget string // for CodeBudgetExhausted: which budget
	Task   string
	Msg    string
}

func (e *TripError) Error() string { return e.Msg }

// InvalidError is a bad task request.
type InvalidError struct{ Msg string }

func (e *InvalidError) Error() string { return e.Msg }

// ErrNoTask: the task id is unknown.
var ErrNoTask = errors.New("task not found")

// TaskRequest creates a task. Zero budget fields take the defaults.
type TaskRequest struct {
	// Team owns the task: the caller's team, never read from a request
	// body ("" is store.DefaultTeam).
	Team          string   `json:"-"`
	Agent         string   `json:"agent"`
	MaxCalls      int64    `json:"max_calls"`
	MaxDurationS  int64    `json:"max_duration_s"`
	MaxTokens     int64    `json:"max_tokens"`
	MaxSandboxes  int64    `json:"max_sandboxes"`
	MaxCPUSeconds float64  `json:"max_cpu_seconds"`
	OnTrip        string   `json:"on_trip"`       // "kill" (default) or "keep"
	NoLoopCheck   bool     `json:"no_loop_check"` // turn loop detection off
	Artifacts     []string `json:"artifacts"`     // paths archived before a kill on trip
}

// BudgetChange raises (or lowers) budgets of an existing task; nil fields
// are unchanged.
type BudgetChange struct {
	MaxCalls      *int64   `json:"max_calls"`
	MaxDurationS  *int64   `json:"max_duration_s"`
	MaxTokens     *int64   `json:"max_tokens"`
	MaxSandboxes  *int64   `json:"max_sandboxes"`
	MaxCPUSeconds *float64 `json:"max_cpu_seconds"`
	// Reset closes an open breaker and clears the loop window.
	Reset bool `json:"reset"`
}

// Recorder receives audit events (an *audit.Log).
type Recorder interface {
	RecordTask(sandbox, task, kind string, data any)
	// RecordTaskBy is RecordTask for an event a request caused: it also
	// records the team and key id of the actor in ctx.
	RecordTaskBy(ctx context.Context, sandbox, task, kind string, data any)
}

// Config configures a Governor.
type Config struct {
	Defaults Defaults
	Loop     LoopConfig
	Audit    Recorder
	Log      *slog.Logger
	// OnTrip is called (in its own goroutine) when a task's breaker opens
	// or the task ends, with the task; the sandbox manager archives
	// artifacts and kills the task's sandboxes when t.OnTrip is "kill" or
	// the task ended.
	OnTrip func(t *store.Task)
	Now    func() time.Time
}

// Governor keeps tasks, counts their tool calls and spending, judges loops
// and opens breakers. It is safe for concurrent use.
type Governor struct {
	cfg Config
	st  *store.Store

	mu    sync.Mutex
	tasks map[string]*taskState
}

type taskState struct {
	t    *store.Task
	loop *LoopDetector
	live map[string]bool    // running sandboxes
	cpu  map[string]float64 // CPU seconds per sandbox (live and ended)
	// dirty: usage changed since the task was last written (Sweep).
	dirty bool
}

// New returns a Governor over st.
func New(cfg Config, st *store.Store) *Governor {
	d := &cfg.Defaults
	def := DefaultBudgets
	if d.MaxCalls == 0 {
		d.MaxCalls = def.MaxCalls
	}
	if d.MaxDuration == 0 {
		d.MaxDuration = def.MaxDuration
	}
	if d.MaxTokens == 0 {
		d.MaxTokens = def.MaxTokens
	}
	if d.MaxSandboxes == 0 {
		d.MaxSandboxes = def.MaxSandboxes
	}
	if d.MaxCPUSeconds == 0 {
		d.MaxCPUSeconds = def.MaxCPUSeconds
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Governor{cfg: cfg, st: st, tasks: map[string]*taskState{}}
}

func (g *Governor) record(sandbox, task, kind string, data any) {
	if g.cfg.Audit != nil {
		g.cfg.Audit.RecordTask(sandbox, task, kind, data)
	}
}

// recordBy records an event a request caused (with its key id).
func (g *Governor) recordBy(ctx context.Context, sandbox, task, kind string, data any) {
	if g.cfg.Audit != nil {
		g.cfg.Audit.RecordTaskBy(ctx, sandbox, task, kind, data)
	}
}

// Create makes a task.
func (g *Governor) Create(ctx context.Context, req TaskRequest) (*store.Task, error) {
	return g.create(ctx, req, false)
}

// CreateImplicit makes the task of a sandbox of team created without one.
func (g *Governor) CreateImplicit(ctx context.Context, team, agent string) (*store.Task, error) {
	return g.create(ctx, TaskRequest{Team: team, Agent: agent}, true)
}

// CheckAgent refuses an agent name that is too long or holds a control
// character: the one rule for the agent of a task and of a sandbox
// create. It defends against a name that would split or forge lines of
// the audit log and console views, and against a NUL the store and
// admission's per-agent limits would treat as another agent.
func CheckAgent(agent string) error {
	if len(agent) > maxAgentLen {
		return &InvalidError{Msg: fmt.Sprintf("agent must be at most %d bytes", maxAgentLen)}
	}
	if !safetext.Clean(agent, false) {
		return &InvalidError{Msg: fmt.Sprintf("agent %q holds a control character", agent)}
	}
	return nil
}

func (g *Governor) create(ctx context.Context, req TaskRequest, implicit bool) (*store.Task, error) {
	b, err := g.budgets(req)
	if err != nil {
		return nil, err
	}
	switch req.OnTrip {
	case "":
		req.OnTrip = "kill"
	case "kill", "keep":
	default:
		return nil, &InvalidError{Msg: `on_trip must be "kill" or "keep"`}
	}
	if err := CheckAgent(req.Agent); err != nil {
		return nil, err
	}
	if len(req.Artifacts) > maxArtifacts {
		return nil, &InvalidError{Msg: fmt.Sprintf("at most %d artifacts", maxArtifacts)}
	}
	for _, a := range req.Artifacts {
		if len(a) == 0 || a[0] != '/' || len(a) > 1024 {
			return nil, &InvalidError{Msg: fmt.Sprintf("artifact %q must be an absolute path inside the sandbox", a)}
		}
	}
	b.NoLoopCheck = req.NoLoopCheck
	t := &store.Task{ID: idgen.New("t", 19), Team: req.Team, Agent: req.Agent, Implicit: implicit, State: store.TaskOpen,
		Budgets: b, OnTrip: req.OnTrip, Artifacts: req.Artifacts, CreatedAt: g.cfg.Now().UTC()}
	if err := g.st.InsertTask(ctx, t); err != nil {
		return nil, err
	}
	g.mu.Lock()
	g.tasks[t.ID] = g.newState(t)
	g.mu.Unlock()
	g.recordBy(ctx, "", t.ID, "task.created", map[string]any{"agent": t.Agent, "implicit": implicit, "budgets": t.Budgets, "on_trip": t.OnTrip})
	return cloneTask(t), nil
}

func (g *Governor) newState(t *store.Task) *taskState {
	return &taskState{t: t, loop: NewLoopDetector(g.cfg.Loop), live: map[string]bool{}, cpu: map[string]float64{}}
}

func (g *Governor) budgets(req TaskRequest) (store.TaskBudgets, error) {
	d := g.cfg.Defaults
	b := store.TaskBudgets{MaxCalls: d.MaxCalls, MaxDurationS: int64(d.MaxDuration / time.Second),
		MaxTokens: d.MaxTokens, MaxSandboxes: d.MaxSandboxes, MaxCPUSeconds: d.MaxCPUSeconds}
	ch := BudgetChange{}
	if req.MaxCalls != 0 {
		ch.MaxCalls = &req.MaxCalls
	}
	if req.MaxDurationS != 0 {
		ch.MaxDurationS = &req.MaxDurationS
	}
	if req.MaxTokens != 0 {
		ch.MaxTokens = &req.MaxTokens
	}
	if req.MaxSandboxes != 0 {
		ch.MaxSandboxes = &req.MaxSandboxes
	}
	if req.MaxCPUSeconds != 0 {
		ch.MaxCPUSeconds = &req.MaxCPUSeconds
	}
	return applyChange(b, ch)
}

func applyChange(b store.TaskBudgets, ch BudgetChange) (store.TaskBudgets, error) {
	bad := func(name string, max any) error {
		return &InvalidError{Msg: fmt.Sprintf("%s must be between 1 and %v", name, max)}
	}
	if v := ch.MaxCalls; v != nil {
		if *v < 1 || *v > MaxCallsCeiling {
			return b, bad("max_calls", MaxCallsCeiling)
		}
		b.MaxCalls = *v
	}
	if v := ch.MaxDurationS; v != nil {
		if *v < 1 || *v > int64(MaxDurationCeiling/time.Second) {
			return b, bad("max_duration_s", int64(MaxDurationCeiling/time.Second))
		}
		b.MaxDurationS = *v
	}
	if v := ch.MaxTokens; v != nil {
		if *v < 1 || *v > MaxTokensCeiling {
			return b, bad("max_tokens", int64(MaxTokensCeiling))
		}
		b.MaxTokens = *v
	}
	if v := ch.MaxSandboxes; v != nil {
		if *v < 1 || *v > MaxSandboxesCeiling {
			return b, bad("max_sandboxes", MaxSandboxesCeiling)
		}
		b.MaxSandboxes = *v
	}
	if v := ch.MaxCPUSeconds; v != nil {
		if !(*v >= 1 && *v <= MaxCPUSecondsCeiling) {
			return b, bad("max_cpu_seconds", MaxCPUSecondsCeiling)
		}
		b.MaxCPUSeconds = *v
	}
	return b, nil
}

func cloneTask(t *store.Task) *store.Task {
	c := *t
	c.Artifacts = slices.Clone(t.Artifacts)
	return &c
}

// openState is state for a task that has not ended; an ended task is
// refused with its code. g.mu must be held.
func (g *Governor) openState(ctx context.Context, id string) (*taskState, error) {
	ts, err := g.state(ctx, id)
	if err != nil {
		return nil, err
	}
	if ts.t.State == store.TaskEnded {
		return nil, refusal(ts.t)
	}
	return ts, nil
}

// state returns the cached state of an open or tripped task, loading it
// from the store if needed. g.mu is held.
func (g *Governor) state(ctx context.Context, id string) (*taskState, error) {
	if ts := g.tasks[id]; ts != nil {
		return ts, nil
	}
	t, err := g.st.GetTask(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrNoTask
	}
	if err != nil {
		return nil, err
	}
	ts := g.newState(t)
	if t.State != store.TaskEnded {
		g.tasks[id] = ts
	}
	return ts, nil
}

// Get returns a task.
func (g *Governor) Get(ctx context.Context, id string) (*store.Task, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ts, err := g.state(ctx, id)
	if err != nil {
		return nil, err
	}
	g.checkDuration(ts)
	return cloneTask(ts.t), nil
}

// LiveSandboxes returns the running sandboxes of a task.
func (g *Governor) LiveSandboxes(id string) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	ts := g.tasks[id]
	if ts == nil {
		return nil
	}
	var out []string
	for sb := range ts.live {
		out = append(out, sb)
	}
	slices.Sort(out)
	return out
}

// refusal is the error for a call on a task whose breaker is open. g.mu
// is held.
func refusal(ts *store.Task) error {
	if ts.State == store.TaskEnded {
		return &TripError{Code: CodeTaskEnded, Task: ts.ID, Msg: "task " + ts.ID + " has ended; start a new task"}
	}
	b := ts.Breaker
	msg := b.Reason
	switch b.Code {
	case CodeBudgetExhausted:
		msg = fmt.Sprintf("budget_exhausted: the task's %s budget is spent (%s). Stop making tool calls: summarise what you have done and found so far, and finish.", b.Budget, b.Reason)
	case CodeLoopDetected:
		msg = fmt.Sprintf("loop_detected: %s. You are repeating the same call; stop, summarise what you tried and why it failed, and finish.", b.Reason)
	}
	return &TripError{Code: b.Code, Budget: b.Budget, Task: ts.ID, Msg: msg}
}

// AdmitSandbox checks that task id may start one more sandbox and counts
// it as live (call SandboxEnded when it ends).
func (g *Governor) AdmitSandbox(ctx context.Context, id, sandbox string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	ts, err := g.state(ctx, id)
	if err != nil {
		return err
	}
	g.checkDuration(ts)
	if ts.t.Breaker.Open || ts.t.State == store.TaskEnded {
		return refusal(ts.t)
	}
	if int64(len(ts.live)) >= ts.t.Budgets.MaxSandboxes {
		return &TripError{Code: CodeBudgetExhausted, Budget: BudgetSandboxes, Task: id,
			Msg: fmt.Sprintf("budget_exhausted: the task already runs %d sandboxes (max_sandboxes %d); kill one or reuse it", len(ts.live), ts.t.Budgets.MaxSandboxes)}
	}
	ts.live[sandbox] = true
	ts.t.Usage.Sandboxes++
	g.persist(ts)
	return nil
}

// AdoptSandbox counts a sandbox that already runs (after a restart).
func (g *Governor) AdoptSandbox(ctx context.Context, id, sandbox string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ts, err := g.state(ctx, id); err == nil {
		ts.live[sandbox] = true
	}
}

// SandboxEnded stops counting a sandbox as live.
func (g *Governor) SandboxEnded(id, sandbox string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ts := g.tasks[id]
	if ts == nil {
		return
	}
	delete(ts.live, sandbox)
	// An implicit task lives as long as its one sandbox: it ends with it
	// (a tripped one keeps its breaker, so that late calls still hear
	// why) and leaves memory.
	if ts.t.Implicit && len(ts.live) == 0 {
		if ts.t.State == store.TaskOpen {
			now := g.cfg.Now().UTC()
			ts.t.State, ts.t.EndedAt = store.TaskEnded, &now
		}
		g.persist(ts)
		delete(g.tasks, id)
	}
}

// CallTicket is one admitted tool call.
type CallTicket struct {
	g       *Governor
	task    string
	sandbox string
	command string
}

// BeginCall admits one tool call (a command) of task id in sandbox, or
// refuses it with a *TripError. Admitting counts it against max_calls; the
// call that would exceed the budget opens the breaker and is refused.
// With rec non-nil, an admitted call's command record is inserted in the
// transaction that stores the counter (store.Store.StartCommand), and
// rec.ID is set: one commit, before the command runs. The count is
// exact under concurrency: it is taken, and its write queued, under the
// governor's lock; the commit is waited for after the lock is released
// (so that concurrent calls share one commit), and queued writes commit
// in the order they were queued, so the stored counter never goes back.
func (g *Governor) BeginCall(ctx context.Context, id, sandbox, command string, rec *store.Command) (*CallTicket, error) {
	g.mu.Lock()
	ts, err := g.state(ctx, id)
	if err != nil {
		g.mu.Unlock()
		return nil, err
	}
	g.checkDuration(ts)
	if ts.t.Breaker.Open || ts.t.State == store.TaskEnded {
		g.record(sandbox, id, "task.call_refused", map[string]any{"command": clip(command), "code": ts.t.Breaker.Code, "budget": ts.t.Breaker.Budget})
		err := refusal(ts.t)
		g.mu.Unlock()
		return nil, err
	}
	if ts.t.Usage.Calls >= ts.t.Budgets.MaxCalls {
		g.trip(ts, CodeBudgetExhausted, BudgetCalls, fmt.Sprintf("%d of %d tool calls made", ts.t.Usage.Calls, ts.t.Budgets.MaxCalls))
		g.record(sandbox, id, "task.call_refused", map[string]any{"command": clip(command), "code": CodeBudgetExhausted, "budget": BudgetCalls})
		err := refusal(ts.t)
		g.mu.Unlock()
		return nil, err
	}
	ts.t.Usage.Calls++
	ts.dirty = false
	var waitStart func() (int64, error)
	var waitTask func() error
	if rec == nil {
		waitTask = g.st.QueueTaskUpdate(ctx, ts.t)
	} else {
		waitStart = g.st.QueueStartCommand(ctx, rec, ts.t)
	}
	g.mu.Unlock()
	if waitTask != nil {
		err = waitTask()
	} else if rec.ID, err = waitStart(); err != nil {
		err = fmt.Errorf("record command: %w", err)
	}
	if err != nil {
		g.cfg.Log.Error("record call", "task", id, "sandbox", sandbox, "err", err)
		// The counter is written again with whatever the task is now.
		g.mu.Lock()
		g.persist(ts)
		g.mu.Unlock()
	}
	return &CallTicket{g: g, task: id, sandbox: sandbox, command: command}, nil
}

// End reports how the call ended and returns warnings for the caller (a
// loop suspected). A detected loop opens the breaker: the next call is
// refused with loop_detected.
func (c *CallTicket) End(exitCode int, failed bool) []string {
	if c == nil {
		return nil
	}
	g := c.g
	g.mu.Lock()
	defer g.mu.Unlock()
	ts := g.tasks[c.task]
	if ts == nil || ts.t.Budgets.NoLoopCheck {
		return nil
	}
	v := ts.loop.Observe(Call{Command: c.command, ExitCode: exitCode, Failed: failed})
	switch {
	case v.Detected && !ts.t.Breaker.Open:
		g.trip(ts, CodeLoopDetected, "", v.Reason)
		return []string{"loop_detected: " + v.Reason + "; further tool calls of this task are refused"}
	case v.Suspected:
		g.record(c.sandbox, c.task, "task.loop_suspected", map[string]any{"repeats": v.Repeats, "score": v.Score, "reason": v.Reason})
		return []string{"loop_suspected: " + v.Reason + "; change approach or stop"}
	}
	return nil
}

// ReportTokens adds tokens the agent spent; over max_tokens the breaker
// opens. It returns the task.
func (g *Governor) ReportTokens(ctx context.Context, id string, n int64) (*store.Task, error) {
	if n < 0 || n > MaxTokensCeiling {
		return nil, &InvalidError{Msg: "tokens must be between 0 and 2^40"}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	ts, err := g.openState(ctx, id)
	if err != nil {
		return nil, err
	}
	ts.t.Usage.Tokens += n
	g.record("", id, "task.tokens", map[string]any{"tokens": n, "total": ts.t.Usage.Tokens})
	if ts.t.Usage.Tokens > ts.t.Budgets.MaxTokens && !ts.t.Breaker.Open {
		g.trip(ts, CodeBudgetExhausted, BudgetTokens, fmt.Sprintf("%d of %d tokens spent", ts.t.Usage.Tokens, ts.t.Budgets.MaxTokens))
	} else {
		g.persist(ts)
	}
	return cloneTask(ts.t), nil
}

// UpdateCPU records the CPU seconds a sandbox of task id has used so far;
// over max_cpu_seconds (all its sandboxes together) the breaker opens.
func (g *Governor) UpdateCPU(id, sandbox string, seconds float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ts := g.tasks[id]
	if ts == nil || ts.t.State == store.TaskEnded {
		return
	}
	if seconds < ts.cpu[sandbox] {
		return
	}
	ts.cpu[sandbox] = seconds
	total := 0.0
	for _, v := range ts.cpu {
		total += v
	}
	ts.t.Usage.CPUSeconds = total
	ts.dirty = true
	if total > ts.t.Budgets.MaxCPUSeconds && !ts.t.Breaker.Open {
		g.trip(ts, CodeBudgetExhausted, BudgetCPUSeconds, fmt.Sprintf("%.0f of %.0f CPU seconds used", total, ts.t.Budgets.MaxCPUSeconds))
	}
}

// Sweep checks the wall-duration budget of every open task (call it
// periodically) and writes CPU usage that changed through to the store.
func (g *Governor) Sweep() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, ts := range g.tasks {
		if ts.t.State == store.TaskOpen {
			g.checkDuration(ts)
			if ts.dirty {
				g.persist(ts)
			}
		}
	}
}

// checkDuration opens the breaker of a task past max_duration. g.mu is held.
func (g *Governor) checkDuration(ts *taskState) {
	if ts.t.Breaker.Open || ts.t.State != store.TaskOpen {
		return
	}
	lim := time.Duration(ts.t.Budgets.MaxDurationS) * time.Second
	if age := g.cfg.Now().Sub(ts.t.CreatedAt); age > lim {
		g.trip(ts, CodeBudgetExhausted, BudgetDuration, fmt.Sprintf("the task has run %s of %s", age.Round(time.Second), lim))
	}
}

// trip opens the breaker. g.mu is held.
func (g *Governor) trip(ts *taskState, code, budget, reason string) {
	now := g.cfg.Now().UTC()
	ts.t.Breaker = store.Breaker{Open: true, Code: code, Budget: budget, Reason: reason, At: &now}
	ts.t.State = store.TaskTripped
	g.persist(ts)
	g.record("", ts.t.ID, "task.breaker_open", map[string]any{"code": code, "budget": budget, "reason": reason, "usage": ts.t.Usage, "on_trip": ts.t.OnTrip})
	g.cfg.Log.Warn("task breaker open", "task", ts.t.ID, "code", code, "budget", budget, "reason", reason)
	if g.cfg.OnTrip != nil {
		t := cloneTask(ts.t)
		go g.cfg.OnTrip(t)
	}
}

// persist writes the task. g.mu is held.
func (g *Governor) persist(ts *taskState) {
	ts.dirty = false
	if err := g.st.UpdateTask(context.Background(), ts.t); err != nil {
		g.cfg.Log.Error("record task", "task", ts.t.ID, "err", err)
	}
}

// Change raises or lowers a task's budgets and, with Reset, closes its
// breaker (operator action).
func (g *Governor) Change(ctx context.Context, id string, ch BudgetChange) (*store.Task, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ts, err := g.openState(ctx, id)
	if err != nil {
		return nil, err
	}
	b, err := applyChange(ts.t.Budgets, ch)
	if err != nil {
		return nil, err
	}
	ts.t.Budgets = b
	if ch.Reset {
		ts.t.Breaker = store.Breaker{}
		ts.t.State = store.TaskOpen
		ts.loop.Reset()
	}
	g.persist(ts)
	g.record("", id, "task.changed", map[string]any{"budgets": b, "reset": ch.Reset})
	return cloneTask(ts.t), nil
}

// EndTask closes a task; its sandboxes are killed (through OnTrip).
func (g *Governor) EndTask(ctx context.Context, id string) (*store.Task, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ts, err := g.state(ctx, id)
	if err != nil {
		return nil, err
	}
	if ts.t.State == store.TaskEnded {
		return cloneTask(ts.t), nil
	}
	now := g.cfg.Now().UTC()
	ts.t.State = store.TaskEnded
	ts.t.EndedAt = &now
	g.persist(ts)
	delete(g.tasks, id)
	g.record("", id, "task.ended", map[string]any{"usage": ts.t.Usage})
	t := cloneTask(ts.t)
	if g.cfg.OnTrip != nil {
		go g.cfg.OnTrip(t)
	}
	return cloneTask(t), nil
}

func clip(s string) string {
	if len(s) > 1024 {
		return s[:1024] + "…"
	}
	return s
}

// Refusal returns the error a call of task id gets while its breaker is
// open or it has ended, or nil.
func (g *Governor) Refusal(ctx context.Context, id string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	ts, err := g.state(ctx, id)
	if err != nil || (!ts.t.Breaker.Open && ts.t.State != store.TaskEnded) {
		return nil
	}
	return refusal(ts.t)
}
