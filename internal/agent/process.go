package agent

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"

	pb "github.com/corralhq/corral/proto/process"
)

// defaultKeepalive is envd's keepalive interval when the client sends no
// Keepalive-Ping-Interval header.
const defaultKeepalive = 90 * time.Second

// processService implements processconnect.ProcessHandler.
type processService struct{ s *Server }

// keepaliveInterval reads Keepalive-Ping-Interval (seconds).
func keepaliveInterval(h http.Header) time.Duration {
	if v := h.Get("Keepalive-Ping-Interval"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return time.Duration(n) * time.Second
		}
	}
	return defaultKeepalive
}

// Start spawns a process and streams its events. The handler context's
// deadline (from Connect-Timeout-Ms) is the process's lifetime: when it
// passes the process group is killed and the end event says timed_out.
// A client going away does not kill the process.
func (ps *processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	u, _, err := ps.s.rpcUser(req.Header())
	if err != nil {
		return err
	}
	sp, err := ps.s.prepare(req.Msg, u)
	if err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok {
		sp.deadline = dl
	}
	sub := newSubscriber()
	p, err := ps.s.spawn(sp, sub)
	if err != nil {
		return err
	}
	defer p.unsubscribe(sub)
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.StartResponse{Event: ev}) }
	return streamEvents(ctx, p, sub, keepaliveInterval(req.Header()), !sp.deadline.IsZero(), send)
}

// Connect attaches to a running process (live output only) or replays
// start and end of one that ended within the last 30 seconds.
func (ps *processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := ps.s.procs.find(req.Msg.GetProcess(), true)
	if err != nil {
		return connect.NewError(connect.CodeNotFound, err)
	}
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.ConnectResponse{Event: ev}) }
	sub := newSubscriber()
	if !p.subscribe(sub) {
		if err := send(startEvent(p.pid)); err != nil {
			return err
		}
		return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: p.endEvent()}})
	}
	defer p.unsubscribe(sub)
	return streamEvents(ctx, p, sub, keepaliveInterval(req.Header()), false, send)
}

func startEvent(pid int) *pb.ProcessEvent {
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: uint32(pid)}}}
}

// streamEvents sends start, then output and keepalives, then the end event.
// With lifetime (a Start whose deadline is the process's lifetime) the
// deadline does not stop the stream: the lifetime timer kills the process
// at the same moment and the end event still goes out.
func streamEvents(ctx context.Context, p *proc, sub *subscriber, keepalive time.Duration, lifetime bool, send func(*pb.ProcessEvent) error) error {
	if err := send(startEvent(p.pid)); err != nil {
		return err
	}
	ka := time.NewTimer(keepalive)
	defer ka.Stop()
	done := ctx.Done()
	for {
		select {
		case ev := <-sub.ch:
			if err := send(ev); err != nil {
				return err
			}
			ka.Reset(keepalive)
		case <-ka.C:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
			ka.Reset(keepalive)
		case <-p.finished:
			for {
				select {
				case ev := <-sub.ch:
					if err := send(ev); err != nil {
						return err
					}
					continue
				default:
				}
				break
			}
			return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: p.endEvent()}})
		case <-done:
			if lifetime && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// The lifetime timer fires at this deadline too; keep
				// streaming until the end event.
				done = nil
				continue
			}
			return ctx.Err()
		}
	}
}

// List returns the live processes with the configuration they were started
// with.
func (ps *processService) List(ctx context.Context, req *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	resp := &pb.ListResponse{}
	for _, p := range ps.s.procs.list() {
		info := &pb.ProcessInfo{Config: p.config, Pid: uint32(p.pid)}
		if p.tag != "" {
			info.Tag = &p.tag
		}
		resp.Processes = append(resp.Processes, info)
	}
	return connect.NewResponse(resp), nil
}

// SendInput writes to a process's stdin pipe or PTY.
func (ps *processService) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, connect.NewError(connect.CodeNotFound, err)
	}
	if err := sendInput(ctx, p, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

// maxInputWait bounds how long input waits for a process that does not
// read it, when the request itself has no deadline.
const maxInputWait = time.Minute

func sendInput(ctx context.Context, p *proc, in *pb.ProcessInput) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(maxInputWait)
	}
	var err error
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Stdin:
		err = p.writeInput(v.Stdin, false, deadline)
	case *pb.ProcessInput_Pty:
		err = p.writeInput(v.Pty, true, deadline)
	default:
		return nil
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, errors.New("process is not reading its input"))
	}
	if err != nil {
		return connect.NewError(connect.CodeInternal, err)
	}
	return nil
}

// SendSignal sends SIGTERM or SIGKILL to the process's process group.
func (ps *processService) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, connect.NewError(connect.CodeNotFound, err)
	}
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("invalid signal: "+req.Msg.GetSignal().String()))
	}
	p.signalled.Store(true)
	if err := p.kill(sig); err != nil && err != syscall.ESRCH {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

// Update resizes a process's PTY.
func (ps *processService) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, connect.NewError(connect.CodeNotFound, err)
	}
	if req.Msg.Pty != nil {
		if !p.isPTY {
			return nil, connect.NewError(connect.CodeInternal, errors.New("process has no PTY"))
		}
		size := req.Msg.GetPty().GetSize()
		if err := pty.Setsize(p.ptmx, &pty.Winsize{Cols: uint16(size.GetCols()), Rows: uint16(size.GetRows())}); err != nil {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

// CloseStdin closes a process's stdin pipe.
func (ps *processService) CloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, connect.NewError(connect.CodeNotFound, err)
	}
	if err := p.closeStdin(); err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

// StreamInput takes a start message naming the process, then input data.
func (ps *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			found, err := ps.s.procs.find(ev.Start.GetProcess(), false)
			if err != nil {
				return nil, connect.NewError(connect.CodeNotFound, err)
			}
			p = found
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("first message must be start"))
			}
			if err := sendInput(ctx, p, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		case *pb.StreamInputRequest_Keepalive:
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}
