package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/tools"
)

// The MCP endpoint's defaults (docs/mcp.md).
const (
	// MCPPath is the streamable-HTTP MCP endpoint (registered as "/mcp"
	// in mcpRoutes).
	MCPPath = "/mcp"
	// MCPTaskHeader names, on the requests of an MCP session, the task
	// its tool calls count against (without it, the session makes a task
	// of its own, ended with the session).
	MCPTaskHeader = "Corral-Task"
	// MCPAgent is the agent name of the tasks MCP sessions make.
	MCPAgent = "mcp"
	// DefaultMCPSessionTimeout closes an MCP session that has sent no
	// request for this long (its sandboxes are killed with it).
	DefaultMCPSessionTimeout = 30 * time.Minute
	// MCPSandboxTTL is the lifetime of a sandbox an MCP session makes
	// (unless create_sandbox names one), renewed by every call into it.
	MCPSandboxTTL = 30 * time.Minute
)

// mcpTaskKey carries the task a request's MCPTaskHeader named.
type mcpTaskKey struct{}

// mcpSessions is the state of the MCP sessions that made a tool call,
// by session id.
type mcpSessions struct {
	mu   sync.Mutex
	byID map[string]*mcpSession
}

// mcpRoutes registers the MCP endpoint: the tools of internal/tools
// (tools.MCP) over streamable HTTP, behind the API's auth middleware.
func (s *Server) mcpRoutes() {
	s.mcp = &mcpSessions{byID: map[string]*mcpSession{}}
	srv := mcp.NewServer(&mcp.Implementation{Name: "corral", Version: "1"}, &mcp.ServerOptions{
		Instructions: "corral runs code and commands in isolated Linux sandboxes. This session has its own sandbox, made on first use and killed when the session ends; files persist between calls. Every call counts against the session's task budget: when a call is refused with budget_exhausted or loop_detected, stop making calls and summarise.",
		Logger:       s.log,
	})
	closedWorld := false // a sandbox has no network unless asked for
	for _, t := range tools.On(tools.MCP) {
		destructive := t.Destructive
		srv.AddTool(&mcp.Tool{Name: t.NameIn(tools.MCP), Description: t.Description, InputSchema: t.Schema(tools.MCP),
			Annotations: &mcp.ToolAnnotations{ReadOnlyHint: t.ReadOnly, DestructiveHint: &destructive, OpenWorldHint: &closedWorld}},
			s.mcpTool(t.NameIn(tools.MCP)))
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
		SessionTimeout: DefaultMCPSessionTimeout,
		// Every request carries an API key, which a browser that DNS
		// rebinding points at a local server does not have; the SDK's
		// localhost check would refuse a server behind a local reverse
		// proxy for nothing.
		DisableLocalhostProtection: true,
		Logger:                     slog.New(slog.DiscardHandler),
	})
	// The session belongs to the key that opened it: the SDK refuses a
	// request of the session with another key (403) by the TokenInfo's
	// user id, which the verifier takes from the identity s.auth proved.
	owned := auth.RequireBearerToken(func(ctx context.Context, _ string, _ *http.Request) (*auth.TokenInfo, error) {
		id, ok := identityFrom(ctx)
		if !ok {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: id.principal(), Expiration: time.Now().Add(time.Hour)}, nil
	}, nil)(h)
	// Each request holds a stream of the key while it lasts (a tool
	// call, the SDK's standalone event stream): --max-streams-per-key.
	s.mux.Handle("/mcp", s.auth(s.streamed(s.mcpEndpoint(owned))))
}

// MaxMCPBody bounds one message POSTed to /mcp (the MCP SDK's own bound).
const MaxMCPBody = 4 << 20

// mcpEndpoint serves an authenticated request of the MCP endpoint: a
// Corral-Task it names must be a task the caller sees (404 otherwise),
// and is carried to the session in the request's context.
func (s *Server) mcpEndpoint(next http.Handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if task := r.Header.Get(MCPTaskHeader); task != "" {
			if err := s.visible(r, taskObject, task); err != nil {
				if errors.Is(err, errOutOfScope) {
					writeError(w, http.StatusNotFound, CodeNotFound, "task not found ("+MCPTaskHeader+")")
				} else {
					s.writeErr(w, r, err)
				}
				return
			}
			ctx = context.WithValue(ctx, mcpTaskKey{}, task)
		}
		r = r.Clone(ctx)
		if r.Method == http.MethodPost {
			// The SDK keeps the last of a key given twice and answers a
			// body that is not JSON in plain text: the message is read
			// (at most MaxMCPBody, the SDK's own bound) and checked by
			// the JSON rule of every body (parseJSON) before the SDK sees
			// it, a refusal answered as JSON-RPC's error (writeRPCError).
			data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxMCPBody))
			if err == nil {
				var msg json.RawMessage
				err = parseJSON(data, &msg, false)
			}
			if err != nil {
				writeRPCError(w, bodyFailure(err))
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(data))
			r.ContentLength = int64(len(data))
		}
		// The SDK's session-owner check reads a bearer token; the key was
		// checked already (X-API-Key or Bearer), the verifier ignores it.
		r.Header.Set("Authorization", "Bearer checked")
		next.ServeHTTP(w, r)
	}
}

// JSON-RPC 2.0's error codes of the MCP messages the endpoint refuses
// before the SDK reads them (docs/mcp.md).
const (
	// rpcParseError answers a body that is not one JSON value, or names
	// a key twice in an object.
	rpcParseError = -32700
	// rpcInvalidRequest answers a body over MaxMCPBody.
	rpcInvalidRequest = -32600
)

// rpcError is a JSON-RPC 2.0 error response. ID is always null: the
// refused message was not read, so its id is not known.
type rpcError struct {
	JSONRPC string  `json:"jsonrpc"`
	ID      *string `json:"id"`
	Error   struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Data    struct {
			Code string `json:"code"`
		} `json:"data"`
	} `json:"error"`
}

// writeRPCError answers the body failure f (bodyFailure) of an MCP
// message in JSON-RPC 2.0's shape, as the SDK answers its own
// JSON-RPC errors (HTTP status f's, Content-Type application/json):
// code -32700 for invalid JSON, -32600 for a body over the bound, f's
// message, and corral's stable code as error.data.code.
func writeRPCError(w http.ResponseWriter, f apiFailure) {
	var e rpcError
	e.JSONRPC = "2.0"
	e.Error.Code, e.Error.Message, e.Error.Data.Code = rpcParseError, f.msg, f.code
	if f.code != CodeInvalidJSON {
		e.Error.Code = rpcInvalidRequest
	}
	writeJSON(w, f.status, e)
}

// mcpTool is the MCP handler of tool name: one tools.Call in the
// session's environment, its Result as MCP's (isError with the readable
// message for a refusal or failure).
func (s *Server) mcpTool(name string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		ss, err := s.mcpSession(ctx, req.Session)
		var res tools.Result
		if err != nil {
			te := (&toolOps{s: s}).failed(err).(*tools.Error)
			res = tools.Result{Name: name, IsError: true, Code: te.Code, Content: te.Code + ": " + te.Msg}
		} else {
			res = tools.Call(ctx, ss, tools.MCP, name, req.Params.Arguments, tools.Options{})
		}
		out := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: res.Content}}, IsError: res.IsError}
		if res.IsError {
			out.StructuredContent = map[string]string{"code": res.Code, "message": res.Content}
		} else {
			out.StructuredContent = res.Result
		}
		return out, nil
	}
}

// mcpSession is one MCP session's tools.Env: its task, its sandboxes.
type mcpSession struct {
	toolOps
	id string
	// ownTask: the session made its task, and ends it when it ends.
	ownTask bool

	mu sync.Mutex
	// current is the sandbox calls without sandbox_id use ("" none yet).
	current string
	// made are the sandboxes the session made, killed when it ends; true
	// for one whose lifetime every call renews (no timeout was asked).
	made map[string]bool
	// ended: the session is over; no sandbox is made any more.
	ended bool
}

// mcpSession returns the state of session ss, making it on its first
// tool call: the task (the one MCPTaskHeader named, or a new one of the
// caller's team) and a watcher that ends it when the session closes.
func (s *Server) mcpSession(ctx context.Context, ss *mcp.ServerSession) (*mcpSession, error) {
	if s.gov == nil {
		return nil, errors.New("this server keeps no tasks")
	}
	id, ok := identityFrom(ctx)
	if !ok {
		return nil, errors.New("MCP session without an identity")
	}
	sid := ss.ID()
	s.mcp.mu.Lock()
	defer s.mcp.mu.Unlock()
	if st := s.mcp.byID[sid]; st != nil {
		return st, nil
	}
	st := &mcpSession{toolOps: toolOps{s: s, team: id.Team, ttl: MCPSandboxTTL}, id: sid, made: map[string]bool{}}
	if task, _ := ctx.Value(mcpTaskKey{}).(string); task != "" {
		st.task = task
	} else {
		t, err := s.gov.Create(ctx, govern.TaskRequest{Team: id.Team, Agent: MCPAgent})
		if err != nil {
			return nil, err
		}
		st.task, st.ownTask = t.ID, true
	}
	s.mcp.byID[sid] = st
	go func() {
		_ = ss.Wait()
		s.endMCPSession(st)
	}()
	return st, nil
}

// endMCPSession kills the sandboxes a closed session made and ends the
// task it made.
func (s *Server) endMCPSession(st *mcpSession) {
	s.mcp.mu.Lock()
	delete(s.mcp.byID, st.id)
	s.mcp.mu.Unlock()
	st.mu.Lock()
	st.ended = true
	ids := make([]string, 0, len(st.made))
	for id := range st.made {
		ids = append(ids, id)
	}
	st.mu.Unlock()
	for _, id := range ids {
		st.kill(id)
	}
	if st.ownTask {
		if _, err := s.gov.EndTask(context.Background(), st.task); err != nil && !errors.Is(err, govern.ErrNoTask) {
			s.log.Warn("end an MCP session's task", "task", st.task, "err", err)
		}
	}
	s.log.Info("MCP session ended", "session", st.id, "task", st.task, "sandboxes_killed", len(ids))
}

func (st *mcpSession) Sandbox(ctx context.Context, named string, use tools.Use) (string, bool, func(), error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended {
		return "", false, nil, &tools.Error{Code: CodeNotFound, Msg: "the MCP session has ended"}
	}
	id := named
	switch _, ours := st.made[named]; {
	case named != "":
		if !ours {
			// A sandbox of the session's task (and so of its team) that
			// another session or the API made.
			sb, err := st.s.mgr.Get(ctx, named)
			if err != nil || sb.TaskID != st.task || sb.Team != st.team {
				return "", false, nil, &tools.Error{Code: CodeNotFound, Msg: fmt.Sprintf("sandbox %s is not a sandbox of this session's task", named)}
			}
		}
	case st.current != "" && st.s.mgr.Running(st.current):
		id = st.current
	case use == tools.UseExisting:
		return "", false, nil, &tools.Error{Code: CodeNotFound, Msg: "this session has no sandbox"}
	default:
		sb, err := st.create(ctx, tools.SandboxRequest{})
		if err != nil {
			return "", false, nil, err
		}
		st.current, st.made[sb.SandboxID] = sb.SandboxID, true
		id = sb.SandboxID
	}
	renew := st.made[id] && st.ttl > 0 // a kill_sandbox may end it first
	return id, true, func() {
		if renew {
			_, _ = st.s.mgr.ExtendTimeout(context.WithoutCancel(ctx), id, st.ttl)
		}
	}, nil
}

func (st *mcpSession) CreateSandbox(ctx context.Context, req tools.SandboxRequest) (*tools.SandboxResult, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended {
		return nil, &tools.Error{Code: CodeNotFound, Msg: "the MCP session has ended"}
	}
	sb, err := st.create(ctx, req)
	if err != nil {
		return nil, err
	}
	st.current, st.made[sb.SandboxID] = sb.SandboxID, req.Timeout == 0
	return sb, nil
}

func (st *mcpSession) KillSandbox(ctx context.Context, id string) (*tools.KillResult, error) {
	res, err := st.toolOps.KillSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	st.mu.Lock()
	delete(st.made, id)
	if st.current == id {
		st.current = ""
	}
	st.mu.Unlock()
	return res, nil
}
