package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/corralhq/corral/proto/filesystem/filesystemconnect"
	pb "github.com/corralhq/corral/proto/process"
	"github.com/corralhq/corral/proto/process/processconnect"
)

// testEnv is an agent served over real HTTP with real Connect clients. The
// only user is "root" (uid 0) whose home is a temp directory, so relative
// paths stay inside the test's directory.
type testEnv struct {
	srv  *Server
	url  string
	http *http.Client
	home string
	proc processconnect.ProcessClient
	fs   filesystemconnect.FilesystemClient
}

func newTestEnv(t testing.TB, mod func(*Config)) *testEnv {
	t.Helper()
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	passwd := filepath.Join(dir, "passwd")
	group := filepath.Join(dir, "group")
	alt := filepath.Join(dir, "alt")
	if err := os.Mkdir(alt, 0o755); err != nil {
		t.Fatal(err)
	}
	// "alt" is uid 0 too (tests run as root and must not drop privileges
	// into unknown uids) but has its own home, to tell users apart.
	// "owner" (uid 4321) is only used for file operations, never to run
	// processes.
	writeFile(t, passwd, "root:x:0:0:root:"+home+":/bin/sh\nalt:x:0:0::"+alt+":/bin/sh\nowner:x:4321:4321::"+home+"/owner:/bin/sh\n")
	writeFile(t, group, "root:x:0:\nowners:x:4321:\n")
	// "owner" works with its own file-system identity: it must be able to
	// traverse to its home and read the account files.
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(home, "owner"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(home, "owner"), 4321, 4321); err != nil {
		t.Fatal(err)
	}
	cfg := Config{DefaultUser: "root", Subreaper: true, PasswdFile: passwd, GroupFile: group, Env: []string{}}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Serve on a unix socket, as in a sandbox, with small kernel buffers.
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		tr.CloseIdleConnections()
	})
	hc := &http.Client{Transport: &headerRT{base: tr}}
	const base = "http://agent"
	return &testEnv{
		srv:  s,
		url:  base,
		http: hc,
		home: home,
		proc: processconnect.NewProcessClient(hc, base),
		fs:   filesystemconnect.NewFilesystemClient(hc, base),
	}
}

func writeFile(t testing.TB, p, content string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// headerRT adds headers carried in the request context: connect-go
// clients drop user-set protocol headers such as Connect-Timeout-Ms, so the
// tests set them at the transport.
type headerRT struct{ base http.RoundTripper }

type ctxHeaders struct{}

func withHeader(ctx context.Context, k, v string) context.Context {
	h, _ := ctx.Value(ctxHeaders{}).(http.Header)
	h = h.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Set(k, v)
	return context.WithValue(ctx, ctxHeaders{}, h)
}

func (rt *headerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if h, ok := r.Context().Value(ctxHeaders{}).(http.Header); ok {
		r = r.Clone(r.Context())
		for k, vs := range h {
			r.Header[k] = vs
		}
	}
	return rt.base.RoundTrip(r)
}

// result is the collected outcome of a process stream.
type result struct {
	pid        uint32
	stdout     []byte
	stderr     []byte
	pty        []byte
	keepalives int
	end        *pb.ProcessEvent_EndEvent
}

// collect reads a Start or Connect stream, from its start event, to its end.
func collect[T interface{ GetEvent() *pb.ProcessEvent }](t *testing.T, st interface {
	Receive() bool
	Msg() T
	Err() error
}) result {
	t.Helper()
	return collectFrom(t, st, true)
}

// collectFrom is collect; withStart false means the start event was
// already consumed.
func collectFrom[T interface{ GetEvent() *pb.ProcessEvent }](t *testing.T, st interface {
	Receive() bool
	Msg() T
	Err() error
}, withStart bool) result {
	t.Helper()
	var r result
	first := withStart
	for st.Receive() {
		ev := st.Msg().GetEvent()
		if first {
			if ev.GetStart() == nil {
				t.Fatalf("first event is not start: %v", ev)
			}
			r.pid = ev.GetStart().GetPid()
			first = false
			continue
		}
		switch {
		case ev.GetData() != nil:
			d := ev.GetData()
			r.stdout = append(r.stdout, d.GetStdout()...)
			r.stderr = append(r.stderr, d.GetStderr()...)
			r.pty = append(r.pty, d.GetPty()...)
		case ev.GetKeepalive() != nil:
			r.keepalives++
		case ev.GetEnd() != nil:
			if r.end != nil {
				t.Fatalf("second end event")
			}
			r.end = ev.GetEnd()
		default:
			t.Fatalf("unexpected event %v", ev)
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream error: %v", err)
	}
	if r.end == nil {
		t.Fatalf("stream ended without end event")
	}
	return r
}

func startReq(cmd string, args ...string) *connect.Request[pb.StartRequest] {
	return connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: cmd, Args: args}})
}

// run starts a command and collects its stream.
func (e *testEnv) run(t *testing.T, ctx context.Context, req *connect.Request[pb.StartRequest]) result {
	t.Helper()
	st, err := e.proc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	return collect[*pb.StartResponse](t, st)
}

// startWait starts a command and returns the open stream after its start
// event.
func (e *testEnv) startWait(t *testing.T, ctx context.Context, req *connect.Request[pb.StartRequest]) (*connect.ServerStreamForClient[pb.StartResponse], uint32) {
	t.Helper()
	st, err := e.proc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() {
		t.Fatalf("no start event: %v", st.Err())
	}
	pid := st.Msg().GetEvent().GetStart().GetPid()
	if pid == 0 {
		t.Fatalf("first event not start: %v", st.Msg())
	}
	return st, pid
}

func sel(pid uint32) *pb.ProcessSelector {
	return &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
}

func (e *testEnv) kill(pid uint32) {
	_, _ = e.proc.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{Process: sel(pid), Signal: pb.Signal_SIGNAL_SIGKILL}))
}

// wantCode asserts err is a Connect error with code and message substring.
func wantCode(t *testing.T, err error, code connect.Code, msg string) {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Fatalf("want %v error %q, got %v", code, msg, err)
	}
	if ce.Code() != code || !strings.Contains(ce.Message(), msg) {
		t.Fatalf("want %v %q, got %v %q", code, msg, ce.Code(), ce.Message())
	}
}

// eventually polls cond until it holds or d passes.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cond()
}
