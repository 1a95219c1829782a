package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corralhq/corral/internal/agentclient"
	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/proto/agentproto"
)

// InterpreterPort is the port of the code-interpreter server inside a
// sandbox (E2B's code-interpreter port; docs/api.md, "Code runs").
const InterpreterPort = 49999

// Limits of a code run relayed by the control plane (docs/api.md, "Code runs").
const (
	// MaxCodeRequest bounds the body of a run request (the code and its
	// env vars).
	MaxCodeRequest = 4 << 20
	// MaxCodeLine bounds one line of the interpreter's answer (a result
	// with a large image); a longer line is dropped and the run is marked
	// truncated.
	MaxCodeLine = 16 << 20
	// MaxCodeAnswer bounds everything relayed for one run; past it,
	// results are dropped too (stdout and stderr stop at the server's
	// --max-output first).
	MaxCodeAnswer = 64 << 20
	// DefaultCodeTimeout is a native run's timeout when it names none.
	DefaultCodeTimeout = 60 * time.Second
	// MaxCodeTimeout is the longest timeout a native run may ask for.
	MaxCodeTimeout = time.Hour
	// CodeStartWait is how long, beyond its timeout, a native run may
	// wait for the interpreter to start it (the server starting in a
	// young sandbox, the context's kernel starting, earlier runs of the
	// context): its timeout counts from its start, its first line.
	CodeStartWait = 2 * time.Minute
)

// codeRequest is the part of a run request the control plane reads; the
// request is forwarded as it came.
type codeRequest struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id,omitempty"`
	Language  string            `json:"language,omitempty"`
	EnvVars   map[string]string `json:"env_vars,omitempty"`
}

// codeLine is the part of an answer line the control plane reads.
type codeLine struct {
	Type           string `json:"type"`
	Text           string `json:"text"`
	Name           string `json:"name"`
	Value          string `json:"value"`
	ExecutionCount *int   `json:"execution_count"`
}

// codeRun is what the control plane saw of one run: the audit record and
// the loop detector's input.
type codeRun struct {
	StdoutBytes    int64    `json:"stdout_bytes"`
	StderrBytes    int64    `json:"stderr_bytes"`
	Results        []string `json:"results"` // each result's formats, "png+text"
	Error          string   `json:"error,omitempty"`
	ExecutionCount *int     `json:"execution_count,omitempty"`
	Truncated      bool     `json:"truncated"`
	TimedOut       bool     `json:"timed_out"`
	OOM            bool     `json:"oom"`
	// End is how the run ended: "end_of_execution", "timeout",
	// "client_gone" or "interpreter_gone".
	End string `json:"end"`
}

// errNoInterpreter: nothing listens on the interpreter port.
var errNoInterpreter = errors.New("no code interpreter listens in the sandbox: create it from the code-interpreter template (docs/api.md, Code runs)")

// upstreamError is a non-200 answer of the interpreter, relayed as it
// came (a 404 for an unknown context, a 400 for a bad language).
type upstreamError struct {
	status int
	body   []byte
}

func (e *upstreamError) Error() string {
	return fmt.Sprintf("code interpreter answered %d: %s", e.status, e.body)
}

// relayCode runs one code request in sandbox id's interpreter and hands
// each line of its answer to emit. It is the one path of every code run,
// E2B's /execute and the native route alike, and it defends the host and
// the task against what a run (or a hostile interpreter) does: the run is
// a tool call of the sandbox's task (budgets, loop detection); stdout
// and stderr are cut at --max-output with one marker line, lines and the
// whole answer are bounded (MaxCodeLine, MaxCodeAnswer); timeout (0:
// none), counted from the run's start (CodeStartWait bounds the wait
// for it), cancels the run, which makes the interpreter interrupt its
// kernel; a client that goes away cancels it likewise; an OOM kill
// during the run is reported as an error line and in the audit log; the
// run is audited (code.run) with its code, result summary, duration and
// truncation. The answer always ends with end_of_execution unless the
// client is gone.
func (s *Server) relayCode(ctx context.Context, id string, body []byte, req codeRequest, timeout time.Duration, emit func([]byte) error) (*codeRun, error) {
	what := "run_code " + req.Language + " " + req.ContextID + ": " + req.Code
	call, err := s.mgr.BeginToolCall(ctx, id, what)
	if err != nil {
		return nil, err
	}
	started := time.Now()
	run := &codeRun{Results: []string{}}
	var oomBefore uint64
	if st, err := s.mgr.Stats(id); err == nil {
		oomBefore = st.OOMKills
	}
	// The timeout counts from the run's start (its first line), not from
	// the request: on a busy host the wait for the interpreter, for the
	// kernel's start or for earlier runs of the context can take longer
	// than a short timeout, and the run would end TimeoutError without
	// having run. The wait is bounded by CodeStartWait on its own.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var timedOut, unstarted atomic.Bool
	var runStarted func()
	if timeout > 0 {
		timer := time.AfterFunc(timeout+CodeStartWait, func() { unstarted.Store(true); timedOut.Store(true); cancel() })
		var once sync.Once
		runStarted = func() {
			once.Do(func() {
				if timer.Stop() {
					timer = time.AfterFunc(timeout, func() { timedOut.Store(true); cancel() })
				}
			})
		}
		defer func() { timer.Stop() }()
	}
	err = s.streamCode(rctx, id, body, run, runStarted, emit)
	switch {
	case ctx.Err() != nil:
		run.End = "client_gone"
	case timedOut.Load():
		run.End, run.TimedOut = "timeout", true
	case err != nil:
		var ue *upstreamError
		if errors.As(err, &ue) || errors.Is(err, errNoInterpreter) {
			call.End(1, true)
			return nil, err
		}
		run.End = "interpreter_gone"
	case run.TimedOut:
		run.End = "timeout" // the interpreter's own TimeoutError
	default:
		run.End = "end_of_execution"
	}
	if st, err := s.mgr.Stats(id); err == nil && st.OOMKills > oomBefore {
		run.OOM = true
	}
	if run.End != "client_gone" {
		switch {
		case run.OOM && run.Error != "OutOfMemoryError":
			// Whatever the interpreter said of its dead kernel, the
			// reason is the memory limit: this error comes last, and
			// wins (E2B's SDK keeps the last error line).
			run.Error = "OutOfMemoryError"
			_ = emit(codeErrorLine("OutOfMemoryError", "the run was killed at the sandbox's memory limit (reason oom); the context's state is lost"))
		case run.Error != "":
		case run.TimedOut && unstarted.Load():
			run.Error = "TimeoutError"
			_ = emit(codeErrorLine("TimeoutError", fmt.Sprintf("the run did not start within %v (its timeout and %v for the interpreter and its kernel to start it); the code did not run", timeout+CodeStartWait, CodeStartWait)))
		case run.TimedOut:
			run.Error = "TimeoutError"
			_ = emit(codeErrorLine("TimeoutError", fmt.Sprintf("the run exceeded its timeout of %v and was interrupted; the context stays usable", timeout)))
		case run.End == "interpreter_gone":
			run.Error = "UnexpectedEndOfExecution"
			_ = emit(codeErrorLine("UnexpectedEndOfExecution", "the code interpreter ended its answer before the run ended"))
		}
		_ = emit([]byte(`{"type":"end_of_execution"}`))
	}
	exit := 0
	if run.Error != "" {
		exit = 1
	}
	warnings := call.End(exit, exit != 0)
	s.recordCode(ctx, id, req, run, time.Since(started), warnings)
	return run, nil
}

// streamCode sends the request to the interpreter and relays its lines
// until end_of_execution (held back: relayCode sends it last). started,
// when set, is called at the run's first line other than a keepalive:
// the interpreter sends it once the kernel executes the run.
func (s *Server) streamCode(ctx context.Context, id string, body []byte, run *codeRun, started func(), emit func([]byte) error) error {
	resp, err := s.interpreterDo(ctx, id, http.MethodPost, "/execute", body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return &upstreamError{status: resp.StatusCode, body: b}
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	var relayed int64
	markOutput := false
	for {
		line, tooLong, err := readLine(br, MaxCodeLine)
		if err != nil {
			return err
		}
		if tooLong {
			run.Truncated = true
			continue
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var l codeLine
		if json.Unmarshal(line, &l) != nil {
			continue // not a line of the protocol: dropped
		}
		if started != nil && l.Type != "keepalive" {
			started()
		}
		switch l.Type {
		case "end_of_execution":
			return nil
		case "stdout", "stderr":
			n := int64(len(l.Text))
			if l.Type == "stdout" {
				run.StdoutBytes += n
			} else {
				run.StderrBytes += n
			}
			if max := int64(s.cfg.MaxOutput); max > 0 && (run.StdoutBytes > max || run.StderrBytes > max) {
				run.Truncated = true
				if !markOutput {
					markOutput = true
					line = codeStreamLine("stderr", fmt.Sprintf("\n[corral: output truncated: over %d bytes of stdout or stderr in this run; the rest is dropped]\n", max))
				} else {
					continue
				}
			}
		case "result":
			run.Results = append(run.Results, resultFormats(line))
		case "error":
			if run.Error == "" {
				run.Error = l.Name
			}
			// The interpreter ends a run at the timeout it was sent
			// (counted from the same start as relayCode's) with this
			// error, usually before relayCode's own timer fires.
			if l.Name == "TimeoutError" {
				run.TimedOut = true
			}
		case "number_of_executions":
			run.ExecutionCount = l.ExecutionCount
		}
		if relayed+int64(len(line)) > MaxCodeAnswer {
			run.Truncated = true
			continue
		}
		relayed += int64(len(line))
		if err := emit(line); err != nil {
			return err
		}
	}
}

// readLine reads one line of at most max bytes; a longer line is read to
// its end and reported as tooLong.
func readLine(br *bufio.Reader, max int) (line []byte, tooLong bool, err error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(buf)+len(chunk) > max {
			tooLong = true
			buf = buf[:0]
		} else if !tooLong {
			buf = append(buf, chunk...)
		}
		switch {
		case err == nil:
			return buf, tooLong, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(buf) > 0 && !tooLong:
			return buf, false, nil
		default:
			return nil, tooLong, err
		}
	}
}

// resultFormats names the formats of a result line ("png+text").
func resultFormats(line []byte) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(line, &m) != nil {
		return "unknown"
	}
	var fs []string
	for k := range m {
		if k != "type" && k != "is_main_result" {
			fs = append(fs, k)
		}
	}
	slices.Sort(fs)
	return strings.Join(fs, "+")
}

func codeStreamLine(kind, text string) []byte {
	b, _ := json.Marshal(map[string]string{"type": kind, "text": text, "timestamp": time.Now().UTC().Format(time.RFC3339Nano)})
	return b
}

func codeErrorLine(name, value string) []byte {
	b, _ := json.Marshal(map[string]string{"type": "error", "name": name, "value": value, "traceback": name + ": " + value})
	return b
}

// recordCode writes the code.run audit event.
func (s *Server) recordCode(ctx context.Context, id string, req codeRequest, run *codeRun, took time.Duration, warnings []string) {
	if s.cfg.Audit == nil {
		return
	}
	code := req.Code
	if len(code) > 4096 {
		code = code[:4096] + "…"
	}
	s.cfg.Audit.RecordBy(ctx, id, "code.run", map[string]any{
		"code": code, "language": req.Language, "context": req.ContextID,
		"duration_ms": took.Milliseconds(), "run": run, "warnings": warnings,
	})
}

// InterpreterStartWait is how long a request to the interpreter port of
// a sandbox whose template starts a server waits for it to listen, while
// the sandbox is young: E2B's SDK runs code right after create, while the
// server is still starting (docs/api.md, Code runs).
const InterpreterStartWait = 30 * time.Second

// awaitInterpreter waits, up to InterpreterStartWait after the sandbox's
// creation, until something listens on the interpreter port of sandbox
// id, when its template starts a server at create; otherwise it returns
// at once (a run then finds no interpreter, or finds it).
func (s *Server) awaitInterpreter(ctx context.Context, id string) {
	sb, err := s.mgr.Get(ctx, id)
	if err != nil || s.templates == nil || time.Since(sb.CreatedAt) > InterpreterStartWait {
		return
	}
	ref := sb.TemplateVersion
	if ref == "" {
		ref = sb.Template
	}
	if tv, err := s.templates.Resolve(ctx, ref); err != nil || tv.Config.Start == "" {
		return
	}
	deadline := sb.CreatedAt.Add(InterpreterStartWait)
	for wait := 20 * time.Millisecond; time.Now().Before(deadline); wait = min(2*wait, 250*time.Millisecond) {
		c, err := s.mgr.DialPort(ctx, id, InterpreterPort)
		if err == nil {
			c.Close()
			return
		}
		var pe *agentclient.PortError
		if !errors.As(err, &pe) {
			return // the sandbox is gone, or the caller
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// interpreterDo sends one request to sandbox id's interpreter through a
// tunnel over its agent's socket. Only when nothing listens yet does it
// wait for a starting interpreter (awaitInterpreter) and try once more,
// so a run in a sandbox whose interpreter is up costs no lookup.
func (s *Server) interpreterDo(ctx context.Context, id, method, path string, body []byte) (*http.Response, error) {
	resp, err := s.interpreterSend(ctx, id, method, path, body)
	if errors.Is(err, errNoInterpreter) {
		s.awaitInterpreter(ctx, id)
		resp, err = s.interpreterSend(ctx, id, method, path, body)
	}
	return resp, err
}

// interpreterSend is one attempt of interpreterDo.
func (s *Server) interpreterSend(ctx context.Context, id, method, path string, body []byte) (*http.Response, error) {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return s.mgr.DialPort(ctx, id, InterpreterPort)
		},
		DisableKeepAlives: true,
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://127.0.0.1:"+strconv.Itoa(InterpreterPort)+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	var pe *agentclient.PortError
	if errors.As(err, &pe) {
		return nil, errNoInterpreter
	}
	return resp, err
}

// readCodeRequest reads and checks a run request body.
func readCodeRequest(w http.ResponseWriter, r *http.Request) ([]byte, codeRequest, error) {
	var req codeRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxCodeRequest))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, req, mbe // 413 (classify)
	case err != nil:
		return nil, req, &bodyError{"reading the body: " + err.Error()}
	}
	if err := parseJSON(body, &req, false); err != nil {
		return nil, req, err
	}
	return body, req, nil
}

// e2bExecute serves E2B's POST /execute on the interpreter port (the
// E2B code-interpreter SDK's runCode): it needs the sandbox's access
// token (X-Access-Token, as envd) and streams the run's lines.
func (s *Server) e2bExecute(w http.ResponseWriter, r *http.Request, id string) {
	token, ok := s.mgr.AccessToken(id)
	if !ok {
		e2bNotFound(w, id)
		return
	}
	if !sameSecret(r.Header.Get(agentproto.AccessTokenHeader), token) {
		e2bError(w, http.StatusUnauthorized, e2bUnauthorized)
		return
	}
	release, ok := s.sandboxStream(w, id)
	if !ok {
		return
	}
	defer release()
	body, req, err := readCodeRequest(w, r)
	if err != nil {
		f := classify(err)
		e2bError(w, f.status, f.msg)
		return
	}
	emit, started := ndjsonWriter(w)
	if _, err := s.relayCode(r.Context(), id, body, req, 0, emit); err != nil && !*started {
		s.codeErr(w, r, id, err, true)
	}
}

// ndjsonWriter returns an emit function that writes one NDJSON line to w
// and flushes it, sending the 200 and the content type with the first
// line, and whether it has sent anything (an error can still be answered
// as such until then).
func ndjsonWriter(w http.ResponseWriter) (emit func([]byte) error, started *bool) {
	rc := http.NewResponseController(w)
	started = new(bool)
	return func(line []byte) error {
		if !*started {
			*started = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
		}
		if _, err := w.Write(append(line, '\n')); err != nil {
			return err
		}
		return rc.Flush()
	}, started
}

// codeErr answers a run that did not start: the interpreter's own
// refusal as it came, a brake's refusal, or a missing interpreter.
func (s *Server) codeErr(w http.ResponseWriter, r *http.Request, id string, err error, e2b bool) {
	var ue *upstreamError
	var trip *govern.TripError
	switch {
	case errors.As(err, &ue) && e2b:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(ue.status)
		w.Write(ue.body)
	case errors.As(err, &ue):
		msg := strings.TrimSpace(string(ue.body))
		switch ue.status {
		case http.StatusBadRequest:
			writeError(w, http.StatusBadRequest, CodeInvalidArgument, msg)
		case http.StatusNotFound:
			writeError(w, http.StatusNotFound, CodeNotFound, msg)
		default:
			writeError(w, http.StatusBadGateway, CodeUnavailable, fmt.Sprintf("the code interpreter answered %d: %s", ue.status, msg))
		}
	case errors.Is(err, errNoInterpreter):
		if e2b {
			e2bError(w, http.StatusBadGateway, err.Error())
			return
		}
		writeError(w, http.StatusServiceUnavailable, CodeUnavailable, err.Error())
	case errors.As(err, &trip) && e2b:
		// The code-interpreter SDK shows the body of an error as its
		// message: the code first, then what the agent should do.
		http.Error(w, trip.Code+": "+trip.Msg, http.StatusForbidden)
	case errors.Is(err, sandbox.ErrNotFound) && e2b:
		e2bNotFound(w, id)
	case e2b:
		s.e2bWriteErr(w, r, err)
	default:
		s.writeErr(w, r, err)
	}
}

// runCode serves POST /v1/sandboxes/{id}/code: one run in the sandbox's
// code interpreter, {"code", "context_id", "language", "env_vars",
// "timeout" (seconds; default 60, at most 3600), "stream"}. With stream
// the answer is the interpreter's NDJSON lines (as E2B's /execute);
// otherwise one JSON object: results, logs, error, execution_count,
// truncated, timed_out, oom, duration_ms.
func (s *Server) runCode(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	body, req, err := readCodeRequest(w, r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	var opts struct {
		Timeout *float64 `json:"timeout"`
		Stream  bool     `json:"stream"`
	}
	if err := parseJSON(body, &opts, false); err != nil {
		s.writeErr(w, r, err)
		return
	}
	timeout := DefaultCodeTimeout
	if opts.Timeout != nil {
		timeout = time.Duration(*opts.Timeout * float64(time.Second))
		if *opts.Timeout <= 0 || timeout > MaxCodeTimeout {
			s.writeErr(w, r, &sandbox.InvalidError{Msg: fmt.Sprintf("timeout must be more than 0 and at most %d seconds", int(MaxCodeTimeout/time.Second))})
			return
		}
	}
	if opts.Stream {
		emit, started := ndjsonWriter(w)
		if _, err := s.relayCode(r.Context(), id, body, req, timeout, emit); err != nil && !*started {
			s.codeErr(w, r, id, err, false)
		}
		return
	}
	out := codeExecution{Results: []json.RawMessage{}, Logs: codeLogs{Stdout: []string{}, Stderr: []string{}}}
	started := time.Now()
	run, err := s.relayCode(r.Context(), id, body, req, timeout, func(line []byte) error {
		var l struct {
			codeLine
			Traceback string `json:"traceback"`
		}
		if json.Unmarshal(line, &l) != nil {
			return nil
		}
		switch l.Type {
		case "stdout":
			out.Logs.Stdout = append(out.Logs.Stdout, l.Text)
		case "stderr":
			out.Logs.Stderr = append(out.Logs.Stderr, l.Text)
		case "result":
			out.Results = append(out.Results, append(json.RawMessage(nil), line...))
		case "error":
			if out.Error == nil || l.Name == "OutOfMemoryError" {
				out.Error = &codeError{Name: l.Name, Value: l.Value, Traceback: l.Traceback}
			}
		case "number_of_executions":
			out.ExecutionCount = l.ExecutionCount
		}
		return nil
	})
	if err != nil {
		s.codeErr(w, r, id, err, false)
		return
	}
	out.Truncated, out.TimedOut, out.OOM = run.Truncated, run.TimedOut, run.OOM
	out.DurationMS = time.Since(started).Milliseconds()
	writeJSON(w, http.StatusOK, out)
}

// codeExecution is the native answer of a run (runCode without stream).
type codeExecution struct {
	Results        []json.RawMessage `json:"results"`
	Logs           codeLogs          `json:"logs"`
	Error          *codeError        `json:"error"`
	ExecutionCount *int              `json:"execution_count"`
	Truncated      bool              `json:"truncated"`
	TimedOut       bool              `json:"timed_out"`
	OOM            bool              `json:"oom"`
	DurationMS     int64             `json:"duration_ms"`
}

type codeLogs struct {
	Stdout []string `json:"stdout"`
	Stderr []string `json:"stderr"`
}

type codeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// codeContexts serves the native contexts routes,
// /v1/sandboxes/{id}/code/contexts[/{ctx}[/restart]], by forwarding them
// to the interpreter's /contexts routes.
func (s *Server) codeContexts(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !s.mgr.Running(id) {
		s.writeErr(w, r, sandbox.ErrNotFound)
		return
	}
	path := "/contexts"
	if c := r.PathValue("ctx"); c != "" {
		// Escaped: a context id is one path segment of the interpreter's
		// routes, never a way to another route ("..%2Fhealth").
		path += "/" + url.PathEscape(c)
		if strings.HasSuffix(r.URL.Path, "/restart") {
			path += "/restart"
		}
	}
	// The body goes to the interpreter as it came, once it passed the JSON
	// rule of every body (parseJSON): no key given twice for the
	// interpreter to read otherwise than corral did.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxJSONBody))
	if err == nil && len(bytes.TrimSpace(body)) > 0 {
		err = parseJSON(body, new(map[string]json.RawMessage), false)
	}
	if err != nil {
		s.writeFailure(w, r, bodyFailure(err))
		return
	}
	resp, err := s.interpreterDo(r.Context(), id, r.Method, path, body)
	if err != nil {
		s.codeErr(w, r, id, err, false)
		return
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, io.LimitReader(resp.Body, 1<<20))
}
