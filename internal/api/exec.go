package api

import (
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
	if s.mgr.Paused(id) {
		s.writeErr(w, r, sandbox.ErrConflict)
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
	began := time.Now()
	p, err := s.mgr.StartProcess(r.Context(), id, start, req.User, lifetime)
	if err != nil {
		s.writeAgentErr(w, r, err)
		return
	}
	defer p.Close()
	resp := execResponse{}
	stdout, stderr := &output.Tail{Max: s.cfg.MaxOutput}, &output.Tail{Max: s.cfg.MaxOutput}
	for {
		msg, err := p.Receive()
		if isCallerError(err) || errors.Is(err, agentclient.ErrReply) {
			s.writeAgentErr(w, r, err)
			return
		}
		if err != nil || msg == nil {
			// The stream broke: if the sandbox died under the command (at
			// its memory limit, say), the command was killed with it. A
			// dying sandbox can take seconds to be gone on a loaded host
			// (gVisor's sentry in particular); the agent is the sandbox's
			// init, so a broken stream from a live sandbox is rare and the
			// wait is only spent then.
			if reason, dead := s.mgr.EndIfDead(r.Context(), id, 15*time.Second); dead {
				resp.ExitCode, resp.EndReason = 137, reason
				break
			}
			if err == nil {
				err = errors.New("stream ended without a result")
			}
			s.writeAgentErr(w, r, err)
			return
		}
		ev := msg.GetEvent()
		if st := ev.GetStart(); st != nil && len(stdin) > 0 {
			if err := s.feedStdin(r, id, st.GetPid(), stdin); err != nil {
				s.writeAgentErr(w, r, err)
				return
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
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) feedStdin(r *http.Request, id string, pid uint32, data []byte) error {
	pc := s.mgr.ProcessClient(id)
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
	for len(data) > 0 {
		n := min(len(data), 64<<10)
		_, err := pc.SendInput(r.Context(), connect.NewRequest(&process.SendInputRequest{
			Process: sel, Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: data[:n]}},
		}))
		if err != nil {
			return err
		}
		data = data[n:]
	}
	_, err := pc.CloseStdin(r.Context(), connect.NewRequest(&process.CloseStdinRequest{Process: sel}))
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

// writeAgentErr maps errors from the agent: caller mistakes keep their
// meaning, a vanished sandbox is 404, anything else 503.
func (s *Server) writeAgentErr(w http.ResponseWriter, r *http.Request, err error) {
	var trip *govern.TripError
	if errors.As(err, &trip) {
		s.writeErr(w, r, err)
		return
	}
	if errors.Is(err, agentclient.ErrReply) {
		// The message is ours (a size or an encoding), never the agent's.
		s.log.Warn("agent reply refused", "sandbox", r.PathValue("id"), "err", err)
		writeError(w, http.StatusBadGateway, CodeAgentReply, agentReplyMessage(err))
		return
	}
	if ce := new(connect.Error); errorsAs(err, &ce) {
		switch ce.Code() {
		case connect.CodeInvalidArgument, connect.CodeUnauthenticated, connect.CodeNotFound:
			writeError(w, http.StatusBadRequest, CodeInvalidArgument, ce.Message())
			return
		}
	}
	if !s.mgr.Running(r.PathValue("id")) {
		if berr := s.mgr.BrakeError(r.Context(), r.PathValue("id")); berr != nil {
			s.writeErr(w, r, berr)
			return
		}
		writeError(w, http.StatusNotFound, CodeNotFound, "sandbox not found (it ended)")
		return
	}
	if err == sandbox.ErrNotFound {
		s.writeErr(w, r, err)
		return
	}
	s.log.Warn("agent call failed", "sandbox", r.PathValue("id"), "err", err)
	writeError(w, http.StatusServiceUnavailable, CodeUnavailable, "the sandbox's agent did not answer")
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
