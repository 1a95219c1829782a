package runtimetest

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	realagent "github.com/corralhq/corral/internal/agent"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/proto/agentproto"
	fspb "github.com/corralhq/corral/proto/filesystem"
	"github.com/corralhq/corral/proto/filesystem/filesystemconnect"
	pb "github.com/corralhq/corral/proto/process"
	"github.com/corralhq/corral/proto/process/processconnect"
)

// maxUpload bounds one POST /files body of the fake agent.
const maxUpload = 16 << 20

// agent is one fake sandbox's agent: an HTTP server with the
// envd-compatible services on an in-memory listener.
type agent struct {
	d     *Driver
	id    string
	token string
	env   map[string]string
	files *memFS
	procs *procTable
	ln    *pipeListener
	srv   *http.Server
	// stopped is closed by shutdown (stop or death).
	stopped  chan struct{}
	stopOnce sync.Once

	mu sync.Mutex
	// thawed is closed while the sandbox runs and open while it is
	// paused; guarded by mu.
	thawed chan struct{}
}

func newAgent(d *Driver, cfg runtime.Config, files *memFS) *agent {
	a := &agent{d: d, id: cfg.ID, token: cfg.AccessToken, env: cfg.Env, files: files,
		procs: newProcTable(), ln: newPipeListener(), stopped: make(chan struct{}), thawed: make(chan struct{})}
	close(a.thawed)
	a.srv = &http.Server{Handler: a.handler(), ReadHeaderTimeout: 30 * time.Second}
	go func() { _ = a.srv.Serve(a.ln) }()
	return a
}

func (a *agent) dial(ctx context.Context) (net.Conn, error) { return a.ln.dial(ctx) }

// shutdown breaks every connection and ends every process without an
// end event, as a sandbox's death or stop does.
func (a *agent) shutdown() {
	a.stopOnce.Do(func() {
		close(a.stopped)
		_ = a.srv.Close()
	})
}

func (a *agent) freeze() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.thawed = make(chan struct{})
}

func (a *agent) thaw() {
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-a.thawed:
	default:
		close(a.thawed)
	}
}

// handler is the agent's HTTP API: both Connect services, /health and
// /files, behind the frozen-sandbox gate and the access-token check.
func (a *agent) handler() http.Handler {
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(1 << 20)}
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(&processService{a: a}, opts...))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{a: a}, opts...))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /files", a.download)
	mux.HandleFunc("POST /files", a.upload)
	return a.gate(realagent.RequireToken(a.token, mux))
}

// gate holds requests while the sandbox is paused (its agent is frozen)
// and drops them when it stops.
func (a *agent) gate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		thawed := a.thawed
		a.mu.Unlock()
		select {
		case <-thawed:
		case <-a.stopped:
			panic(http.ErrAbortHandler)
		case <-r.Context().Done():
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Sign returns the v1 signature of a /files URL for path, op ("read" or
// "write") and user made with token, with an expiry when exp is not 0.
func Sign(path, op, user, token string, exp int64) string {
	e := ""
	if exp != 0 {
		e = strconv.FormatInt(exp, 10)
	}
	return agentproto.Signature(path, op, user, token, e)
}

func writeJSONError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}

// userOf resolves the user of a request: Authorization "Basic
// base64(NAME:)" on RPCs, ?username= on /files, else "user". Only "user"
// and "root" exist in a fake sandbox.
func userOf(name string) (string, error) {
	if name == "" {
		name = "user"
	}
	if name != "user" && name != "root" {
		return "", fmt.Errorf("invalid username: '%s'", name)
	}
	return name, nil
}

func rpcUser(h http.Header) (string, error) {
	name := ""
	if v := h.Get("Authorization"); v != "" {
		enc, ok := strings.CutPrefix(v, agentproto.UserAuthScheme)
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
		if !ok || err != nil {
			return "", connect.NewError(connect.CodeUnauthenticated, errors.New("invalid authorization header"))
		}
		name, _, _ = strings.Cut(string(raw), ":")
	}
	u, err := userOf(name)
	if err != nil {
		return "", connect.NewError(connect.CodeUnauthenticated, err)
	}
	return u, nil
}

func (a *agent) download(w http.ResponseWriter, r *http.Request) {
	u, err := userOf(r.URL.Query().Get("username"))
	if err != nil {
		writeJSONError(w, http.StatusUnauthorized, err.Error())
		return
	}
	p := resolve(r.URL.Query().Get("path"), u)
	e, ok := a.files.stat(p)
	switch {
	case !ok:
		writeJSONError(w, http.StatusNotFound, fmt.Sprintf("path '%s' does not exist", p))
	case e.dir:
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("path '%s' is a directory", p))
	default:
		w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(p)}))
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(e.data)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(e.data)
	}
}

// uploadResult is one element of the POST /files answer.
type uploadResult struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// upload serves POST /files: multipart (field "file"; the part's file
// name is the path unless ?path= is given) or a raw body to ?path=.
func (a *agent) upload(w http.ResponseWriter, r *http.Request) {
	u, err := userOf(r.URL.Query().Get("username"))
	if err != nil {
		writeJSONError(w, http.StatusUnauthorized, err.Error())
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxUpload)
	qpath := r.URL.Query().Get("path")
	var out []uploadResult
	put := func(p string, body io.Reader) bool {
		data, err := io.ReadAll(body)
		if err != nil {
			writeJSONError(w, http.StatusRequestEntityTooLarge, "request body too large")
			return false
		}
		p = resolve(p, u)
		if err := a.files.write(p, data, u); err != nil {
			writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("write '%s': %v", p, err))
			return false
		}
		out = append(out, uploadResult{Path: p, Name: path.Base(p), Type: "file"})
		return true
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt == "multipart/form-data" {
		mr := multipart.NewReader(r.Body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				writeJSONError(w, http.StatusBadRequest, "invalid multipart body: "+err.Error())
				return
			}
			if part.FormName() != "file" {
				continue
			}
			p := qpath
			if p == "" {
				p = part.FileName()
			}
			if p == "" {
				writeJSONError(w, http.StatusBadRequest, "no path: give ?path= or a file name")
				return
			}
			if !put(p, part) {
				return
			}
		}
	} else {
		if qpath == "" {
			writeJSONError(w, http.StatusBadRequest, "a raw upload needs ?path=")
			return
		}
		if !put(qpath, r.Body) {
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// filesystemService is the fake filesystem.Filesystem: Stat, MakeDir,
// Move, ListDir and Remove over the in-memory files; the watchers are
// unimplemented.
type filesystemService struct {
	filesystemconnect.UnimplementedFilesystemHandler
	a *agent
}

func (f *filesystemService) entry(p string) (*fspb.EntryInfo, bool) {
	e, ok := f.a.files.stat(p)
	if !ok {
		return nil, false
	}
	info := &fspb.EntryInfo{Name: path.Base(p), Path: p, Size: int64(len(e.data)), Mode: uint32(e.mode.Perm()),
		Permissions: e.mode.String(), Owner: e.owner, Group: e.owner, ModifiedTime: timestamppb.New(e.mtime),
		Type: fspb.FileType_FILE_TYPE_FILE}
	if e.dir {
		info.Type = fspb.FileType_FILE_TYPE_DIRECTORY
	}
	return info, true
}

func notExist(p string) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf("path '%s' does not exist", p))
}

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[fspb.StatRequest]) (*connect.Response[fspb.StatResponse], error) {
	u, err := rpcUser(req.Header())
	if err != nil {
		return nil, err
	}
	p := resolve(req.Msg.GetPath(), u)
	e, ok := f.entry(p)
	if !ok {
		return nil, notExist(p)
	}
	return connect.NewResponse(&fspb.StatResponse{Entry: e}), nil
}

func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[fspb.MakeDirRequest]) (*connect.Response[fspb.MakeDirResponse], error) {
	u, err := rpcUser(req.Header())
	if err != nil {
		return nil, err
	}
	p := resolve(req.Msg.GetPath(), u)
	if e, ok := f.a.files.stat(p); ok {
		if e.dir {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory '%s' already exists", p))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' already exists and is not a directory", p))
	}
	if err := f.a.files.mkdirAll(p, u); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("error creating directory '%s': %w", p, err))
	}
	e, _ := f.entry(p)
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: e}), nil
}

func (f *filesystemService) Move(ctx context.Context, req *connect.Request[fspb.MoveRequest]) (*connect.Response[fspb.MoveResponse], error) {
	u, err := rpcUser(req.Header())
	if err != nil {
		return nil, err
	}
	src, dst := resolve(req.Msg.GetSource(), u), resolve(req.Msg.GetDestination(), u)
	if err := f.a.files.move(src, dst, u); err != nil {
		if _, ok := f.a.files.stat(src); !ok {
			return nil, notExist(src)
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	e, _ := f.entry(dst)
	return connect.NewResponse(&fspb.MoveResponse{Entry: e}), nil
}

func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	u, err := rpcUser(req.Header())
	if err != nil {
		return nil, err
	}
	p := resolve(req.Msg.GetPath(), u)
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	paths, ok := f.a.files.list(p, depth)
	if !ok {
		if _, exists := f.a.files.stat(p); exists {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' is not a directory", p))
		}
		return nil, notExist(p)
	}
	resp := &fspb.ListDirResponse{}
	for _, q := range paths {
		if e, ok := f.entry(q); ok {
			resp.Entries = append(resp.Entries, e)
		}
	}
	return connect.NewResponse(resp), nil
}

func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[fspb.RemoveRequest]) (*connect.Response[fspb.RemoveResponse], error) {
	u, err := rpcUser(req.Header())
	if err != nil {
		return nil, err
	}
	p := resolve(req.Msg.GetPath(), u)
	if !f.a.files.remove(p) {
		return nil, notExist(p)
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}

// processService is the fake process.Process: Start and Connect stream
// scripted processes; List, SendInput, StreamInput, CloseStdin and
// SendSignal act on them; Update (PTY resize) is unimplemented.
type processService struct {
	processconnect.UnimplementedProcessHandler
	a *agent
}

func (ps *processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	u, err := rpcUser(req.Header())
	if err != nil {
		return err
	}
	cfg := req.Msg.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("empty command"))
	}
	cmd := Command{Sandbox: ps.a.id, Cmd: cfg.GetCmd(), Args: append([]string(nil), cfg.GetArgs()...),
		Env: map[string]string{}, Cwd: cfg.GetCwd(), User: u, Tag: req.Msg.GetTag()}
	for k, v := range ps.a.env {
		cmd.Env[k] = v
	}
	for k, v := range cfg.GetEnvs() {
		cmd.Env[k] = v
	}
	if cwd := cwdOf(cmd); cmd.Cwd != "" {
		if e, ok := ps.a.files.stat(cwd); !ok || !e.dir {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd '%s' does not exist", cwd))
		}
	}
	res := ps.a.d.answer(cmd, ps.a.files)
	withStdin := req.Msg.Stdin == nil || req.Msg.GetStdin()
	p := ps.a.procs.start(cmd, cfg, withStdin)
	go p.run(res, ps.a.stopped)
	_, lifetime := ctx.Deadline()
	if dl, ok := ctx.Deadline(); ok {
		t := time.AfterFunc(time.Until(dl), func() { p.terminate(killTimeout) })
		defer t.Stop()
	}
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.StartResponse{Event: ev}) }
	return ps.a.stream(ctx, p, lifetime, true, send)
}

func startEvent(pid uint32) *pb.ProcessEvent {
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: pid}}}
}

// stream sends p's start event, its output (from the start when
// fromStart, else only what comes next) and its end event. A deadline
// that is the process's lifetime does not end the stream: the process is
// killed at it and its end event still goes out.
func (a *agent) stream(ctx context.Context, p *fproc, lifetime, fromStart bool, send func(*pb.ProcessEvent) error) error {
	if err := send(startEvent(p.pid)); err != nil {
		return err
	}
	next := 0
	if !fromStart {
		p.mu.Lock()
		next = len(p.out)
		p.mu.Unlock()
	}
	done := ctx.Done()
	for {
		p.mu.Lock()
		evs := p.out[next:]
		next = len(p.out)
		end, wake := p.end, p.wake
		p.mu.Unlock()
		for _, ev := range evs {
			if err := send(ev); err != nil {
				return err
			}
		}
		if end != nil {
			return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}})
		}
		select {
		case <-wake:
		case <-a.stopped:
			return connect.NewError(connect.CodeUnavailable, errors.New("the sandbox stopped"))
		case <-done:
			if lifetime && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				done = nil
				continue
			}
			return ctx.Err()
		}
	}
}

func (ps *processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p := ps.a.procs.find(req.Msg.GetProcess())
	if p == nil {
		return connect.NewError(connect.CodeNotFound, errors.New("process not found"))
	}
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.ConnectResponse{Event: ev}) }
	return ps.a.stream(ctx, p, false, false, send)
}

func (ps *processService) List(ctx context.Context, req *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	resp := &pb.ListResponse{}
	for _, p := range ps.a.procs.running() {
		info := &pb.ProcessInfo{Config: p.config, Pid: p.pid}
		if p.cmd.Tag != "" {
			tag := p.cmd.Tag
			info.Tag = &tag
		}
		resp.Processes = append(resp.Processes, info)
	}
	return connect.NewResponse(resp), nil
}

func (ps *processService) find(sel *pb.ProcessSelector) (*fproc, error) {
	p := ps.a.procs.find(sel)
	if p == nil || p.ended() {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("process not found"))
	}
	return p, nil
}

func (ps *processService) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.input(req.Msg.GetInput().GetStdin()); err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (ps *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var p *fproc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			found, err := ps.find(ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			p = found
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("first message must be start"))
			}
			if err := p.input(ev.Data.GetInput().GetStdin()); err != nil {
				return nil, connect.NewError(connect.CodeInternal, err)
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

func (ps *processService) CloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.closeStdin(); err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

func (ps *processService) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		p.terminate(killSignal)
	case pb.Signal_SIGNAL_SIGTERM:
		p.terminate(termSignal)
	default:
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("invalid signal: "+req.Msg.GetSignal().String()))
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

// pipeListener is an in-memory net.Listener: dial hands the server one
// end of a net.Pipe.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

func (l *pipeListener) dial(ctx context.Context) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
	case <-ctx.Done():
	}
	client.Close()
	server.Close()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return nil, errors.New("dial agent: connection refused")
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "fake-agent" }
