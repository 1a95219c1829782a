package api

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/corralhq/corral/internal/agentclient"
	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/output"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/proto/process"
)

// Bounds on exec requests.
const (
	maxArgs      = 1024
	maxArgBytes  = 256 << 10
	maxExecStdin = 1 << 20
)

type execRequest struct {
	Cmd     []string          `json:"cmd"`
	Command string            `json:"command"`
	Cwd     string            `json:"cwd"`
	Env     map[string]string `json:"env"`
	User    string            `json:"user"`
	Stdin   string            `json:"stdin"`
	Timeout *float64          `json:"timeout"`
}

type execResponse struct {
	ExitCode    int    `json:"exit_code"`
	Stdout      string `json:"stdout"`
	Stderr      string `json:"stderr"`
	StdoutBytes int64  `json:"stdout_bytes"`
	StderrBytes int64  `json:"stderr_bytes"`
	Truncated   bool   `json:"truncated"`
	TimedOut    bool   `json:"timed_out"`
	EndReason   string `json:"end_reason"`
	DurationMS  int64  `json:"duration_ms"`
	// Warnings are the governor's notes on this call (loop_suspected,
	// loop_detected); omitted when none.
	Warnings []string `json:"warnings,omitempty"`
}

// ExitCode maps an agent end event to a shell-style exit code: the exit
// status, 124 for a timeout, 128+signal for a signal (137 for SIGKILL).
func ExitCode(end *process.ProcessEvent_EndEvent) int {
	if end.GetTimedOut() {
		return 124
	}
	if end.GetExited() {
		return int(end.GetExitCode())
	}
	if sig, ok := strings.CutPrefix(end.GetStatus(), "signal: "); ok {
		for n, name := range signalNames {
			if name == sig {
				return 128 + n
			}
		}
	}
	return 137
}

var signalNames = map[int]string{1: "hangup", 2: "interrupt", 3: "quit", 6: "aborted", 9: "killed",
	13: "broken pipe", 14: "alarm clock", 15: "terminated"}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req execRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	start, msg := buildStart(&req)
	if msg != "" {
		writeError(w, http.StatusBadRequest, CodeInvalidArgument, msg)
		return
	}
	var stdin []byte
	if req.Stdin != "" {
		var err error
		stdin, err = base64.StdEncoding.DecodeString(req.Stdin)
		if err != nil || len(stdin) > maxExecStdin {
			writeError(w, http.StatusBadRequest, CodeInvalidArgument, "stdin must be base64 of at most 1 MiB")
			return
		}
		t := true
		start.Stdin = &t
	}
	sb, err := s.mgr.Get(r.Context(), id)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	lifetime := sb.CommandTimeout
	if req.Timeout != nil {
		if *req.Timeout < 0 || *req.Timeout > float64(sandbox.MaxCommandTimeout/time.Second) {
			writeError(w, http.StatusBadRequest, CodeInvalidArgument, "timeout must be between 0 and 86400 seconds")
			return
		}
		lifetime = time.Duration(*req.Timeout * float64(time.Second))
	}
	resp, err := s.runProcess(r.Context(), id, start, stdin, req.User, lifetime, s.cfg.MaxOutput)
	if err != nil {
		s.writeAgentErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// runProcess runs one command in running sandbox id to its end (a tool
// call of the sandbox's task, through StartProcess), feeding it stdin
// when given and keeping the last maxOutput bytes of stdout and of
// stderr. It is the one path of REST exec and of the tools' commands.
// Its errors are the agent's or the governor's (see agentFailure).
func (s *Server) runProcess(ctx context.Context, id string, start *process.StartRequest, stdin []byte, user string, lifetime time.Duration, maxOutput int) (*execResponse, error) {
	if s.mgr.Paused(id) {
		return nil, sandbox.ErrConflict
	}
	began := time.Now()
	p, err := s.mgr.StartProcess(ctx, id, start, user, lifetime)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	resp := &execResponse{}
	stdout, stderr := &output.Tail{Max: maxOutput}, &output.Tail{Max: maxOutput}
	for {
		msg, err := p.Receive()
		if isCallerError(err) || errors.Is(err, agentclient.ErrReply) {
			return nil, err
		}
		if err != nil || msg == nil {
			// The stream broke: if the sandbox died under the command (at
			// its memory limit, say), the command was killed with it. A
			// dying sandbox can take seconds to be gone on a loaded host
			// (gVisor's sentry in particular); the agent is the sandbox's
			// init, so a broken stream from a live sandbox is rare and the
			// wait is only spent then.
			if reason, dead := s.mgr.EndIfDead(ctx, id, 15*time.Second); dead {
				resp.ExitCode, resp.EndReason = 137, reason
				break
			}
			if err == nil {
				err = errors.New("stream ended without a result")
			}
			return nil, err
		}
		ev := msg.GetEvent()
		if st := ev.GetStart(); st != nil && len(stdin) > 0 {
			if err := s.feedStdin(ctx, id, st.GetPid(), stdin); err != nil {
				return nil, err
			}
		}
		if d := ev.GetData(); d != nil {
			stdout.Write(d.GetStdout())
			stderr.Write(d.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			resp.ExitCode = ExitCode(end)
			resp.TimedOut = end.GetTimedOut()
			resp.EndReason = end.GetEndReason()
			break
		}
	}
	resp.Stdout, resp.Stderr = stdout.String(), stderr.String()
	resp.StdoutBytes, resp.StderrBytes = stdout.Total, stderr.Total
	resp.Truncated = stdout.Truncated() || stderr.Truncated()
	resp.DurationMS = time.Since(began).Milliseconds()
	p.Close() // records the end, so that the governor's verdict is known
	resp.Warnings = p.Warnings()
	return resp, nil
}

func (s *Server) feedStdin(ctx context.Context, id string, pid uint32, data []byte) error {
	pc := s.mgr.ProcessClient(id)
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
	for len(data) > 0 {
		n := min(len(data), 64<<10)
		_, err := pc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{
			Process: sel, Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: data[:n]}},
		}))
		if err != nil {
			return err
		}
		data = data[n:]
	}
	_, err := pc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: sel}))
	return err
}

// buildStart turns an exec request into an agent Start request, or
// returns why it cannot.
func buildStart(req *execRequest) (*process.StartRequest, string) {
	if (len(req.Cmd) == 0) == (req.Command == "") {
		return nil, `give exactly one of "cmd" (argv) or "command" (shell text)`
	}
	if req.User != "" && req.User != "user" && req.User != "root" {
		return nil, `user must be "user" or "root"`
	}
	cfg := &process.ProcessConfig{Envs: req.Env}
	if req.Command != "" {
		cfg.Cmd, cfg.Args = "/bin/bash", []string{"-l", "-c", req.Command}
	} else {
		cfg.Cmd, cfg.Args = req.Cmd[0], req.Cmd[1:]
	}
	size := len(cfg.Cmd)
	for _, a := range cfg.Args {
		size += len(a)
	}
	if len(cfg.Args) > maxArgs || size > maxArgBytes || cfg.Cmd == "" {
		return nil, "command must be non-empty, at most " + strconv.Itoa(maxArgs) + " args and 256 KiB"
	}
	if len(req.Env) > sandbox.MaxEnvVars {
		return nil, "too many env vars"
	}
	if req.Cwd != "" {
		if len(req.Cwd) > 4096 {
			return nil, "cwd too long"
		}
		cfg.Cwd = &req.Cwd
	}
	f := false
	return &process.StartRequest{Process: cfg, Stdin: &f}, ""
}

// isCallerError reports whether the agent refused the request itself
// (bad cwd, unknown user, ...), as opposed to the stream breaking.
func isCallerError(err error) bool {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return false
	}
	switch ce.Code() {
	case connect.CodeInvalidArgument, connect.CodeUnauthenticated, connect.CodeNotFound, connect.CodePermissionDenied:
		return true
	}
	return false
}

// writeAgentErr answers an error of a call into sandbox r's {id} (see
// agentFailure).
func (s *Server) writeAgentErr(w http.ResponseWriter, r *http.Request, err error) {
	s.writeFailure(w, r, s.agentFailure(r.Context(), r.PathValue("id"), err))
}

// agentFailure maps errors of a call into sandbox id's agent: caller
// mistakes keep their meaning, a tripped task its breaker's code, a
// vanished sandbox is 404 (or its task's refusal, when a brake stopped
// it), anything else 503.
func (s *Server) agentFailure(ctx context.Context, id string, err error) apiFailure {
	var trip *govern.TripError
	if errors.As(err, &trip) {
		return classify(err)
	}
	if errors.Is(err, agentclient.ErrReply) {
		// The message is ours (a size or an encoding), never the agent's.
		s.log.Warn("agent reply refused", "sandbox", id, "err", err)
		return apiFailure{status: http.StatusBadGateway, code: CodeAgentReply, msg: agentReplyMessage(err)}
	}
	if ce := new(connect.Error); errorsAs(err, &ce) {
		switch ce.Code() {
		case connect.CodeInvalidArgument, connect.CodeUnauthenticated, connect.CodeNotFound:
			return apiFailure{status: http.StatusBadRequest, code: CodeInvalidArgument, msg: ce.Message()}
		}
	}
	if f := classify(err); !f.internalError && !errors.Is(err, sandbox.ErrNotFound) {
		return f // a refusal of ours (a paused sandbox, a bad argument)
	}
	if !s.mgr.Running(id) {
		if berr := s.mgr.BrakeError(ctx, id); berr != nil {
			return classify(berr)
		}
		return apiFailure{status: http.StatusNotFound, code: CodeNotFound, msg: "sandbox not found (it ended)"}
	}
	if err == sandbox.ErrNotFound {
		return classify(err)
	}
	s.log.Warn("agent call failed", "sandbox", id, "err", err)
	return apiFailure{status: http.StatusServiceUnavailable, code: CodeUnavailable, msg: "the sandbox's agent did not answer"}
}

// agentReplyMessage is the part of an agentclient.ErrReply error that the
// control plane wrote (connect-go's wrapping around it is dropped).
func agentReplyMessage(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, agentclient.ErrReply.Error()); i >= 0 {
		return msg[i:]
	}
	return agentclient.ErrReply.Error()
}
