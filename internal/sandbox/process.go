package sandbox

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/corralhq/corral/internal/agentclient"
	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/proto/process"
	"github.com/corralhq/corral/proto/process/processconnect"
)

// AgentHTTP returns an HTTP client whose connections reach the agent of
// sandbox id (use with agentclient.BaseURL).
func (m *Manager) AgentHTTP(id string) *http.Client {
	return m.clients.HTTP(id, func(ctx context.Context) (net.Conn, error) { return m.Dial(ctx, id) }, m.token(id))
}

func (m *Manager) dropClient(id string) { m.clients.Drop(id) }

// ProcessClient returns a connect client for the sandbox agent's process
// service, with every reply bounded (agentclient.NewProcessClient).
func (m *Manager) ProcessClient(id string) processconnect.ProcessClient {
	return m.clients.Process(id, func(ctx context.Context) (net.Conn, error) { return m.Dial(ctx, id) }, m.token(id))
}

// oomCounter is a driver that reads a sandbox's OOM-kill count alone,
// cheaper than its Stats (runtime/oci reads one cgroup file instead of
// the sandbox's memory, pids, CPU, threads and disk).
type oomCounter interface {
	OOMKills(id string) (uint64, error)
}

// oomKills returns sandbox id's OOM-kill count (Stats' OOMKills).
func (m *Manager) oomKills(id string) (uint64, error) {
	if oc, ok := m.driver.(oomCounter); ok {
		return oc.OOMKills(id)
	}
	st, err := m.driver.Stats(id)
	return st.OOMKills, err
}

// Process is a command started in a sandbox, streamed from its agent and
// recorded in the store when it ends.
type Process struct {
	m        *Manager
	id       string
	stream   *connect.ServerStreamForClient[process.StartResponse]
	cancel   context.CancelFunc
	rec      store.Command
	oomStart uint64
	done     bool
	// ended: the end event was received; drained: Close read the rest
	// of the stream.
	ended, drained bool
	// live: the sandbox was running when the last message arrived (see
	// Live).
	live     bool
	task     string
	call     *govern.CallTicket
	warnings []string
	// by carries the actor (team, API key id) of the request that
	// started the command, for its audit event.
	by context.Context
}

// StartProcess starts a command through the sandbox's agent. lifetime > 0
// bounds the command's run time (its process group is killed when it
// elapses). The stream ends when the command ends or ctx is canceled;
// canceling does not kill the command.
func (m *Manager) StartProcess(ctx context.Context, id string, req *process.StartRequest, user string, lifetime time.Duration) (*Process, error) {
	if !m.Running(id) {
		return nil, ErrNotFound
	}
	cfg := req.GetProcess()
	cmdText := strings.Join(append([]string{cfg.GetCmd()}, cfg.GetArgs()...), " ")
	task := m.taskOf(id)
	p := &Process{m: m, id: id, task: task, by: context.WithoutCancel(ctx)}
	p.rec = store.Command{
		SandboxID: id, StartedAt: time.Now().UTC(),
		Command: cmdText,
		Cwd:     cfg.GetCwd(), User: user,
	}
	if p.rec.User == "" {
		p.rec.User = "user"
	}
	// The sandbox's OOM-kill count before the command, read while the
	// start record commits (see Receive).
	oom := make(chan uint64, 1)
	go func() {
		if n, err := m.oomKills(id); err == nil {
			oom <- n
		}
		close(oom)
	}()
	// The command's record (and, for a task, the call counter with it,
	// in one commit) is stored before the command runs: a command that
	// ran always has a record, and a call counted after a crash.
	if m.cfg.Governor != nil && task != "" {
		var err error
		if p.call, err = m.cfg.Governor.BeginCall(ctx, task, id, shownCommand(cfg.GetCmd(), cfg.GetArgs()), &p.rec); err != nil {
			return nil, err
		}
	} else if rid, err := m.store.StartCommand(context.WithoutCancel(ctx), &p.rec, nil); err == nil {
		p.rec.ID = rid
	} else {
		m.log.Error("record command", "sandbox", id, "err", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	p.cancel = cancel
	creq := connect.NewRequest(req)
	if user != "" {
		creq.Header().Set("Authorization", agentclient.BasicUser(user))
	}
	p.oomStart = <-oom
	stream, err := m.ProcessClient(id).Start(agentclient.WithLifetime(ctx, lifetime), creq)
	if err != nil {
		cancel()
		p.call.End(-1, true)
		if p.rec.ID != 0 {
			now := time.Now().UTC()
			p.rec.EndedAt, p.rec.EndReason = &now, clipReason("start: "+err.Error())
			if err := m.store.EndCommand(context.Background(), &p.rec); err != nil {
				m.log.Error("record command end", "sandbox", id, "err", err)
			}
		}
		return nil, err
	}
	p.stream = stream
	m.touch(id, 1)
	if m.cfg.OnCommand != nil {
		m.cfg.OnCommand(id)
	}
	return p, nil
}

// Receive returns the next event, or nil and the error that ended the
// stream (nil error at a clean end). End events get EndReason "oom" when
// the sandbox's memory limit killed a process during the command.
func (p *Process) Receive() (*process.StartResponse, error) {
	if !p.stream.Receive() {
		err := p.stream.Err()
		p.finish(nil, err)
		return nil, err
	}
	msg := p.stream.Msg()
	// Before finish: the end event's call may open its task's breaker,
	// whose kill then races the caller's look at the sandbox.
	p.live = p.m.Running(p.id)
	ev := msg.GetEvent()
	if d := ev.GetData(); d != nil {
		p.rec.StdoutBytes += int64(len(d.GetStdout())) + int64(len(d.GetPty()))
		p.rec.StderrBytes += int64(len(d.GetStderr()))
	}
	if end := ev.GetEnd(); end != nil {
		switch {
		case end.GetTimedOut():
			end.EndReason = "timeout"
		case !end.GetExited() && (end.GetEndReason() == "" || end.GetEndReason() == "killed"):
			// The agent cannot see the sandbox's cgroup; the host can.
			end.EndReason = "killed"
			if n, err := p.m.oomKills(p.id); err == nil && n > p.oomStart {
				end.EndReason = EndOOM
			}
		}
		p.ended = true
		p.finish(end, nil)
	}
	return msg, nil
}

// Live reports whether the sandbox was running when the message Receive
// last returned arrived: false for what a sandbox's processes say while
// it is being killed (SIGTERM end events), which is no result. It is
// decided before the message's end is recorded, and defends against a
// command's own result being dropped when that end opens its task's
// breaker (a detected loop) and the kill that follows ends the sandbox
// before the caller relays the end event.
func (p *Process) Live() bool { return p.live }

func (p *Process) finish(end *process.ProcessEvent_EndEvent, err error) {
	if p.done {
		return
	}
	p.done = true
	if p.stream != nil {
		p.m.touch(p.id, -1)
	}
	now := time.Now().UTC()
	p.rec.EndedAt = &now
	if end != nil {
		code := int(end.GetExitCode())
		p.rec.ExitCode = &code
		p.rec.TimedOut = end.GetTimedOut()
		p.rec.EndReason = end.GetEndReason()
	} else if err != nil {
		p.rec.EndReason = clipReason("stream: " + err.Error())
	}
	exit, failed := -1, true
	if p.rec.ExitCode != nil {
		exit = *p.rec.ExitCode
		failed = exit != 0 || p.rec.TimedOut
	}
	p.warnings = p.call.End(exit, failed)
	lim := int64(p.m.cfg.MaxOutput)
	data := map[string]any{
		"command": clipCommand(p.rec.Command), "cwd": p.rec.Cwd, "user": p.rec.User, "exit_code": p.rec.ExitCode,
		"duration_ms": now.Sub(p.rec.StartedAt).Milliseconds(), "stdout_bytes": p.rec.StdoutBytes, "stderr_bytes": p.rec.StderrBytes,
		"truncated": lim > 0 && (p.rec.StdoutBytes > lim || p.rec.StderrBytes > lim), "timed_out": p.rec.TimedOut,
		"end_reason": p.rec.EndReason, "warnings": p.warnings,
	}
	if p.rec.ID == 0 {
		p.m.auditBy(p.by, p.id, "command", data)
		return
	}
	// The end record goes with the command's audit event, in one commit
	// of the audit writer, which the answer does not wait for (see
	// audit.Log.RecordCommandEnd; docs/brakes.md, "Durability").
	rec := p.rec
	if ce, ok := p.m.cfg.Audit.(commandEndRecorder); ok {
		ce.RecordCommandEnd(p.by, p.id, &rec, "command", data)
		return
	}
	if err := p.m.store.EndCommand(context.Background(), &rec); err != nil {
		p.m.log.Error("record command end", "sandbox", p.id, "err", err)
	}
	p.m.auditBy(p.by, p.id, "command", data)
}

// commandEndRecorder is an audit log that stores a command's end record
// with its event (*audit.Log).
type commandEndRecorder interface {
	RecordCommandEnd(ctx context.Context, sandbox string, cmd *store.Command, kind string, data any)
}

// clipReason bounds an end reason made from an error.
func clipReason(s string) string {
	if len(s) > 200 {
		return s[:200]
	}
	return s
}

// Warnings returns what the governor said about the command once it ended
// (loop_suspected, loop_detected).
func (p *Process) Warnings() []string { return p.warnings }

// shownCommand is the command as the agent wrote it: the shell wrapper the
// SDKs add ("/bin/bash -l -c CMD") is dropped, so that loop detection and
// its messages see CMD.
func shownCommand(cmd string, args []string) string {
	switch cmd {
	case "/bin/bash", "bash", "/bin/sh", "sh":
		switch {
		case len(args) == 3 && args[0] == "-l" && args[1] == "-c":
			return args[2]
		case len(args) == 2 && args[0] == "-c":
			return args[1]
		}
	}
	return strings.Join(append([]string{cmd}, args...), " ")
}

// clipCommand bounds a command text stored in the audit log.
func clipCommand(s string) string {
	if len(s) > 4096 {
		return s[:4096] + "…"
	}
	return s
}

// drainTimeout bounds how long Close waits for the rest of a stream
// whose command ended (the agent's end of stream follows its end event
// at once; a fake agent may not send it).
const drainTimeout = 100 * time.Millisecond

// Close releases the stream. After the command's end event the rest of
// the stream is read first (for at most drainTimeout), so that its
// connection to the agent is reused by the next call instead of being
// closed and dialled again.
func (p *Process) Close() {
	if p.ended && !p.drained {
		p.drained = true
		t := time.AfterFunc(drainTimeout, p.cancel)
		for p.stream.Receive() {
		}
		t.Stop()
	}
	p.cancel()
	_ = p.stream.Close()
	p.finish(nil, fmt.Errorf("closed"))
}

// DialPort opens a TCP tunnel to 127.0.0.1:port inside a running
// sandbox, through its agent (which needs no network interface for it).
func (m *Manager) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	tok, ok := m.AccessToken(id)
	if !ok {
		return nil, ErrNotFound
	}
	c, err := m.Dial(ctx, id)
	if err != nil {
		return nil, err
	}
	// The agent may be a fake planted by sandbox root: the handshake gets
	// a deadline.
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(agentclient.CallTimeout)
	}
	c.SetDeadline(dl)
	tc, err := agentclient.PortHandshake(c, port, tok)
	if err != nil {
		c.Close()
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return tc, nil
}
