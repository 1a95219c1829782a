package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/corralhq/corral/internal/agentclient"
	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/proto/process"
	"github.com/corralhq/corral/proto/process/processconnect"
)

// agentRoute serves /v1/sandboxes/{id}/agent/...: the sandbox's
// envd-compatible agent API. process.Process goes through a typed relay
// (so every command is recorded and OOM kills are named); the filesystem
// service and /files are proxied as they are.
func (s *Server) agentRoute(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !s.mgr.Running(id) {
		if s.mgr.Paused(id) {
			writeError(w, http.StatusConflict, CodeConflict, "sandbox is paused; resume it first")
			return
		}
		if _, err := s.mgr.Get(r.Context(), id); err == nil {
			if berr := s.mgr.BrakeError(r.Context(), id); berr != nil {
				s.writeErr(w, r, berr)
				return
			}
			writeError(w, http.StatusNotFound, CodeNotFound, "sandbox has ended")
			return
		}
		writeError(w, http.StatusNotFound, CodeNotFound, "sandbox not found")
		return
	}
	prefix := "/v1/sandboxes/" + id + "/agent"
	r2 := r.Clone(withSandboxID(r.Context(), id))
	r2.URL.Path = strings.TrimPrefix(r.URL.Path, prefix)
	r2.URL.RawPath = ""
	s.stripCredentials(r2, true)
	isolateFiles(w, r2.URL.Path)
	s.agent.ServeHTTP(w, r2)
}

func newAgentProxy(mgr *sandbox.Manager, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	// Small messages (a command's start and end, short output) are sent
	// uncompressed: gzip's per-message setup costs more than it saves.
	path, h := processconnect.NewProcessHandler(&processRelay{mgr: mgr}, connect.WithReadMaxBytes(1<<20),
		connect.WithCompressMinBytes(compressMinBytes))
	mux.Handle(path, h)
	target, _ := url.Parse(agentclient.BaseURL)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = "agent"
		},
		Transport: roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			return mgr.AgentHTTP(sandboxIDFrom(r.Context())).Transport.RoundTrip(r)
		}),
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.Warn("agent proxy", "sandbox", sandboxIDFrom(r.Context()), "err", err)
			writeError(w, http.StatusBadGateway, CodeUnavailable, "the sandbox's agent did not answer")
		},
	}
	// A stream's response starts while the request body may still be
	// being copied upstream; without full duplex the server would close
	// the request body at the first flush, the copy would fail and the
	// transport would drop the agent connection under the stream.
	mux.Handle("/", fileAudit(mgr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		rp.ServeHTTP(w, r)
	})))
	return mux
}

// compressMinBytes is the smallest message the process relay compresses
// for a client that accepts compression.
const compressMinBytes = 1024

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// processRelay forwards process.Process calls to the sandbox's agent.
type processRelay struct {
	processconnect.UnimplementedProcessHandler
	mgr *sandbox.Manager
}

func (p *processRelay) client(ctx context.Context) processconnect.ProcessClient {
	return p.mgr.ProcessClient(sandboxIDFrom(ctx))
}

// forward copies the headers the agent needs (the user) to an outgoing request.
func forward[T any](in connect.AnyRequest, msg *T) *connect.Request[T] {
	out := connect.NewRequest(msg)
	if a := in.Header().Get("Authorization"); a != "" {
		out.Header().Set("Authorization", a)
	}
	if k := in.Header().Get("Keepalive-Ping-Interval"); k != "" {
		out.Header().Set("Keepalive-Ping-Interval", k)
	}
	return out
}

// userOf returns the user named by a Basic Authorization header.
func userOf(h http.Header) string {
	r := http.Request{Header: h}
	u, _, ok := r.BasicAuth()
	if !ok {
		return ""
	}
	return u
}

// streamCtx keeps a command's stream open past the caller's deadline:
// the deadline is the command's lifetime, which the agent enforces and
// reports with an end event; only a caller that goes away cancels.
func streamCtx(ctx context.Context) (context.Context, time.Duration, context.CancelFunc) {
	var lifetime time.Duration
	if dl, ok := ctx.Deadline(); ok {
		lifetime = max(time.Until(dl), time.Millisecond)
	}
	out, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel()
		}
	})
	return out, lifetime, func() { stop(); cancel() }
}

func (p *processRelay) Start(ctx context.Context, req *connect.Request[process.StartRequest], out *connect.ServerStream[process.StartResponse]) error {
	sctx, lifetime, cancel := streamCtx(ctx)
	defer cancel()
	proc, err := p.mgr.StartProcess(sctx, sandboxIDFrom(ctx), req.Msg, userOf(req.Header()), lifetime)
	if err != nil {
		var trip *govern.TripError
		if errors.As(err, &trip) {
			// E2B's SDK shows the message; the code names the brake.
			msg := trip.Msg
			if !strings.HasPrefix(msg, trip.Code+":") {
				msg = trip.Code + ": " + msg
			}
			return connect.NewError(connect.CodeResourceExhausted, errors.New(msg))
		}
		return err
	}
	defer proc.Close()
	for {
		msg, err := proc.Receive()
		if err != nil || msg == nil {
			p.abortIfGone(ctx)
			return err
		}
		if !proc.Live() {
			// The sandbox is being killed: what its processes say while
			// dying (SIGTERM end events) is not a result.
			panic(http.ErrAbortHandler)
		}
		if err := out.Send(msg); err != nil {
			return err
		}
		if msg.GetEvent().GetEnd() != nil {
			return nil
		}
	}
}

func (p *processRelay) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], out *connect.ServerStream[process.ConnectResponse]) error {
	sctx, _, cancel := streamCtx(ctx)
	defer cancel()
	in, err := p.client(ctx).Connect(sctx, forward(req, req.Msg))
	if err != nil {
		return err
	}
	defer in.Close()
	for in.Receive() {
		if !p.mgr.Running(sandboxIDFrom(ctx)) {
			panic(http.ErrAbortHandler)
		}
		if err := out.Send(in.Msg()); err != nil {
			return err
		}
	}
	p.abortIfGone(ctx)
	return in.Err()
}

// abortIfGone cuts the client's connection mid-stream, with no end-stream
// message, when the sandbox ended under a running command: the e2b SDK
// then probes /health, gets 502 and reports that the sandbox was killed
// (docs/e2b-protocol.md §5). net/http aborts the response on ErrAbortHandler.
func (p *processRelay) abortIfGone(ctx context.Context) {
	id := sandboxIDFrom(ctx)
	if p.mgr.Running(id) {
		if _, dead := p.mgr.EndIfDead(ctx, id, 0); !dead {
			return
		}
	}
	panic(http.ErrAbortHandler)
}

func unary[Req, Res any](ctx context.Context, req *connect.Request[Req], call func(context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) (*connect.Response[Res], error) {
	res, err := call(ctx, forward(req, req.Msg))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res.Msg), nil
}

func (p *processRelay) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	return unary(ctx, req, p.client(ctx).List)
}

func (p *processRelay) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	return unary(ctx, req, p.client(ctx).Update)
}

func (p *processRelay) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	return unary(ctx, req, p.client(ctx).SendInput)
}

func (p *processRelay) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	return unary(ctx, req, p.client(ctx).SendSignal)
}

func (p *processRelay) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	return unary(ctx, req, p.client(ctx).CloseStdin)
}
