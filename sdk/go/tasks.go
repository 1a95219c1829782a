package corral

import (
	"context"
	"net/url"
	"time"
)

// Task is an agent session: the sandboxes and tool calls of one run, with
// budgets and a circuit breaker.
type Task struct {
	ID       string `json:"id"`
	Agent    string `json:"agent"`
	Implicit bool   `json:"implicit"`
	// State is open, tripped (a breaker is open) or ended.
	State     string      `json:"state"`
	Budgets   TaskBudgets `json:"budgets"`
	Usage     TaskUsage   `json:"usage"`
	Breaker   Breaker     `json:"breaker"`
	OnTrip    string      `json:"on_trip"`
	Artifacts []string    `json:"artifacts"`
	// Sandboxes are the task's running sandboxes.
	Sandboxes []string   `json:"sandboxes"`
	CreatedAt time.Time  `json:"created_at"`
	EndedAt   *time.Time `json:"ended_at"`
	// Team is the team that owns it.
	Team string `json:"team"`
}

// TaskBudgets are a task's ceilings.
type TaskBudgets struct {
	MaxCalls      int64   `json:"max_calls"`
	MaxDurationS  int64   `json:"max_duration_s"`
	MaxTokens     int64   `json:"max_tokens"`
	MaxSandboxes  int64   `json:"max_sandboxes"`
	MaxCPUSeconds float64 `json:"max_cpu_seconds"`
	NoLoopCheck   bool    `json:"no_loop_check,omitempty"`
}

// TaskUsage is what a task has spent.
type TaskUsage struct {
	Calls      int64   `json:"calls"`
	Tokens     int64   `json:"tokens"`
	CPUSeconds float64 `json:"cpu_seconds"`
	Sandboxes  int64   `json:"sandboxes_created"`
}

// Breaker is a task's circuit breaker.
type Breaker struct {
	Open   bool       `json:"open"`
	Code   string     `json:"code,omitempty"`
	Budget string     `json:"budget,omitempty"`
	Reason string     `json:"reason,omitempty"`
	At     *time.Time `json:"at,omitempty"`
}

// TaskOptions create a task; zero fields take the server's defaults.
type TaskOptions struct {
	Agent         string        `json:"agent,omitempty"`
	MaxCalls      int64         `json:"max_calls,omitempty"`
	MaxDuration   time.Duration `json:"-"`
	MaxTokens     int64         `json:"max_tokens,omitempty"`
	MaxSandboxes  int64         `json:"max_sandboxes,omitempty"`
	MaxCPUSeconds float64       `json:"max_cpu_seconds,omitempty"`
	// OnTrip is "kill" (default: archive Artifacts, then kill the task's
	// sandboxes when a breaker opens) or "keep".
	OnTrip    string   `json:"on_trip,omitempty"`
	Artifacts []string `json:"artifacts,omitempty"`
	// NoLoopCheck turns loop detection off (a task that repeats a call on
	// purpose: health checks, benchmarks).
	NoLoopCheck bool `json:"no_loop_check,omitempty"`
}

// CreateTask creates a task (POST /v1/tasks).
func (c *Client) CreateTask(ctx context.Context, o TaskOptions) (*Task, error) {
	body := struct {
		TaskOptions
		MaxDurationS int64 `json:"max_duration_s,omitempty"`
	}{o, durationSeconds(o.MaxDuration)}
	var t Task
	if err := c.do(ctx, "POST", "/v1/tasks", nil, body, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// GetTask returns a task (GET /v1/tasks/{id}).
func (c *Client) GetTask(ctx context.Context, id string) (*Task, error) {
	var t Task
	if err := c.do(ctx, "GET", "/v1/tasks/"+url.PathEscape(id), nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// ListTasks lists tasks; state is open, tripped, ended, all or "" (open
// and tripped).
func (c *Client) ListTasks(ctx context.Context, state string) ([]Task, error) {
	return c.Tasks(ctx, TaskQuery{State: state})
}

// TaskQuery filters Tasks.
type TaskQuery struct {
	// State is open, tripped, ended, all or "" (open and tripped).
	State string
	// Team lists another team's tasks, or every team's with "all"
	// (admin keys only). Empty: the key's own team.
	Team string
}

// Tasks lists the tasks q selects (GET /v1/tasks).
func (c *Client) Tasks(ctx context.Context, q TaskQuery) ([]Task, error) {
	v := url.Values{}
	if q.State != "" {
		v.Set("state", q.State)
	}
	if q.Team != "" {
		v.Set("team", q.Team)
	}
	var out struct {
		Tasks []Task `json:"tasks"`
	}
	if err := c.do(ctx, "GET", "/v1/tasks", v, nil, &out); err != nil {
		return nil, err
	}
	return out.Tasks, nil
}

// TaskChange raises or lowers budgets and can reset the breaker; nil
// fields are unchanged.
type TaskChange struct {
	MaxCalls      *int64   `json:"max_calls,omitempty"`
	MaxDurationS  *int64   `json:"max_duration_s,omitempty"`
	MaxTokens     *int64   `json:"max_tokens,omitempty"`
	MaxSandboxes  *int64   `json:"max_sandboxes,omitempty"`
	MaxCPUSeconds *float64 `json:"max_cpu_seconds,omitempty"`
	Reset         bool     `json:"reset,omitempty"`
}

// ChangeTask applies an operator change (PATCH /v1/tasks/{id}).
func (c *Client) ChangeTask(ctx context.Context, id string, ch TaskChange) (*Task, error) {
	var t Task
	if err := c.do(ctx, "PATCH", "/v1/tasks/"+url.PathEscape(id), nil, ch, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// EndTask ends a task and kills its sandboxes (DELETE /v1/tasks/{id}).
func (c *Client) EndTask(ctx context.Context, id string) (*Task, error) {
	var t Task
	if err := c.do(ctx, "DELETE", "/v1/tasks/"+url.PathEscape(id), nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// ReportTokens adds model tokens the agent spent to its task's count
// (POST /v1/tasks/{id}/tokens); over max_tokens the breaker opens.
func (c *Client) ReportTokens(ctx context.Context, id string, tokens int64) (*Task, error) {
	body := struct {
		Tokens int64 `json:"tokens"`
	}{tokens}
	var t Task
	if err := c.do(ctx, "POST", "/v1/tasks/"+url.PathEscape(id)+"/tokens", nil, body, &t); err != nil {
		return nil, err
	}
	return &t, nil
}
