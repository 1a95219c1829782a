package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Task states.
const (
	TaskOpen    = "open"    // calls are admitted
	TaskTripped = "tripped" // a breaker is open: calls are refused
	TaskEnded   = "ended"   // closed by the caller or the operator
)

// TaskBudgets are a task's ceilings; zero means "no limit" for that budget
// (the API fills server defaults before storing).
type TaskBudgets struct {
	MaxCalls      int64   `json:"max_calls"`
	MaxDurationS  int64   `json:"max_duration_s"`
	MaxTokens     int64   `json:"max_tokens"`
	MaxSandboxes  int64   `json:"max_sandboxes"`
	MaxCPUSeconds float64 `json:"max_cpu_seconds"`
	// NoLoopCheck turns loop detection off for the task (health checks,
	// benchmarks: the same call on purpose).
	NoLoopCheck bool `json:"no_loop_check,omitempty"`
}

// TaskUsage is what a task has spent.
type TaskUsage struct {
	Calls      int64   `json:"calls"`
	Tokens     int64   `json:"tokens"`
	CPUSeconds float64 `json:"cpu_seconds"`
	Sandboxes  int64   `json:"sandboxes_created"`
}

// Breaker is a task's circuit breaker. When Open, tool calls are refused
// with Code (budget_exhausted or loop_detected).
type Breaker struct {
	Open   bool       `json:"open"`
	Code   string     `json:"code,omitempty"`
	Budget string     `json:"budget,omitempty"`
	Reason string     `json:"reason,omitempty"`
	At     *time.Time `json:"at,omitempty"`
}

// Task is one agent session: the sandboxes and tool calls of one run.
type Task struct {
	ID string
	// Team owns the task: the team of the key that created it.
	Team     string
	Agent    string
	Implicit bool // made for one sandbox created without a task
	State    string
	Budgets  TaskBudgets
	Usage    TaskUsage
	Breaker  Breaker
	// OnTrip is what happens to the task's sandboxes when a breaker
	// opens: "kill" (default, after archiving Artifacts) or "keep".
	OnTrip string
	// Artifacts are paths copied out of each sandbox before it is killed
	// on a trip.
	Artifacts []string
	CreatedAt time.Time
	EndedAt   *time.Time
}

const taskCols = `id, agent, implicit, state, budgets, usage, breaker, on_trip, artifacts, created_at, ended_at, team`

// InsertTask records a new task.
func (s *Store) InsertTask(ctx context.Context, t *Task) error {
	b, _ := json.Marshal(t.Budgets)
	u, _ := json.Marshal(t.Usage)
	br, _ := json.Marshal(t.Breaker)
	arts := t.Artifacts
	if arts == nil {
		arts = []string{}
	}
	a, _ := json.Marshal(arts)
	_, err := s.db.ExecContext(ctx, `INSERT INTO tasks (`+taskCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,NULL,?)`,
		t.ID, t.Agent, b2i(t.Implicit), t.State, string(b), string(u), string(br), t.OnTrip, string(a), ms(t.CreatedAt), teamOr(t.Team))
	if err != nil {
		return fmt.Errorf("insert task %s: %w", t.ID, err)
	}
	return nil
}

// UpdateTask stores t's state, budgets, usage, breaker and end time.
func (s *Store) UpdateTask(ctx context.Context, t *Task) error {
	return s.QueueTaskUpdate(ctx, t)()
}

// QueueTaskUpdate is UpdateTask in two steps (see QueueStartCommand): it
// queues the write of a copy of t as it is now and returns the function
// that waits for its commit.
func (s *Store) QueueTaskUpdate(ctx context.Context, t *Task) (wait func() error) {
	if s.db.group == nil {
		// No group commit (PostgreSQL): one statement, at once.
		err := updateTask(ctx, s.db, t)
		return func() error { return err }
	}
	ctx = context.WithoutCancel(ctx)
	tc := *t
	done := s.db.queue(func(tx *tx) error { return updateTask(ctx, tx, &tc) }, false)
	return func() error { return <-done }
}

func updateTask(ctx context.Context, e execer, t *Task) error {
	b, _ := json.Marshal(t.Budgets)
	u, _ := json.Marshal(t.Usage)
	br, _ := json.Marshal(t.Breaker)
	var ended any
	if t.EndedAt != nil {
		ended = ms(*t.EndedAt)
	}
	r, err := e.ExecContext(ctx, `UPDATE tasks SET state=?, budgets=?, usage=?, breaker=?, ended_at=? WHERE id=?`,
		t.State, string(b), string(u), string(br), ended, t.ID)
	if err != nil {
		return fmt.Errorf("update task %s: %w", t.ID, err)
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// GetTask returns the task id.
func (s *Store) GetTask(ctx context.Context, id string) (*Task, error) {
	t, err := scanTask(s.db.QueryRowContext(ctx, `SELECT `+taskCols+` FROM tasks WHERE id=?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("get task %s: %w", id, err)
	}
	return t, nil
}

// TaskFilter selects tasks; zero fields match everything.
type TaskFilter struct {
	// Team selects one team's tasks ("" = every team's).
	Team string
	// States selects tasks in one of the states.
	States []string
}

// ListTasks returns the tasks f selects, newest first.
func (s *Store) ListTasks(ctx context.Context, f TaskFilter) ([]*Task, error) {
	q := `SELECT ` + taskCols + ` FROM tasks WHERE 1=1`
	var args []any
	if f.Team != "" {
		q += ` AND team=?`
		args = append(args, f.Team)
	}
	if states := f.States; len(states) > 0 {
		q += ` AND state IN (?` + strings.Repeat(",?", len(states)-1) + `)`
		for _, st := range states {
			args = append(args, st)
		}
	}
	q += ` ORDER BY created_at DESC, id`
	return queryAll(ctx, s.db, "list tasks", q, args, scanTask)
}

func scanTask(sc scanner) (*Task, error) {
	var t Task
	var b, u, br, a string
	var created int64
	var ended sql.NullInt64
	if err := sc.Scan(&t.ID, &t.Agent, &t.Implicit, &t.State, &b, &u, &br, &t.OnTrip, &a, &created, &ended, &t.Team); err != nil {
		return nil, err
	}
	_ = json.Unmarshal([]byte(b), &t.Budgets)
	_ = json.Unmarshal([]byte(u), &t.Usage)
	_ = json.Unmarshal([]byte(br), &t.Breaker)
	_ = json.Unmarshal([]byte(a), &t.Artifacts)
	t.CreatedAt = time.UnixMilli(created).UTC()
	if ended.Valid {
		e := time.UnixMilli(ended.Int64).UTC()
		t.EndedAt = &e
	}
	return &t, nil
}

// TaskSandboxes returns the ids of a task's sandboxes in the given states
// (all if none).
func (s *Store) TaskSandboxes(ctx context.Context, taskID string, states ...string) ([]string, error) {
	q := `SELECT id FROM sandboxes WHERE task_id=?`
	args := []any{taskID}
	if len(states) > 0 {
		q += ` AND state IN (?` + strings.Repeat(",?", len(states)-1) + `)`
		for _, st := range states {
			args = append(args, st)
		}
	}
	return queryAll(ctx, s.db, "task sandboxes", q+` ORDER BY created_at`, args, scanString)
}
