package corral

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"github.com/corralhq/corral/internal/output"
	"io"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/corralhq/corral/proto/agentproto"
	"github.com/corralhq/corral/proto/process"
	"github.com/corralhq/corral/proto/process/processconnect"
)

// DefaultMaxOutput is how much of each output stream a CommandResult keeps
// when RunOptions.MaxOutput is 0.
const DefaultMaxOutput = 1 << 20

// stdinChunk is the largest SendInput payload.
const stdinChunk = 64 << 10

// Exit codes used for commands that did not exit on their own.
const (
	ExitCodeTimeout = 124 // the per-command timeout elapsed
	ExitCodeKilled  = 137 // 128 + SIGKILL
)

// End reasons reported in CommandResult.EndReason / ExecResult.EndReason.
const (
	EndReasonTimeout = "timeout"
	EndReasonOOM     = "oom"
	EndReasonKilled  = "killed"
)

// RunOptions configure a command started with [Sandbox.Run] or
// [Sandbox.Start].
type RunOptions struct {
	// Args, when non-nil (even empty), makes the command string the program
	// and Args its arguments, run without a shell. When nil the command
	// string runs under /bin/bash -l -c.
	Args []string
	// Cwd is the working directory (default: the user's home).
	Cwd string
	// Env adds environment variables for this command.
	Env map[string]string
	// User runs the command as this user ("user" by default, or "root").
	User string
	// Stdin, if set, is copied to the command's stdin, which is then
	// closed. Without it the command's stdin is /dev/null, except for
	// Start with OpenStdin.
	Stdin io.Reader
	// OpenStdin (Start only) keeps a stdin pipe open without a reader, for
	// CommandHandle.SendInput and CloseStdin.
	OpenStdin bool
	// Timeout kills the command after this long (exit code 124,
	// EndReason "timeout"). 0 sends no limit.
	Timeout time.Duration
	// OnStdout and OnStderr receive output as it arrives, from a single
	// goroutine, in order. The slice may be retained.
	OnStdout func([]byte)
	OnStderr func([]byte)
	// MaxOutput is how many trailing bytes of each stream the result keeps
	// (default DefaultMaxOutput; negative keeps none).
	MaxOutput int
}

// CommandResult is the outcome of a command.
type CommandResult struct {
	// ExitCode is the exit code; 128+n when killed by signal n (137 for
	// SIGKILL), 124 when the command's timeout elapsed.
	ExitCode int
	// Stdout and Stderr keep the last MaxOutput bytes of each stream.
	Stdout, Stderr string
	// StdoutBytes and StderrBytes count all the output.
	StdoutBytes, StderrBytes int64
	// Truncated says Stdout or Stderr lost bytes to MaxOutput.
	Truncated bool
	// TimedOut says the command's timeout elapsed.
	TimedOut bool
	// EndReason is "timeout", "oom" or "killed" when the command did not
	// exit on its own (or the sandbox's end reason when the sandbox ended
	// under it), else "".
	EndReason string
	// Status is the agent's description of the end ("exit status 1",
	// "signal: killed").
	Status string
	// PID is the command's process id in the sandbox.
	PID uint32
}

// ProcessInfo describes a process started through the agent.
type ProcessInfo struct {
	PID  uint32
	Tag  string
	Cmd  string
	Args []string
	Env  map[string]string
	Cwd  string
}

func (s *Sandbox) agentURL() string {
	return s.client.baseURL + "/v1/sandboxes/" + url.PathEscape(s.ID) + "/agent"
}

// processClient returns the client of the sandbox agent's process
// service, kept by the Client per sandbox (building one costs more than
// a short command's round trip to the server).
func (s *Sandbox) processClient() processconnect.ProcessClient {
	return s.client.processClient(s.agentURL())
}

func setUser(h interface{ Set(string, string) }, user string) {
	if user != "" {
		h.Set("Authorization", agentproto.UserAuthScheme+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
}

func pidSelector(pid uint32) *process.ProcessSelector {
	return &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
}

// Run runs a command and waits for it, streaming its output to
// opts.OnStdout / opts.OnStderr. A non-zero exit code is not an error. If
// ctx is cancelled the command is killed and ctx's error returned. If the
// connection breaks without a result, Run returns the partial result with
// EndReason set from the sandbox (for example "oom" or "killed") and an
// error.
func (s *Sandbox) Run(ctx context.Context, cmd string, opts RunOptions) (*CommandResult, error) {
	h, err := s.start(ctx, cmd, opts)
	if err != nil {
		return nil, err
	}
	res, err := h.Wait()
	if err != nil && ctx.Err() != nil {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = h.Kill(kctx)
		cancel()
		return res, ctx.Err()
	}
	return res, err
}

// Start starts a command in the background and returns once it is running.
// The stream that delivers output lives as long as ctx: cancelling ctx
// stops delivery (Wait returns the context's error) but does not kill the
// command; use CommandHandle.Kill for that.
func (s *Sandbox) Start(ctx context.Context, cmd string, opts RunOptions) (*CommandHandle, error) {
	return s.start(ctx, cmd, opts)
}

func (s *Sandbox) start(ctx context.Context, cmd string, opts RunOptions) (*CommandHandle, error) {
	if cmd == "" {
		return nil, &APIError{Code: CodeInvalidArgument, Message: "empty command"}
	}
	cfg := &process.ProcessConfig{Envs: opts.Env}
	if opts.Args != nil {
		cfg.Cmd = cmd
		cfg.Args = opts.Args
	} else {
		cfg.Cmd = "/bin/bash"
		cfg.Args = []string{"-l", "-c", cmd}
	}
	if opts.Cwd != "" {
		cwd := opts.Cwd
		cfg.Cwd = &cwd
	}
	stdin := opts.Stdin != nil || opts.OpenStdin
	req := connect.NewRequest(&process.StartRequest{Process: cfg, Stdin: &stdin})
	setUser(req.Header(), opts.User)
	req.Header().Set("Keepalive-Ping-Interval", "30")

	ci := &callInfo{timeout: opts.Timeout}
	sctx, cancel := context.WithCancel(withCallInfo(ctx, ci))
	stream, err := s.processClient().Start(sctx, req)
	if err != nil {
		cancel()
		return nil, fromConnect(err, ci)
	}
	// The first message is the start event (keepalives may come first).
	var pid uint32
	for pid == 0 {
		if !stream.Receive() {
			err := stream.Err()
			stream.Close()
			cancel()
			if err == nil {
				err = errors.New("corral: command stream ended before the start event")
			}
			return nil, fromConnect(err, ci)
		}
		ev := stream.Msg().GetEvent()
		switch {
		case ev.GetStart() != nil:
			pid = ev.GetStart().GetPid()
			if pid == 0 {
				stream.Close()
				cancel()
				return nil, errors.New("corral: start event without a pid")
			}
		case ev.GetKeepalive() != nil:
		default:
			stream.Close()
			cancel()
			return nil, errors.New("corral: expected a start event")
		}
	}
	max := opts.MaxOutput
	if max == 0 {
		max = DefaultMaxOutput
	}
	if max < 0 {
		max = 0
	}
	h := &CommandHandle{
		sb:     s,
		pid:    pid,
		ctx:    ctx,
		cancel: cancel,
		done:   make(chan struct{}),
		stdout: output.Tail{Max: max},
		stderr: output.Tail{Max: max},
	}
	go h.receive(stream, ci, opts.OnStdout, opts.OnStderr)
	if opts.Stdin != nil {
		go h.copyStdin(opts.Stdin)
	}
	return h, nil
}

// CommandHandle is a command started with [Sandbox.Start].
type CommandHandle struct {
	sb     *Sandbox
	pid    uint32
	ctx    context.Context
	cancel context.CancelFunc

	done   chan struct{}
	stdout output.Tail
	stderr output.Tail
	end    *process.ProcessEvent_EndEvent
	err    error
	res    *CommandResult
	once   sync.Once
}

// PID returns the command's process id in the sandbox.
func (h *CommandHandle) PID() uint32 { return h.pid }

// Done returns a channel closed when the command's result is known: its
// end event arrived or its stream ended.
func (h *CommandHandle) Done() <-chan struct{} { return h.done }

// streamDrainTimeout bounds how long the rest of a command's stream is
// read after its end event (the server ends the stream right after it).
const streamDrainTimeout = 5 * time.Second

func (h *CommandHandle) receive(stream *connect.ServerStreamForClient[process.StartResponse], ci *callInfo, onStdout, onStderr func([]byte)) {
	ended := false
	defer func() {
		if !ended {
			close(h.done)
		}
	}()
	defer h.cancel()
	defer stream.Close()
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		switch {
		case ev.GetData() != nil:
			d := ev.GetData()
			if b := d.GetStdout(); len(b) > 0 {
				h.stdout.Write(b)
				if onStdout != nil {
					onStdout(b)
				}
			}
			if b := d.GetStderr(); len(b) > 0 {
				h.stderr.Write(b)
				if onStderr != nil {
					onStderr(b)
				}
			}
			if b := d.GetPty(); len(b) > 0 {
				h.stdout.Write(b)
				if onStdout != nil {
					onStdout(b)
				}
			}
		case ev.GetEnd() != nil:
			// The result is complete: Wait returns now. The rest of the
			// stream (its end, which carries nothing a result needs) is
			// read after, so that its connection is reused for the next
			// call; nothing is written to the handle any more.
			h.end = ev.GetEnd()
			ended = true
			close(h.done)
			t := time.AfterFunc(streamDrainTimeout, h.cancel)
			for stream.Receive() {
			}
			t.Stop()
			return
		}
	}
	if err := stream.Err(); err != nil && h.end == nil {
		h.err = fromConnect(err, ci)
	}
}

func (h *CommandHandle) copyStdin(r io.Reader) {
	buf := make([]byte, stdinChunk)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if serr := h.SendInput(buf[:n]); serr != nil {
				return
			}
		}
		if err != nil {
			select {
			case <-h.done:
			default:
				_ = h.CloseStdin()
			}
			return
		}
	}
}

// Wait waits for the command to end and returns its result. A non-zero
// exit code is not an error. If the stream breaks without the command's
// end event, Wait returns a partial result (exit code 137 and the
// sandbox's EndReason when the sandbox has ended) and an error.
func (h *CommandHandle) Wait() (*CommandResult, error) {
	<-h.done
	h.once.Do(h.finish)
	return h.res, h.err
}

func (h *CommandHandle) finish() {
	res := &CommandResult{PID: h.pid}
	res.Stdout, res.StdoutBytes = h.stdout.String(), h.stdout.Total
	res.Stderr, res.StderrBytes = h.stderr.String(), h.stderr.Total
	res.Truncated = h.stdout.Truncated() || h.stderr.Truncated()
	h.res = res
	if h.end != nil {
		applyEnd(res, h.end)
		h.err = nil
		return
	}
	if h.err == nil {
		h.err = errors.New("corral: command stream ended without a result")
	}
	if h.ctx.Err() != nil {
		h.err = h.ctx.Err()
		return
	}
	// The stream broke: the sandbox may have ended under the command.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(h.ctx), 10*time.Second)
	defer cancel()
	sb, gerr := h.sb.client.Get(ctx, h.sb.ID)
	if gerr == nil && sb.State == StateEnded {
		res.ExitCode = ExitCodeKilled
		res.EndReason = sb.EndReason
		if res.EndReason == "" {
			res.EndReason = EndReasonKilled
		}
		h.err = fmt.Errorf("corral: sandbox %s ended (%s) while the command ran: %w", h.sb.ID, res.EndReason, h.err)
		return
	}
	if IsNotFound(gerr) {
		res.ExitCode = ExitCodeKilled
		res.EndReason = EndReasonKilled
		h.err = fmt.Errorf("corral: sandbox %s is gone: %w", h.sb.ID, h.err)
	}
}

// applyEnd fills the exit fields of res from an end event.
func applyEnd(res *CommandResult, end *process.ProcessEvent_EndEvent) {
	res.Status = end.GetStatus()
	res.EndReason = end.GetEndReason()
	res.TimedOut = end.GetTimedOut()
	switch {
	case res.TimedOut:
		res.ExitCode = ExitCodeTimeout
		if res.EndReason == "" {
			res.EndReason = EndReasonTimeout
		}
	case end.GetExited():
		res.ExitCode = int(end.GetExitCode())
	default:
		if sig, ok := signalFromStatus(res.Status); ok {
			res.ExitCode = 128 + sig
		} else if c := int(end.GetExitCode()); c > 0 {
			res.ExitCode = c
		} else if res.EndReason == EndReasonOOM || res.EndReason == EndReasonKilled {
			res.ExitCode = ExitCodeKilled
		} else {
			res.ExitCode = c
		}
	}
}

// linuxSignals maps Go's os.ProcessState signal texts (Linux) to numbers.
var linuxSignals = map[string]int{
	"hangup": 1, "interrupt": 2, "quit": 3, "illegal instruction": 4,
	"trace/breakpoint trap": 5, "aborted": 6, "bus error": 7,
	"floating point exception": 8, "killed": 9, "user defined signal 1": 10,
	"segmentation fault": 11, "user defined signal 2": 12, "broken pipe": 13,
	"alarm clock": 14, "terminated": 15, "stack fault": 16, "child exited": 17,
	"continued": 18, "stopped (signal)": 19, "stopped": 20,
	"stopped (tty input)": 21, "stopped (tty output)": 22,
	"urgent I/O condition": 23, "CPU time limit exceeded": 24,
	"file size limit exceeded": 25, "virtual timer expired": 26,
	"profiling timer expired": 27, "window changed": 28, "I/O possible": 29,
	"power failure": 30, "bad system call": 31,
}

// signalFromStatus parses "signal: killed", "signal: segmentation fault
// (core dumped)" or "signal: signal 34".
func signalFromStatus(status string) (int, bool) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(status), "signal: ")
	if !ok {
		return 0, false
	}
	rest = strings.TrimSuffix(rest, " (core dumped)")
	if n, ok := linuxSignals[rest]; ok {
		return n, true
	}
	if num, ok := strings.CutPrefix(rest, "signal "); ok {
		if n, err := strconv.Atoi(num); err == nil && n > 0 && n < 128 {
			return n, true
		}
	}
	return 0, false
}

// SendInput writes data to the command's stdin (the command must have been
// started with RunOptions.Stdin or OpenStdin). Large data is sent in chunks.
func (h *CommandHandle) SendInput(data []byte) error {
	return h.sb.SendInput(h.ctx, h.pid, data)
}

// CloseStdin closes the command's stdin.
func (h *CommandHandle) CloseStdin() error {
	return h.sb.CloseStdin(h.ctx, h.pid)
}

// Signal sends sig to the command (SIGTERM or SIGKILL).
func (h *CommandHandle) Signal(ctx context.Context, sig process.Signal) error {
	return h.sb.SignalProcess(ctx, h.pid, sig)
}

// Kill sends SIGKILL to the command.
func (h *CommandHandle) Kill(ctx context.Context) error {
	return h.sb.KillProcess(ctx, h.pid)
}

// Processes lists the processes started through the agent that are still
// running.
func (s *Sandbox) Processes(ctx context.Context) ([]ProcessInfo, error) {
	ci := &callInfo{}
	resp, err := s.processClient().List(withCallInfo(ctx, ci), connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		return nil, fromConnect(err, ci)
	}
	out := make([]ProcessInfo, 0, len(resp.Msg.GetProcesses()))
	for _, p := range resp.Msg.GetProcesses() {
		c := p.GetConfig()
		out = append(out, ProcessInfo{
			PID: p.GetPid(), Tag: p.GetTag(), Cmd: c.GetCmd(), Args: c.GetArgs(),
			Env: c.GetEnvs(), Cwd: c.GetCwd(),
		})
	}
	return out, nil
}

// SignalProcess sends sig (SIGTERM or SIGKILL) to the process pid.
func (s *Sandbox) SignalProcess(ctx context.Context, pid uint32, sig process.Signal) error {
	ci := &callInfo{}
	_, err := s.processClient().SendSignal(withCallInfo(ctx, ci), connect.NewRequest(&process.SendSignalRequest{
		Process: pidSelector(pid), Signal: sig,
	}))
	return fromConnect(err, ci)
}

// KillProcess sends SIGKILL to the process pid. An unknown pid is a
// not_found error.
func (s *Sandbox) KillProcess(ctx context.Context, pid uint32) error {
	return s.SignalProcess(ctx, pid, process.Signal_SIGNAL_SIGKILL)
}

// SendInput writes data to the stdin of process pid, in chunks of at most
// 64 KiB.
func (s *Sandbox) SendInput(ctx context.Context, pid uint32, data []byte) error {
	pc := s.processClient()
	for first := true; first || len(data) > 0; first = false {
		n := min(len(data), stdinChunk)
		ci := &callInfo{}
		_, err := pc.SendInput(withCallInfo(ctx, ci), connect.NewRequest(&process.SendInputRequest{
			Process: pidSelector(pid),
			Input:   &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: data[:n]}},
		}))
		if err != nil {
			return fromConnect(err, ci)
		}
		data = data[n:]
	}
	return nil
}

// CloseStdin closes the stdin of process pid.
func (s *Sandbox) CloseStdin(ctx context.Context, pid uint32) error {
	ci := &callInfo{}
	_, err := s.processClient().CloseStdin(withCallInfo(ctx, ci), connect.NewRequest(&process.CloseStdinRequest{
		Process: pidSelector(pid),
	}))
	return fromConnect(err, ci)
}
