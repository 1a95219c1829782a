// Package tools defines corral's agent tools once — their names,
// descriptions, JSON Schemas of arguments and limits — and dispatches a
// call of one by name onto an Env (the API's sandboxes of the caller's
// task). Both surfaces use it: the function-calling definitions of
// GET /v1/tools with POST /v1/tools/call, and the MCP server (/mcp and
// `corral mcp`). It defends the model's caller against unbounded results
// (every output is bounded and says when it was cut) and against
// malformed arguments (unknown fields, wrong types and out-of-range
// values are refused with invalid_argument before anything runs).
package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Surface is where a tool is offered.
type Surface int

// Surfaces.
const (
	// FunctionCalling is GET /v1/tools and POST /v1/tools/call: the
	// caller (a framework) picks the sandbox, the model never names one.
	FunctionCalling Surface = 1 << iota
	// MCP is the MCP server: sandbox-bound tools take an optional
	// sandbox_id, and the session manages sandboxes.
	MCP
)

// Limits of tool calls (docs/mcp.md, docs/api.md "Tools").
const (
	// DefaultMaxOutput is how many bytes of the tail of stdout and of
	// stderr a result keeps by default.
	DefaultMaxOutput = 8 << 10
	// MaxMaxOutput is the largest max_output a caller may ask for.
	MaxMaxOutput = 1 << 20
	// MaxCode bounds the code of one execute_code / run_code call and the
	// command of one run_command call (one argument of a process: Linux
	// caps one at 128 KiB).
	MaxCode = 100 << 10
	// DefaultTimeout is a code run's or command's timeout when the call
	// names none.
	DefaultTimeout = 60 * time.Second
	// MaxTimeout is the longest timeout a call may ask for.
	MaxTimeout = 10 * time.Minute
	// MaxReadBytes bounds the content read_file returns (the head of the
	// file; truncated says when there is more).
	MaxReadBytes = 256 << 10
	// MaxWriteBytes bounds the content of one write_file call (so that
	// a call fits POST /v1/tools/call's 1 MiB body).
	MaxWriteBytes = 512 << 10
	// MaxListEntries bounds the entries list_files returns.
	MaxListEntries = 1000
	// MaxPath bounds a path argument.
	MaxPath = 4096
	// MaxArgs bounds the JSON of one call's arguments.
	MaxArgs = 2 << 20
)

// Error is a refused or failed call, with a stable code (the API's error
// codes: invalid_argument, not_found, budget_exhausted, loop_detected,
// task_ended, capacity_exceeded, ...) and a message the model can act on.
type Error struct {
	Code string
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// Stable codes this package answers itself.
const (
	CodeInvalidArgument = "invalid_argument"
	CodeNotFound        = "not_found"
	CodeInternal        = "internal"
)

func invalid(format string, args ...any) error {
	return &Error{Code: CodeInvalidArgument, Msg: fmt.Sprintf(format, args...)}
}

// ExecRequest is one process to run in a sandbox.
type ExecRequest struct {
	// Argv is the program and its arguments.
	Argv []string
	// Cwd is the working directory ("" the user's home).
	Cwd string
	// Timeout ends the process when it elapses (> 0).
	Timeout time.Duration
	// MaxOutput is how many bytes of the tail of stdout and of stderr
	// to keep.
	MaxOutput int
}

// ExecResult is how a process ended and the tails of its output.
type ExecResult struct {
	SandboxID   string   `json:"sandbox_id,omitempty"`
	ExitCode    int      `json:"exit_code"`
	Stdout      string   `json:"stdout"`
	Stderr      string   `json:"stderr"`
	StdoutBytes int64    `json:"stdout_bytes"`
	StderrBytes int64    `json:"stderr_bytes"`
	Truncated   bool     `json:"truncated"`
	TimedOut    bool     `json:"timed_out"`
	EndReason   string   `json:"end_reason,omitempty"`
	DurationMS  int64    `json:"duration_ms"`
	Warnings    []string `json:"warnings,omitempty"`
}

// ReadResult is the head of a file.
type ReadResult struct {
	SandboxID string `json:"sandbox_id,omitempty"`
	Path      string `json:"path"`
	// Content is the file's text, or its bytes in base64 when they are
	// not UTF-8 (Encoding says which).
	Content   string   `json:"content"`
	Encoding  string   `json:"encoding"` // "utf-8" or "base64"
	Bytes     int64    `json:"bytes"`    // bytes returned
	Truncated bool     `json:"truncated"`
	Warnings  []string `json:"warnings,omitempty"`
}

// WriteResult is a written file.
type WriteResult struct {
	SandboxID string   `json:"sandbox_id,omitempty"`
	Path      string   `json:"path"`
	Bytes     int64    `json:"bytes"`
	Warnings  []string `json:"warnings,omitempty"`
}

// Entry is one entry of a directory.
type Entry struct {
	Name string `json:"name"`
	Path string `json:"path"`
	Type string `json:"type"` // "file", "dir", "symlink" or "other"
	Size int64  `json:"size"`
}

// ListResult is a directory's entries.
type ListResult struct {
	SandboxID string   `json:"sandbox_id,omitempty"`
	Path      string   `json:"path"`
	Entries   []Entry  `json:"entries"`
	Truncated bool     `json:"truncated"`
	Warnings  []string `json:"warnings,omitempty"`
}

// SandboxRequest creates a sandbox (MCP's create_sandbox).
type SandboxRequest struct {
	Template string
	Snapshot string
	// Timeout is the sandbox's TTL (0: the session's default).
	Timeout time.Duration
}

// SandboxResult is a created sandbox.
type SandboxResult struct {
	SandboxID string    `json:"sandbox_id"`
	Template  string    `json:"template"`
	ExpiresAt time.Time `json:"expires_at"`
}

// KillResult is a killed sandbox.
type KillResult struct {
	SandboxID string `json:"sandbox_id"`
	Killed    bool   `json:"killed"`
}

// SnapshotResult is a snapshot taken of a sandbox.
type SnapshotResult struct {
	SandboxID  string `json:"sandbox_id"`
	SnapshotID string `json:"snapshot_id"`
	Name       string `json:"name,omitempty"`
}

// Env is what tool calls act on: the sandboxes of one caller's task. Its
// operations are the API's own (each one a tool call of the task where
// the API counts one: budgets and loop detection), and its errors are
// *Error with the API's codes where they are the caller's to hear.
type Env interface {
	// Sandbox returns the sandbox a call runs in: named (a sandbox_id
	// the model gave; only on the MCP surface), or "" for the default,
	// as use allows. kept reports whether the sandbox outlives the call;
	// release is called when the call is done (it kills a sandbox made
	// for the call alone).
	Sandbox(ctx context.Context, named string, use Use) (id string, kept bool, release func(), err error)
	Exec(ctx context.Context, sandbox string, req ExecRequest) (*ExecResult, error)
	ReadFile(ctx context.Context, sandbox, path string, max int64) (*ReadResult, error)
	WriteFile(ctx context.Context, sandbox, path string, data []byte) (*WriteResult, error)
	ListFiles(ctx context.Context, sandbox, path string, max int) (*ListResult, error)
	CreateSandbox(ctx context.Context, req SandboxRequest) (*SandboxResult, error)
	KillSandbox(ctx context.Context, sandbox string) (*KillResult, error)
	Snapshot(ctx context.Context, sandbox, name string) (*SnapshotResult, error)
}

// Use is what a tool accepts as its sandbox when the call names none.
type Use int

// Uses.
const (
	// UseDefault: the caller's sandbox (the session's, created on first
	// use; or the one the function call's request names).
	UseDefault Use = iota
	// UseFresh: as UseDefault, or when there is none to use, a sandbox
	// made for this call alone (function calling without a sandbox).
	UseFresh
	// UseExisting: the caller's sandbox if there is one; none is made.
	UseExisting
)

// Param is one argument of a tool.
type Param struct {
	Name        string
	Type        string // "string" or "integer"
	Description string
	Required    bool
	Enum        []string
	Min, Max    int64 // for integers (both 0: unbounded)
	MaxLength   int   // for strings (0: unbounded)
}

// Tool is one tool, defined once for every surface.
type Tool struct {
	// Name is the tool's name in function calling, and in MCP unless
	// MCPName is set.
	Name    string
	MCPName string
	// Description tells the model what the tool does.
	Description string
	Params      []Param
	// Surfaces is where the tool is offered.
	Surfaces Surface
	// InSandbox: the tool runs in a sandbox (MCP adds sandbox_id).
	InSandbox bool
	// Use is which sandbox a call that names none runs in.
	Use Use
	// ReadOnly: the tool changes nothing; Destructive: it may destroy
	// state (MCP's tool annotations, which clients use to ask the user).
	ReadOnly, Destructive bool
	run                   func(ctx context.Context, c *call) (any, error)
}

// NameIn is the tool's name on a surface.
func (t *Tool) NameIn(s Surface) string {
	if s == MCP && t.MCPName != "" {
		return t.MCPName
	}
	return t.Name
}

// sandboxIDParam is the argument MCP adds to sandbox-bound tools.
var sandboxIDParam = Param{Name: "sandbox_id", Type: "string", MaxLength: 64,
	Description: "The sandbox to use (an id create_sandbox returned). Omit it to use this session's sandbox, which is created on first use."}

// ParamsIn returns the tool's arguments on a surface.
func (t *Tool) ParamsIn(s Surface) []Param {
	if s == MCP && t.InSandbox {
		return append(slices.Clone(t.Params), sandboxIDParam)
	}
	return t.Params
}

// Schema returns the JSON Schema (draft 2020-12, an object) of the
// tool's arguments on a surface.
func (t *Tool) Schema(s Surface) map[string]any {
	props := map[string]any{}
	required := []string{}
	for _, p := range t.ParamsIn(s) {
		ps := map[string]any{"type": p.Type, "description": p.Description}
		if len(p.Enum) > 0 {
			ps["enum"] = p.Enum
		}
		if p.Min != 0 || p.Max != 0 {
			ps["minimum"], ps["maximum"] = p.Min, p.Max
		}
		if p.MaxLength > 0 {
			ps["maxLength"] = p.MaxLength
		}
		props[p.Name] = ps
		if p.Required {
			required = append(required, p.Name)
		}
	}
	return map[string]any{"type": "object", "properties": props, "required": required, "additionalProperties": false}
}

var timeoutParam = Param{Name: "timeout", Type: "integer", Min: 1, Max: int64(MaxTimeout / time.Second),
	Description: fmt.Sprintf("Seconds before the run is killed (default %d).", int(DefaultTimeout/time.Second))}

// All is every tool, in the order they are listed.
var All = []*Tool{
	{
		Name: "execute_code", MCPName: "run_code", Surfaces: FunctionCalling | MCP, InSandbox: true, Use: UseFresh, Destructive: true,
		Description: "Run code in an isolated Linux sandbox (Debian, no network) and return its exit code, the tail of its stdout and stderr, whether output was truncated, and the duration. Python by default; print what you want to see.",
		Params: []Param{
			{Name: "code", Type: "string", Required: true, MaxLength: MaxCode, Description: "The program to run."},
			{Name: "language", Type: "string", Enum: []string{"python", "bash"}, Description: "python (default: python3) or bash."},
			timeoutParam,
		},
		run: runCode,
	},
	{
		Name: "run_command", Surfaces: FunctionCalling | MCP, InSandbox: true, Use: UseFresh, Destructive: true,
		Description: "Run a shell command (bash) in an isolated Linux sandbox and return its exit code, the tail of its stdout and stderr, whether output was truncated, and the duration.",
		Params: []Param{
			{Name: "command", Type: "string", Required: true, MaxLength: MaxCode, Description: "The shell command line."},
			{Name: "cwd", Type: "string", MaxLength: MaxPath, Description: "Working directory (default: the home directory, /home/user)."},
			timeoutParam,
		},
		run: runCommand,
	},
	{
		Name: "read_file", Surfaces: FunctionCalling | MCP, InSandbox: true, ReadOnly: true,
		Description: fmt.Sprintf("Read a file in the sandbox. Returns its text (or base64 when it is not UTF-8), at most %d KiB from its start; truncated says when there is more.", MaxReadBytes>>10),
		Params: []Param{
			{Name: "path", Type: "string", Required: true, MaxLength: MaxPath, Description: "The file's path (relative paths are in /home/user)."},
		},
		run: readFile,
	},
	{
		Name: "write_file", Surfaces: FunctionCalling | MCP, InSandbox: true, Destructive: true,
		Description: "Write a text file in the sandbox, creating its directories and replacing the file if it exists.",
		Params: []Param{
			{Name: "path", Type: "string", Required: true, MaxLength: MaxPath, Description: "The file's path (relative paths are in /home/user)."},
			{Name: "content", Type: "string", Required: true, MaxLength: MaxWriteBytes, Description: "The file's new content."},
		},
		run: writeFile,
	},
	{
		Name: "list_files", Surfaces: FunctionCalling | MCP, InSandbox: true, ReadOnly: true,
		Description: fmt.Sprintf("List a directory in the sandbox: each entry's name, path, type (file, dir, symlink) and size; at most %d entries.", MaxListEntries),
		Params: []Param{
			{Name: "path", Type: "string", MaxLength: MaxPath, Description: "The directory (default: /home/user)."},
		},
		run: listFiles,
	},
	{
		Name: "create_sandbox", Surfaces: MCP,
		Description: "Create a new sandbox and make it this session's sandbox (calls without sandbox_id use it). Returns its sandbox_id. The session's sandboxes are killed when the session ends.",
		Params: []Param{
			{Name: "template", Type: "string", MaxLength: 128, Description: "Template to start from (default: base, Debian with python3)."},
			{Name: "snapshot", Type: "string", MaxLength: 64, Description: "Start from this snapshot (an id snapshot_sandbox returned) instead of a template."},
			{Name: "timeout", Type: "integer", Min: 1, Max: 86400, Description: "Seconds the sandbox lives (default: the session's sandbox lifetime, renewed by each call)."},
		},
		run: createSandbox,
	},
	{
		Name: "kill_sandbox", Surfaces: MCP, InSandbox: true, Use: UseExisting, Destructive: true,
		Description: "Kill a sandbox of this session (default: the session's sandbox; the next call creates a new one).",
		run:         killSandbox,
	},
	{
		Name: "snapshot_sandbox", Surfaces: MCP, InSandbox: true,
		Description: "Save a sandbox's files as a snapshot; create_sandbox with snapshot starts a new sandbox from it.",
		Params: []Param{
			{Name: "name", Type: "string", MaxLength: 128, Description: "A name for the snapshot."},
		},
		run: snapshotSandbox,
	},
}

// On returns the tools offered on a surface.
func On(s Surface) []*Tool {
	var out []*Tool
	for _, t := range All {
		if t.Surfaces&s != 0 {
			out = append(out, t)
		}
	}
	return out
}

// Lookup returns the tool named name on a surface.
func Lookup(s Surface, name string) (*Tool, bool) {
	for _, t := range On(s) {
		if t.NameIn(s) == name {
			return t, true
		}
	}
	return nil, false
}

// Formats of function-calling definitions.
const (
	FormatOpenAI    = "openai"
	FormatAnthropic = "anthropic"
)

// Definitions returns the function-calling definitions of the
// FunctionCalling tools in format: OpenAI's ({"type": "function",
// "function": {"name", "description", "parameters"}}) or Anthropic's
// ({"name", "description", "input_schema"}).
func Definitions(format string) ([]map[string]any, error) {
	var out []map[string]any
	for _, t := range On(FunctionCalling) {
		switch format {
		case FormatOpenAI:
			out = append(out, map[string]any{"type": "function", "function": map[string]any{
				"name": t.Name, "description": t.Description, "parameters": t.Schema(FunctionCalling)}})
		case FormatAnthropic:
			out = append(out, map[string]any{"name": t.Name, "description": t.Description, "input_schema": t.Schema(FunctionCalling)})
		default:
			return nil, invalid("format must be %q or %q", FormatOpenAI, FormatAnthropic)
		}
	}
	return out, nil
}

// Options bound one call.
type Options struct {
	// MaxOutput is how many bytes of the tail of stdout and of stderr a
	// result keeps (0: DefaultMaxOutput).
	MaxOutput int
}

// Result is the outcome of one call, for the model and for programs.
type Result struct {
	Name string `json:"name"`
	// IsError: the call was refused or failed; Content says why.
	IsError bool `json:"is_error"`
	// Code is the error's stable code (budget_exhausted, loop_detected,
	// invalid_argument, not_found, ...); "" on success.
	Code string `json:"code,omitempty"`
	// Content is the text to give the model: the result as JSON, or the
	// error's message (a tripped breaker's tells the model to stop).
	Content string `json:"content"`
	// Result is the structured result (nil on error).
	Result any `json:"result,omitempty"`
}

// call is one call being dispatched.
type call struct {
	env     Env
	args    map[string]json.RawMessage
	sandbox string
	kept    bool
	opts    Options
}

// Call runs tool name of surface s with args (a JSON object) in env. Every
// outcome is a Result: a refusal or failure has IsError, its code and a
// readable message, so that a model hears why and what to do.
func Call(ctx context.Context, env Env, s Surface, name string, args json.RawMessage, opts Options) Result {
	res, err := dispatch(ctx, env, s, name, args, opts)
	if err != nil {
		var te *Error
		if !errors.As(err, &te) {
			te = &Error{Code: CodeInternal, Msg: "internal error; see the server log"}
		}
		msg := te.Msg
		if !strings.HasPrefix(msg, te.Code+":") {
			msg = te.Code + ": " + msg
		}
		return Result{Name: name, IsError: true, Code: te.Code, Content: msg}
	}
	b, _ := json.MarshalIndent(res, "", " ")
	return Result{Name: name, Content: string(b), Result: res}
}

func dispatch(ctx context.Context, env Env, s Surface, name string, args json.RawMessage, opts Options) (any, error) {
	t, ok := Lookup(s, name)
	if !ok {
		var names []string
		for _, t := range On(s) {
			names = append(names, t.NameIn(s))
		}
		return nil, &Error{Code: CodeNotFound, Msg: fmt.Sprintf("no tool %q; the tools are %s", name, strings.Join(names, ", "))}
	}
	if opts.MaxOutput == 0 {
		opts.MaxOutput = DefaultMaxOutput
	}
	if opts.MaxOutput < 1 || opts.MaxOutput > MaxMaxOutput {
		return nil, invalid("max_output must be between 1 and %d", MaxMaxOutput)
	}
	c := &call{env: env, opts: opts}
	var err error
	if c.args, err = checkArgs(t.ParamsIn(s), args); err != nil {
		return nil, err
	}
	if t.InSandbox {
		var named string
		_ = c.str("sandbox_id", &named)
		id, kept, release, err := env.Sandbox(ctx, named, t.Use)
		if err != nil {
			return nil, err
		}
		defer release()
		c.sandbox, c.kept = id, kept
	}
	return t.run(ctx, c)
}

// checkArgs parses args against params: an object, no unknown names,
// every required one present, strings and integers of the right type and
// within their bounds.
func checkArgs(params []Param, args json.RawMessage) (map[string]json.RawMessage, error) {
	if len(args) > MaxArgs {
		return nil, invalid("arguments exceed %d bytes", MaxArgs)
	}
	m := map[string]json.RawMessage{}
	if t := bytes.TrimSpace(args); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		dec := json.NewDecoder(bytes.NewReader(t))
		if err := dec.Decode(&m); err != nil {
			return nil, invalid("arguments must be a JSON object: %v", strings.TrimPrefix(err.Error(), "json: "))
		}
		if _, err := dec.Token(); err != io.EOF {
			return nil, invalid("arguments must be one JSON object")
		}
	}
	for k := range m {
		if !slices.ContainsFunc(params, func(p Param) bool { return p.Name == k }) {
			return nil, invalid("unknown argument %q", k)
		}
	}
	for _, p := range params {
		raw, ok := m[p.Name]
		if !ok || bytes.Equal(raw, []byte("null")) {
			if p.Required {
				return nil, invalid("argument %q is required", p.Name)
			}
			delete(m, p.Name)
			continue
		}
		switch p.Type {
		case "string":
			var v string
			if json.Unmarshal(raw, &v) != nil {
				return nil, invalid("argument %q must be a string", p.Name)
			}
			if p.MaxLength > 0 && len(v) > p.MaxLength {
				return nil, invalid("argument %q must be at most %d bytes", p.Name, p.MaxLength)
			}
			if len(p.Enum) > 0 && !slices.Contains(p.Enum, v) {
				return nil, invalid("argument %q must be one of %s", p.Name, strings.Join(p.Enum, ", "))
			}
			if p.Required && v == "" {
				return nil, invalid("argument %q must not be empty", p.Name)
			}
		case "integer":
			var v int64
			if json.Unmarshal(raw, &v) != nil {
				// 30.0 is an integer in JSON Schema.
				var f float64
				if json.Unmarshal(raw, &f) != nil || f != float64(int64(f)) {
					return nil, invalid("argument %q must be an integer", p.Name)
				}
				v = int64(f)
				m[p.Name] = json.RawMessage(fmt.Sprint(v))
			}
			if (p.Min != 0 || p.Max != 0) && (v < p.Min || v > p.Max) {
				return nil, invalid("argument %q must be between %d and %d", p.Name, p.Min, p.Max)
			}
		}
	}
	return m, nil
}

// str sets *v to string argument name when given, reporting whether it was.
func (c *call) str(name string, v *string) bool {
	raw, ok := c.args[name]
	return ok && json.Unmarshal(raw, v) == nil
}

// seconds returns integer argument name as a duration, or def.
func (c *call) seconds(name string, def time.Duration) time.Duration {
	var n int64
	if raw, ok := c.args[name]; ok && json.Unmarshal(raw, &n) == nil {
		return time.Duration(n) * time.Second
	}
	return def
}

// shown is the sandbox id a result names: the sandbox when it outlives
// the call, "" for one made for the call alone.
func (c *call) shown() string {
	if c.kept {
		return c.sandbox
	}
	return ""
}

func runCode(ctx context.Context, c *call) (any, error) {
	var code, lang string
	c.str("code", &code)
	c.str("language", &lang)
	argv := []string{"python3", "-c", code}
	if lang == "bash" {
		argv = []string{"/bin/bash", "-c", code}
	}
	return c.exec(ctx, ExecRequest{Argv: argv, Timeout: c.seconds("timeout", DefaultTimeout)})
}

func runCommand(ctx context.Context, c *call) (any, error) {
	var cmd, cwd string
	c.str("command", &cmd)
	c.str("cwd", &cwd)
	return c.exec(ctx, ExecRequest{Argv: []string{"/bin/bash", "-l", "-c", cmd}, Cwd: cwd, Timeout: c.seconds("timeout", DefaultTimeout)})
}

func (c *call) exec(ctx context.Context, req ExecRequest) (any, error) {
	req.MaxOutput = c.opts.MaxOutput
	r, err := c.env.Exec(ctx, c.sandbox, req)
	if err != nil {
		return nil, err
	}
	r.SandboxID = c.shown()
	return r, nil
}

func readFile(ctx context.Context, c *call) (any, error) {
	var path string
	c.str("path", &path)
	r, err := c.env.ReadFile(ctx, c.sandbox, path, MaxReadBytes)
	if err != nil {
		return nil, err
	}
	r.SandboxID = c.shown()
	return r, nil
}

func writeFile(ctx context.Context, c *call) (any, error) {
	var path, content string
	c.str("path", &path)
	c.str("content", &content)
	r, err := c.env.WriteFile(ctx, c.sandbox, path, []byte(content))
	if err != nil {
		return nil, err
	}
	r.SandboxID = c.shown()
	return r, nil
}

func listFiles(ctx context.Context, c *call) (any, error) {
	path := "/home/user"
	c.str("path", &path)
	r, err := c.env.ListFiles(ctx, c.sandbox, path, MaxListEntries)
	if err != nil {
		return nil, err
	}
	r.SandboxID = c.shown()
	return r, nil
}

func createSandbox(ctx context.Context, c *call) (any, error) {
	var req SandboxRequest
	c.str("template", &req.Template)
	c.str("snapshot", &req.Snapshot)
	if req.Template != "" && req.Snapshot != "" {
		return nil, invalid("give template or snapshot, not both")
	}
	req.Timeout = c.seconds("timeout", 0)
	return c.env.CreateSandbox(ctx, req)
}

func killSandbox(ctx context.Context, c *call) (any, error) {
	return c.env.KillSandbox(ctx, c.sandbox)
}

func snapshotSandbox(ctx context.Context, c *call) (any, error) {
	var name string
	c.str("name", &name)
	return c.env.Snapshot(ctx, c.sandbox, name)
}
