package corral

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/url"
	"time"
)

// Sandbox states.
const (
	StateRunning = "running"
	StatePaused  = "paused"
	StateEnded   = "ended"
)

// Resources are a sandbox's limits. In [CreateOptions] a zero field means
// "the tier's value".
type Resources struct {
	// CPU is the number of cores, fractional (0.01..64).
	CPU float64 `json:"cpu,omitempty"`
	// MemoryMB is the memory limit in MiB; there is no swap.
	MemoryMB int64 `json:"memory_mb,omitempty"`
	// DiskMB caps the writable layer, in MiB.
	DiskMB int64 `json:"disk_mb,omitempty"`
	// Pids is the maximum number of processes and threads.
	Pids int64 `json:"pids,omitempty"`
	// Nofile is RLIMIT_NOFILE for processes in the sandbox.
	Nofile int64 `json:"nofile,omitempty"`
}

func (r Resources) isZero() bool { return r == Resources{} }

// Sandbox is a sandbox as reported by the server. Its JSON encoding is the
// REST API's Sandbox object. The methods that talk to the server (Kill,
// SetTimeout, Refresh) update the fields in place; a Sandbox is not safe
// for concurrent mutation, but Run, Start, Files and the other agent calls
// may be used concurrently.
type Sandbox struct {
	ID string
	// Team is the team that owns the sandbox.
	Team     string
	Template string
	Runtime  string
	// State is StateRunning, StatePaused or StateEnded.
	State     string
	Tier      string
	Resources Resources
	// CommandTimeout is the default per-command timeout (0: none).
	CommandTimeout time.Duration
	// Network is the egress mode: none, allow or all-public.
	Network string
	// Allow lists the domain patterns and CIDR:port rules of mode allow.
	Allow []string
	// Secrets names the brokered secrets the sandbox may use.
	Secrets []string
	// Warnings come with a newly created sandbox (for example env vars
	// that look like secrets).
	Warnings  []string
	Metadata  map[string]string
	CreatedAt time.Time
	ExpiresAt time.Time
	// EndedAt is nil while the sandbox runs.
	EndedAt *time.Time
	// EndReason says why an ended sandbox ended: killed, ttl, oom, error,
	// orphaned, budget_exhausted, loop_detected, task_ended or cpu_runaway.
	EndReason string
	// Task is the task the sandbox belongs to.
	Task string
	// Snapshot is the snapshot the sandbox was created from ("" for a
	// sandbox created from a template).
	Snapshot string
	// Volumes are the volumes the sandbox mounts.
	Volumes []MountedVolume
	// Node is the control plane that runs the sandbox (its --node-id).
	Node string
	// PublicTraffic is false when the sandbox's ports are private: a
	// request to one must carry TrafficToken in the
	// e2b-traffic-access-token header (TrafficTokenHeader).
	PublicTraffic bool
	TrafficToken  string
	// Current is the server's newest resource sample of the sandbox
	// (one a second), set by List and Get while the sandbox runs or is
	// paused; nil before the first sample and once it ended.
	Current *Sample

	client *Client
}

// Sample is one resource sample of a sandbox, taken by the server's
// watchdog from the sandbox's cgroup.
type Sample struct {
	Time time.Time `json:"time"`
	// CPUPercent is the CPU used since the previous sample, in percent
	// of one core.
	CPUPercent  float64 `json:"cpu_percent"`
	CPUSeconds  float64 `json:"cpu_seconds"`
	MemoryBytes int64   `json:"memory_bytes"`
	DiskBytes   int64   `json:"disk_bytes"`
	Pids        int64   `json:"pids"`
	OOMKills    uint64  `json:"oom_kills"`
}

// MountedVolume is a volume mounted in a sandbox.
type MountedVolume struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	Path string `json:"path"`
}

type sandboxWire struct {
	ID             string            `json:"id"`
	Team           string            `json:"team"`
	Template       string            `json:"template"`
	Runtime        string            `json:"runtime"`
	State          string            `json:"state"`
	Tier           string            `json:"tier"`
	Resources      Resources         `json:"resources"`
	CommandTimeout float64           `json:"command_timeout"`
	Network        string            `json:"network"`
	Allow          []string          `json:"allow"`
	Secrets        []string          `json:"secrets"`
	Warnings       []string          `json:"warnings,omitempty"`
	Metadata       map[string]string `json:"metadata"`
	CreatedAt      time.Time         `json:"created_at"`
	ExpiresAt      time.Time         `json:"expires_at"`
	EndedAt        *time.Time        `json:"ended_at"`
	EndReason      string            `json:"end_reason"`
	Task           string            `json:"task"`
	Snapshot       string            `json:"snapshot"`
	Volumes        []MountedVolume   `json:"volumes"`
	Node           string            `json:"node"`
	PublicTraffic  bool              `json:"public_traffic"`
	TrafficToken   string            `json:"traffic_token,omitempty"`
	Current        *Sample           `json:"current,omitempty"`
}

// TrafficTokenHeader is the header that carries a private sandbox's
// traffic token on a request to one of its ports.
const TrafficTokenHeader = "e2b-traffic-access-token"

// MarshalJSON encodes s as the REST API's Sandbox object.
func (s *Sandbox) MarshalJSON() ([]byte, error) {
	md := s.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return json.Marshal(sandboxWire{
		ID: s.ID, Template: s.Template, Runtime: s.Runtime, State: s.State, Tier: s.Tier,
		Resources: s.Resources, CommandTimeout: s.CommandTimeout.Seconds(), Network: s.Network,
		Allow: orEmptyList(s.Allow), Secrets: orEmptyList(s.Secrets), Warnings: s.Warnings,
		Metadata: md, CreatedAt: s.CreatedAt, ExpiresAt: s.ExpiresAt, EndedAt: s.EndedAt,
		EndReason: s.EndReason, Task: s.Task, Snapshot: s.Snapshot, Volumes: orEmptyList(s.Volumes), Node: s.Node,
		PublicTraffic: s.PublicTraffic, TrafficToken: s.TrafficToken, Current: s.Current,
	})
}

// UnmarshalJSON decodes the REST API's Sandbox object. It keeps the client
// the Sandbox is bound to.
func (s *Sandbox) UnmarshalJSON(b []byte) error {
	var w sandboxWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	client := s.client
	*s = Sandbox{
		ID: w.ID, Team: w.Team, Template: w.Template, Runtime: w.Runtime, State: w.State, Tier: w.Tier,
		Resources: w.Resources, CommandTimeout: secondsToDuration(w.CommandTimeout), Network: w.Network,
		Allow: w.Allow, Secrets: w.Secrets, Warnings: w.Warnings,
		Metadata: w.Metadata, CreatedAt: w.CreatedAt, ExpiresAt: w.ExpiresAt, EndedAt: w.EndedAt,
		EndReason: w.EndReason, Task: w.Task, Snapshot: w.Snapshot, Volumes: w.Volumes, Node: w.Node,
		PublicTraffic: w.PublicTraffic, TrafficToken: w.TrafficToken, Current: w.Current, client: client,
	}
	return nil
}

// Running reports whether the sandbox was running when last fetched.
func (s *Sandbox) Running() bool { return s.State == StateRunning }

// Client returns the client the sandbox is bound to.
func (s *Sandbox) Client() *Client { return s.client }

func secondsToDuration(sec float64) time.Duration {
	return time.Duration(sec * float64(time.Second))
}

// durationSeconds converts d to whole seconds for the API, rounding up so
// that a positive duration never becomes 0.
func durationSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}

// CreateOptions are the parameters of a new sandbox. Zero values mean the
// server's defaults.
type CreateOptions struct {
	// Template is the root filesystem template (default "base").
	Template string
	// Runtime is "runc" (default) or "gvisor".
	Runtime string
	// Tier is light (default), medium or heavy.
	Tier string
	// Resources override the tier's limits field by field.
	Resources Resources
	// Timeout is the sandbox's lifetime (TTL), rounded up to seconds
	// (default 300 s).
	Timeout time.Duration
	// CommandTimeout is the default per-command timeout for Client.Exec,
	// rounded up to seconds (default from the tier).
	CommandTimeout time.Duration
	// Env is set for every process in the sandbox.
	Env map[string]string
	// Metadata is free-form labels, usable as List filters.
	Metadata map[string]string
	// Network is the egress mode: "none" (default: no network at all),
	// "allow" (only Allow) or "all-public" (every public address).
	Network string
	// Allow lists domain patterns ("api.github.com", "*.pypi.org") and
	// CIDR:port rules ("203.0.113.0/24:5432") for mode "allow".
	Allow []string
	// Secrets names registered secrets (Client.PutSecret) the sandbox may
	// use: it sees only the placeholder CORRAL_SECRET_<name>, which the
	// egress proxy replaces in the secret's header for its hosts.
	Secrets []string
	// Task puts the sandbox in a task (its calls count against the task's
	// budgets); without one the sandbox gets its own task.
	Task string
	// Agent names the agent, for per-agent admission limits.
	Agent string
	// Snapshot starts the sandbox from a snapshot instead of the bare
	// template.
	Snapshot string
	// AutoPause pauses the sandbox at the end of its TTL instead of
	// killing it; with PauseMemory its processes are frozen, else its
	// files are saved and its processes stopped.
	AutoPause, PauseMemory bool
	// Volumes are mounted read-write (Client.CreateVolume).
	Volumes []VolumeMount
	// PublicTraffic false makes the sandbox's ports private (a request
	// to one must carry Sandbox.TrafficToken); nil takes the server's
	// default (--ports-default, public unless set).
	PublicTraffic *bool
}

type createWire struct {
	Template       string            `json:"template,omitempty"`
	Runtime        string            `json:"runtime,omitempty"`
	Tier           string            `json:"tier,omitempty"`
	Resources      *Resources        `json:"resources,omitempty"`
	Timeout        int64             `json:"timeout,omitempty"`
	CommandTimeout int64             `json:"command_timeout,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	Network        string            `json:"network,omitempty"`
	Allow          []string          `json:"allow,omitempty"`
	Secrets        []string          `json:"secrets,omitempty"`
	Task           string            `json:"task,omitempty"`
	Agent          string            `json:"agent,omitempty"`
	Snapshot       string            `json:"snapshot,omitempty"`
	AutoPause      bool              `json:"auto_pause,omitempty"`
	PauseMemory    bool              `json:"pause_memory,omitempty"`
	Volumes        []volumeMountWire `json:"volumes,omitempty"`
	PublicTraffic  *bool             `json:"public_traffic,omitempty"`
}

// Create creates and starts a sandbox (POST /v1/sandboxes).
func (c *Client) Create(ctx context.Context, opts CreateOptions) (*Sandbox, error) {
	w := createWire{
		Template: opts.Template, Runtime: opts.Runtime, Tier: opts.Tier,
		Timeout: durationSeconds(opts.Timeout), CommandTimeout: durationSeconds(opts.CommandTimeout),
		Env: opts.Env, Metadata: opts.Metadata, Network: opts.Network,
		Allow: opts.Allow, Secrets: opts.Secrets, Task: opts.Task, Agent: opts.Agent, Snapshot: opts.Snapshot, AutoPause: opts.AutoPause, PauseMemory: opts.PauseMemory,
		PublicTraffic: opts.PublicTraffic,
	}
	if !opts.Resources.isZero() {
		r := opts.Resources
		w.Resources = &r
	}
	for _, v := range opts.Volumes {
		w.Volumes = append(w.Volumes, volumeMountWire{Volume: v.Volume, Path: v.Path})
	}
	sb := &Sandbox{client: c}
	if err := c.do(ctx, "POST", "/v1/sandboxes", nil, w, sb); err != nil {
		return nil, err
	}
	return sb, nil
}

// Get returns a sandbox, running or ended (GET /v1/sandboxes/{id}).
func (c *Client) Get(ctx context.Context, id string) (*Sandbox, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	sb := &Sandbox{client: c}
	if err := c.do(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id), nil, nil, sb); err != nil {
		return nil, err
	}
	return sb, nil
}

// Sandbox returns a handle for the sandbox id without contacting the
// server; only ID is set (call Refresh to fill in the rest). Useful to run
// commands or use files in a sandbox created elsewhere.
func (c *Client) Sandbox(id string) *Sandbox {
	return &Sandbox{ID: id, client: c}
}

// ListOptions filter List.
type ListOptions struct {
	// State is "running" (default), "ended" or "all".
	State string
	// Metadata keeps sandboxes whose metadata has all these pairs.
	Metadata map[string]string
	// Team lists another team's sandboxes, or every team's with "all"
	// (admin keys only). Empty: the key's own team.
	Team string
}

// List returns sandboxes, newest first (GET /v1/sandboxes).
func (c *Client) List(ctx context.Context, opts ListOptions) ([]*Sandbox, error) {
	q := url.Values{}
	if opts.State != "" {
		q.Set("state", opts.State)
	}
	for k, v := range opts.Metadata {
		q.Add("metadata."+k, v)
	}
	if opts.Team != "" {
		q.Set("team", opts.Team)
	}
	var out struct {
		Sandboxes []*Sandbox `json:"sandboxes"`
	}
	if err := c.do(ctx, "GET", "/v1/sandboxes", q, nil, &out); err != nil {
		return nil, err
	}
	for _, s := range out.Sandboxes {
		s.client = c
	}
	if out.Sandboxes == nil {
		out.Sandboxes = []*Sandbox{}
	}
	return out.Sandboxes, nil
}

// Kill ends a sandbox: SIGTERM to every process, a 3 s grace period, then
// SIGKILL and teardown (DELETE /v1/sandboxes/{id}). It returns the ended
// sandbox. Killing an unknown or already ended sandbox is a not_found error.
func (c *Client) Kill(ctx context.Context, id string) (*Sandbox, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	sb := &Sandbox{client: c}
	if err := c.do(ctx, "DELETE", "/v1/sandboxes/"+url.PathEscape(id), nil, nil, sb); err != nil {
		return nil, err
	}
	return sb, nil
}

// SetTimeout sets a sandbox's remaining lifetime to d from now, rounded up
// to seconds (POST /v1/sandboxes/{id}/timeout).
func (c *Client) SetTimeout(ctx context.Context, id string, d time.Duration) (*Sandbox, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	body := struct {
		Timeout int64 `json:"timeout"`
	}{durationSeconds(d)}
	sb := &Sandbox{client: c}
	if err := c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/timeout", nil, body, sb); err != nil {
		return nil, err
	}
	return sb, nil
}

// NoTimeout, as ExecRequest.Timeout, runs a command without a time limit.
const NoTimeout time.Duration = -1

// ExecRequest is a command for [Client.Exec]. Set exactly one of Cmd (an
// argv, run without a shell) and Command (run with /bin/bash -lc).
type ExecRequest struct {
	Cmd     []string
	Command string
	Cwd     string
	Env     map[string]string
	// User is "user" (default, uid 1000) or "root".
	User string
	// Stdin is fed to the command (max 1 MiB).
	Stdin []byte
	// Timeout limits the command, rounded up to seconds: 0 means the
	// sandbox's CommandTimeout, NoTimeout means no limit.
	Timeout time.Duration
}

type execWire struct {
	Cmd     []string          `json:"cmd,omitempty"`
	Command string            `json:"command,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	User    string            `json:"user,omitempty"`
	Stdin   []byte            `json:"stdin,omitempty"`
	Timeout *int64            `json:"timeout,omitempty"`
}

// ExecResult is the outcome of [Client.Exec].
type ExecResult struct {
	// ExitCode is the command's exit code: 124 when it timed out, 128+n
	// when killed by signal n (137 for SIGKILL).
	ExitCode int `json:"exit_code"`
	// Stdout and Stderr keep the last bytes of each stream (the server's
	// max_output, default 1 MiB).
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// StdoutBytes and StderrBytes count everything the command wrote.
	StdoutBytes int64 `json:"stdout_bytes"`
	StderrBytes int64 `json:"stderr_bytes"`
	// Truncated says output was dropped from Stdout or Stderr.
	Truncated bool `json:"truncated"`
	// TimedOut says the command's timeout elapsed.
	TimedOut bool `json:"timed_out"`
	// EndReason is "timeout", "oom" or "killed" when the command did not
	// exit on its own, else "".
	EndReason string `json:"end_reason"`
	// DurationMS is how long the command ran, in milliseconds.
	DurationMS int64 `json:"duration_ms"`
	// Warnings are the task's warnings about this call (for example a
	// suspected loop), or nil.
	Warnings []string `json:"warnings,omitempty"`
}

// Duration returns how long the command ran.
func (r *ExecResult) Duration() time.Duration { return time.Duration(r.DurationMS) * time.Millisecond }

// Exec runs a command to completion in a running sandbox and returns its
// output (POST /v1/sandboxes/{id}/exec). A non-zero exit code is not an
// error. For streaming output use [Sandbox.Run].
func (c *Client) Exec(ctx context.Context, id string, req ExecRequest) (*ExecResult, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if (len(req.Cmd) == 0) == (req.Command == "") {
		return nil, errors.New("corral: Exec needs exactly one of Cmd and Command")
	}
	w := execWire{Cmd: req.Cmd, Command: req.Command, Cwd: req.Cwd, Env: req.Env, User: req.User, Stdin: req.Stdin}
	switch {
	case req.Timeout > 0:
		t := durationSeconds(req.Timeout)
		w.Timeout = &t
	case req.Timeout < 0:
		t := int64(0)
		w.Timeout = &t
	}
	var res ExecResult
	if err := c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/exec", nil, w, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

func checkID(id string) error {
	if id == "" {
		return &APIError{Code: CodeInvalidArgument, Message: "empty sandbox id"}
	}
	return nil
}

// Kill kills the sandbox (see [Client.Kill]) and updates s to the ended
// sandbox.
func (s *Sandbox) Kill(ctx context.Context) error {
	sb, err := s.client.Kill(ctx, s.ID)
	if err != nil {
		return err
	}
	s.update(sb)
	return nil
}

// SetTimeout sets the sandbox's remaining lifetime to d from now (see
// [Client.SetTimeout]) and updates s.
func (s *Sandbox) SetTimeout(ctx context.Context, d time.Duration) error {
	sb, err := s.client.SetTimeout(ctx, s.ID, d)
	if err != nil {
		return err
	}
	s.update(sb)
	return nil
}

// Refresh fetches the sandbox again and updates s.
func (s *Sandbox) Refresh(ctx context.Context) error {
	sb, err := s.client.Get(ctx, s.ID)
	if err != nil {
		return err
	}
	s.update(sb)
	return nil
}

// Exec runs a command to completion through the REST API (see
// [Client.Exec]).
func (s *Sandbox) Exec(ctx context.Context, req ExecRequest) (*ExecResult, error) {
	return s.client.Exec(ctx, s.ID, req)
}

func (s *Sandbox) update(from *Sandbox) {
	c := s.client
	*s = *from
	s.client = c
}

// Pause freezes every process of a running sandbox (memory kept, no CPU
// used, lifetime clock stopped) (POST /v1/sandboxes/{id}/pause). Pausing a
// paused sandbox is a conflict error.
func (c *Client) Pause(ctx context.Context, id string) (*Sandbox, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	sb := &Sandbox{client: c}
	if err := c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/pause", nil, nil, sb); err != nil {
		return nil, err
	}
	return sb, nil
}

// PausePersist pauses a sandbox by saving its files and stopping its
// processes (memory is freed); Resume starts it again from the saved
// files with the same id (POST /v1/sandboxes/{id}/pause {"persist": true}).
func (c *Client) PausePersist(ctx context.Context, id string) (*Sandbox, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	sb := &Sandbox{client: c}
	body := map[string]bool{"persist": true}
	if err := c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/pause", nil, body, sb); err != nil {
		return nil, err
	}
	return sb, nil
}

// Resume thaws a paused sandbox; its lifetime restarts at ttl, or at what
// was left when it was paused if ttl is 0 (POST /v1/sandboxes/{id}/resume).
func (c *Client) Resume(ctx context.Context, id string, ttl time.Duration) (*Sandbox, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	sb := &Sandbox{client: c}
	body := map[string]int64{"timeout": durationSeconds(ttl)}
	if err := c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/resume", nil, body, sb); err != nil {
		return nil, err
	}
	return sb, nil
}

func orEmptyList[T any](l []T) []T {
	if l == nil {
		return []T{}
	}
	return l
}
