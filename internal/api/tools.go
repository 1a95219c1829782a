package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/corralhq/corral/internal/agentclient"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/tools"
	"github.com/corralhq/corral/proto/filesystem"
	"github.com/corralhq/corral/proto/process"
)

// toolRoutes registers the function-calling routes (docs/api.md, "Tools").
func (s *Server) toolRoutes() {
	s.mux.Handle("GET /v1/tools", s.auth(s.listTools))
	s.mux.Handle("POST /v1/tools/call", s.auth(s.streamed(s.callTool)))
}

// listTools answers GET /v1/tools?format=openai|anthropic: the
// function-calling definitions of the tools (internal/tools).
func (s *Server) listTools(w http.ResponseWriter, r *http.Request) {
	p := paramsOf(r)
	format := p.oneOf("format", tools.FormatOpenAI, tools.FormatOpenAI, tools.FormatAnthropic)
	if err := p.err(); err != nil {
		s.writeErr(w, r, err)
		return
	}
	defs, err := tools.Definitions(format)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidArgument, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"format": format, "tools": defs})
}

// toolCallRequest is POST /v1/tools/call.
type toolCallRequest struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
	Task      string          `json:"task"`
	Sandbox   string          `json:"sandbox"`
	MaxOutput int             `json:"max_output"`
}

// callTool answers POST /v1/tools/call: one tool call of a task, by name.
// The envelope (task, sandbox) is the caller's and refused with an HTTP
// error; everything about the call itself (its arguments, a refusal by
// the task's brakes, a failure in the sandbox) is a 200 tools.Result with
// is_error, so that the caller hands its content to the model as it is.
func (s *Server) callTool(w http.ResponseWriter, r *http.Request) {
	var req toolCallRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	if req.Name == "" || req.Task == "" {
		writeError(w, http.StatusBadRequest, CodeInvalidArgument, `"name" and "task" are required`)
		return
	}
	if s.gov == nil {
		writeError(w, http.StatusServiceUnavailable, CodeUnavailable, "this server keeps no tasks")
		return
	}
	if err := s.visible(r, taskObject, req.Task); err != nil {
		if errors.Is(err, errOutOfScope) {
			writeError(w, http.StatusNotFound, CodeNotFound, "task not found")
		} else {
			s.writeErr(w, r, err)
		}
		return
	}
	if req.Sandbox != "" {
		if err := s.visible(r, sandboxObject, req.Sandbox); err != nil {
			if errors.Is(err, errOutOfScope) {
				writeError(w, http.StatusNotFound, CodeNotFound, "sandbox not found")
			} else {
				s.writeErr(w, r, err)
			}
			return
		}
		sb, err := s.mgr.Get(r.Context(), req.Sandbox)
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		if sb.TaskID != req.Task {
			writeError(w, http.StatusBadRequest, CodeInvalidArgument, "sandbox "+req.Sandbox+" belongs to another task; a tool call counts against the task of its sandbox")
			return
		}
	}
	env := &callEnv{toolOps: toolOps{s: s, team: callerTeam(r), task: req.Task}, sandbox: req.Sandbox}
	res := tools.Call(r.Context(), env, tools.FunctionCalling, req.Name, req.Arguments, tools.Options{MaxOutput: req.MaxOutput})
	writeJSON(w, http.StatusOK, res)
}

// callEnv is the tools.Env of one POST /v1/tools/call: the request's
// sandbox, or for code and commands without one, a sandbox of the task
// made for the call and killed after it.
type callEnv struct {
	toolOps
	sandbox string
}

func (e *callEnv) Sandbox(ctx context.Context, named string, use tools.Use) (string, bool, func(), error) {
	if e.sandbox != "" {
		return e.sandbox, true, func() {}, nil
	}
	if use != tools.UseFresh {
		return "", false, nil, &tools.Error{Code: CodeInvalidArgument, Msg: `this tool needs a sandbox: give "sandbox" (a sandbox of the task) in the call`}
	}
	sb, err := e.create(ctx, tools.SandboxRequest{})
	if err != nil {
		return "", false, nil, err
	}
	return sb.SandboxID, false, func() { e.kill(sb.SandboxID) }, nil
}

// toolOps are the sandbox operations of tool calls, for one team's task.
// Each operation inside a sandbox is a tool call of the sandbox's task
// (commands through StartProcess, file operations through
// BeginToolCall): budgets and loop detection apply to every one.
type toolOps struct {
	s    *Server
	team string
	task string
	// ttl is the lifetime of the sandboxes made (0: the server's default).
	ttl time.Duration
}

// fail turns an error of an operation in sandbox id into a *tools.Error
// with the API's code and message (agentFailure's mapping).
func (o toolOps) fail(ctx context.Context, id string, err error) error {
	var te *tools.Error
	if errors.As(err, &te) {
		return te
	}
	f := o.s.agentFailure(ctx, id, err)
	return &tools.Error{Code: f.code, Msg: f.msg}
}

// failed turns an error of an operation outside a sandbox (create,
// kill, snapshot) into a *tools.Error (classify's mapping).
func (o toolOps) failed(err error) error {
	f := classify(err)
	if f.internalError {
		o.s.log.Error("tool call failed", "err", err)
	}
	return &tools.Error{Code: f.code, Msg: f.msg}
}

func (o toolOps) Exec(ctx context.Context, id string, req tools.ExecRequest) (*tools.ExecResult, error) {
	cfg := &process.ProcessConfig{Cmd: req.Argv[0], Args: req.Argv[1:]}
	if req.Cwd != "" {
		cfg.Cwd = &req.Cwd
	}
	f := false
	max := min(req.MaxOutput, o.s.cfg.MaxOutput)
	r, err := o.s.runProcess(ctx, id, &process.StartRequest{Process: cfg, Stdin: &f}, nil, "", req.Timeout, max)
	if err != nil {
		return nil, o.fail(ctx, id, err)
	}
	return &tools.ExecResult{ExitCode: r.ExitCode, Stdout: r.Stdout, Stderr: r.Stderr, StdoutBytes: r.StdoutBytes,
		StderrBytes: r.StderrBytes, Truncated: r.Truncated, TimedOut: r.TimedOut, EndReason: r.EndReason,
		DurationMS: r.DurationMS, Warnings: r.Warnings}, nil
}

// fileCall runs op as one tool call (what, for the loop detector) of
// running sandbox id's task.
func (o toolOps) fileCall(ctx context.Context, id, what string, op func() error) ([]string, error) {
	if o.s.mgr.Paused(id) {
		return nil, o.fail(ctx, id, sandbox.ErrConflict)
	}
	call, err := o.s.mgr.BeginToolCall(ctx, id, what)
	if err != nil {
		return nil, o.fail(ctx, id, err)
	}
	err = op()
	exit := 0
	if err != nil {
		exit = 1
	}
	warnings := call.End(exit, err != nil)
	if err != nil {
		return nil, o.fail(ctx, id, err)
	}
	return warnings, nil
}

// agentFileError is a refusal of the agent's /files endpoint, relayed
// with a code of ours and the agent's message (bounded).
func agentFileError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	var body struct {
		Message string `json:"message"`
	}
	msg := strings.TrimSpace(string(b))
	if json.Unmarshal(b, &body) == nil && body.Message != "" {
		msg = body.Message
	}
	msg = strings.ToValidUTF8(clipText(msg, 512), "?")
	switch resp.StatusCode {
	case http.StatusNotFound:
		return &tools.Error{Code: CodeNotFound, Msg: msg}
	case http.StatusBadRequest, http.StatusForbidden, http.StatusUnauthorized, http.StatusConflict,
		http.StatusRequestEntityTooLarge, http.StatusInsufficientStorage:
		return &tools.Error{Code: CodeInvalidArgument, Msg: msg}
	}
	return fmt.Errorf("agent /files answered %d: %s", resp.StatusCode, msg)
}

func clipText(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func (o toolOps) ReadFile(ctx context.Context, id, path string, max int64) (*tools.ReadResult, error) {
	res := &tools.ReadResult{Path: path, Encoding: "utf-8"}
	warnings, err := o.fileCall(ctx, id, "read_file "+path, func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, agentclient.BaseURL+"/files?path="+url.QueryEscape(path)+"&username=user", nil)
		if err != nil {
			return err
		}
		resp, err := o.s.mgr.AgentHTTP(id).Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return agentFileError(resp)
		}
		data, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
		if err != nil {
			return err
		}
		if int64(len(data)) > max {
			data, res.Truncated = data[:max], true
		}
		// A cut may split the last UTF-8 sequence: the text ends before it.
		text := data
		if res.Truncated {
			for i := 0; i < utf8.UTFMax && len(text) > 0 && !utf8.Valid(text); i++ {
				text = text[:len(text)-1]
			}
		}
		if utf8.Valid(text) {
			res.Content, res.Bytes = string(text), int64(len(text))
		} else {
			res.Content, res.Encoding, res.Bytes = base64.StdEncoding.EncodeToString(data), "base64", int64(len(data))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	res.Warnings = warnings
	return res, nil
}

func (o toolOps) WriteFile(ctx context.Context, id, path string, data []byte) (*tools.WriteResult, error) {
	warnings, err := o.fileCall(ctx, id, "write_file "+path, func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, agentclient.BaseURL+"/files?path="+url.QueryEscape(path)+"&username=user", bytes.NewReader(data))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := o.s.mgr.AgentHTTP(id).Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return agentFileError(resp)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	o.s.mgr.RecordEvent(ctx, id, "file.write", map[string]any{"path": path, "bytes": len(data), "via": "tool"})
	return &tools.WriteResult{Path: path, Bytes: int64(len(data)), Warnings: warnings}, nil
}

func (o toolOps) ListFiles(ctx context.Context, id, path string, max int) (*tools.ListResult, error) {
	res := &tools.ListResult{Path: path, Entries: []tools.Entry{}}
	warnings, err := o.fileCall(ctx, id, "list_files "+path, func() error {
		req := connect.NewRequest(&filesystem.ListDirRequest{Path: path, Depth: 1})
		req.Header().Set("Authorization", agentclient.BasicUser("user"))
		resp, err := agentclient.Filesystem(o.s.mgr.AgentHTTP(id)).ListDir(ctx, req)
		if err != nil {
			if ce := new(connect.Error); errors.As(err, &ce) && ce.Code() == connect.CodeNotFound {
				return &tools.Error{Code: CodeNotFound, Msg: clipText(ce.Message(), 512)}
			}
			return err
		}
		for _, e := range resp.Msg.GetEntries() {
			if len(res.Entries) == max {
				res.Truncated = true
				break
			}
			typ := "other"
			switch e.GetType() {
			case filesystem.FileType_FILE_TYPE_FILE:
				typ = "file"
			case filesystem.FileType_FILE_TYPE_DIRECTORY:
				typ = "dir"
			case filesystem.FileType_FILE_TYPE_SYMLINK:
				typ = "symlink"
			}
			res.Entries = append(res.Entries, tools.Entry{Name: clipText(e.GetName(), 1024), Path: clipText(e.GetPath(), tools.MaxPath), Type: typ, Size: e.GetSize()})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	res.Warnings = warnings
	return res, nil
}

// create makes a sandbox of the task (it counts against max_sandboxes).
func (o toolOps) create(ctx context.Context, req tools.SandboxRequest) (*tools.SandboxResult, error) {
	cr := sandbox.CreateRequest{Template: req.Template, Snapshot: req.Snapshot, Task: o.task, Team: o.team}
	ttl := req.Timeout
	if ttl == 0 {
		ttl = o.ttl
	}
	if ttl > 0 {
		secs := int64(ttl / time.Second)
		cr.Timeout = &secs
	}
	sb, err := o.s.mgr.Create(ctx, cr)
	if err != nil {
		return nil, o.failed(err)
	}
	return &tools.SandboxResult{SandboxID: sb.ID, Template: sb.Template, ExpiresAt: sb.ExpiresAt}, nil
}

// kill ends a sandbox made for a call or a session, whatever became of
// the request that made it.
func (o toolOps) kill(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := o.s.mgr.Kill(ctx, id); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
		o.s.log.Warn("kill a tool call's sandbox", "sandbox", id, "err", err)
	}
}

func (o toolOps) CreateSandbox(ctx context.Context, req tools.SandboxRequest) (*tools.SandboxResult, error) {
	return nil, &tools.Error{Code: CodeInvalidArgument, Msg: "create_sandbox is an MCP tool"}
}

func (o toolOps) KillSandbox(ctx context.Context, id string) (*tools.KillResult, error) {
	if _, err := o.s.mgr.Kill(ctx, id); err != nil {
		return nil, o.failed(err)
	}
	return &tools.KillResult{SandboxID: id, Killed: true}, nil
}

func (o toolOps) Snapshot(ctx context.Context, id, name string) (*tools.SnapshotResult, error) {
	var sn *store.Snapshot
	if _, err := o.fileCall(ctx, id, "snapshot_sandbox "+name, func() (err error) {
		sn, err = o.s.mgr.Snapshot(ctx, id, name)
		return err
	}); err != nil {
		return nil, err
	}
	return &tools.SnapshotResult{SandboxID: id, SnapshotID: sn.ID, Name: sn.Name}, nil
}
