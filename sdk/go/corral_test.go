package corral

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/corralhq/corral/proto/process"
	"github.com/corralhq/corral/proto/process/processconnect"
)

const testKey = "k3y"

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

const sbJSON = `{"id":"sbabc","template":"base","runtime":"runc","state":"running","tier":"light",
"resources":{"cpu":0.5,"memory_mb":256,"disk_mb":100,"pids":256,"nofile":1024},"command_timeout":30,
"network":"none","metadata":{"k":"v"},"created_at":"2026-11-30T21:00:00.123Z",
"expires_at":"2026-11-30T21:05:00.123Z","ended_at":null,"end_reason":""}`

func TestRESTRequestsAndDecoding(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-API-Key") != testKey {
			writeJSON(w, 401, map[string]string{"code": "unauthenticated", "message": "bad key"})
			return
		}
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.RequestURI()+" "+strings.TrimSpace(string(body)))
		mu.Unlock()
		switch {
		case r.Method == "POST" && r.URL.Path == "/v1/sandboxes":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(201)
			io.WriteString(w, sbJSON)
		case r.Method == "GET" && r.URL.Path == "/v1/sandboxes":
			io.WriteString(w, `{"sandboxes":[`+sbJSON+`]}`)
		case r.URL.Path == "/v1/sandboxes/sbabc/timeout", r.Method == "GET" && r.URL.Path == "/v1/sandboxes/sbabc":
			io.WriteString(w, sbJSON)
		case r.Method == "DELETE" && r.URL.Path == "/v1/sandboxes/sbabc":
			io.WriteString(w, strings.Replace(strings.Replace(sbJSON, `"running"`, `"ended"`, 1),
				`"ended_at":null,"end_reason":""`, `"ended_at":"2026-11-30T21:01:00Z","end_reason":"killed"`, 1))
		case r.URL.Path == "/v1/sandboxes/sbabc/exec":
			io.WriteString(w, `{"exit_code":124,"stdout":"x","stderr":"","stdout_bytes":5,"stderr_bytes":0,"truncated":true,"timed_out":true,"end_reason":"timeout","duration_ms":1500}`)
		case r.URL.Path == "/v1/sandboxes/full":
			w.Header().Set("Retry-After", "7")
			writeJSON(w, 429, map[string]string{"code": "capacity_exceeded", "message": "too many"})
		default:
			writeJSON(w, 404, map[string]string{"code": "not_found", "message": "no such sandbox"})
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	c := New(srv.URL+"/", testKey)

	sb, err := c.Create(ctx, CreateOptions{
		Tier: "light", Resources: Resources{MemoryMB: 256, CPU: 0.5}, Timeout: 90500 * time.Millisecond,
		Metadata: map[string]string{"k": "v"}, Network: "none",
	})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != "sbabc" || sb.CommandTimeout != 30*time.Second || sb.Resources.MemoryMB != 256 ||
		sb.EndedAt != nil || sb.Metadata["k"] != "v" || !sb.Running() ||
		!sb.ExpiresAt.Equal(time.Date(2026, 11, 30, 21, 5, 0, 123e6, time.UTC)) {
		t.Fatalf("decoded %+v", sb)
	}
	// Round trip of the JSON form.
	b, _ := json.Marshal(sb)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	if m["id"] != "sbabc" || m["command_timeout"] != 30.0 || m["ended_at"] != nil {
		t.Fatalf("marshal: %s", b)
	}

	list, err := c.List(ctx, ListOptions{State: "all", Metadata: map[string]string{"k": "v"}})
	if err != nil || len(list) != 1 || list[0].client != c {
		t.Fatalf("list %v %v", list, err)
	}
	if err := sb.SetTimeout(ctx, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := sb.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if sb.State != StateEnded || sb.EndReason != "killed" || sb.EndedAt == nil || sb.client != c {
		t.Fatalf("after kill %+v", sb)
	}
	res, err := c.Exec(ctx, "sbabc", ExecRequest{Cmd: []string{"sleep", "9"}, Stdin: []byte("hi"), Timeout: NoTimeout})
	if err != nil || res.ExitCode != 124 || !res.TimedOut || res.EndReason != "timeout" || res.Duration() != 1500*time.Millisecond {
		t.Fatalf("exec %+v %v", res, err)
	}

	want := []string{
		`POST /v1/sandboxes {"tier":"light","resources":{"cpu":0.5,"memory_mb":256},"timeout":91,"metadata":{"k":"v"},"network":"none"}`,
		`GET /v1/sandboxes?metadata.k=v&state=all `,
		`POST /v1/sandboxes/sbabc/timeout {"timeout":600}`,
		`DELETE /v1/sandboxes/sbabc `,
		`POST /v1/sandboxes/sbabc/exec {"cmd":["sleep","9"],"stdin":"aGk=","timeout":0}`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	_, err = c.Get(ctx, "nope")
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 404 || ae.Code != "not_found" || ae.Message != "no such sandbox" {
		t.Fatalf("get unknown: %#v", err)
	}
	if !IsNotFound(err) || !errors.Is(err, ErrNotFound) || errors.Is(err, ErrConflict) {
		t.Fatalf("helpers on %v", err)
	}
	_, err = c.Get(ctx, "full")
	if !IsCapacityExceeded(err) || !errors.As(err, &ae) || ae.RetryAfter != 7*time.Second {
		t.Fatalf("capacity: %#v", err)
	}
	// The hint is in the text a CLI or a log shows.
	if err.Error() != "too many (capacity_exceeded, retry after 7s)" {
		t.Fatalf("capacity error text %q", err.Error())
	}
	_, err = New(srv.URL, "wrong").List(ctx, ListOptions{})
	if !IsUnauthenticated(err) || err.Error() != "bad key (unauthenticated)" {
		t.Fatalf("auth: %v", err)
	}
}

func TestDecodeErrorBody(t *testing.T) {
	for _, tc := range []struct {
		status     int
		body       string
		wantStatus int
		code, msg  string
	}{
		{404, `{"code":"not_found","message":"x"}`, 404, "not_found", "x"},
		{404, `{"code":404,"message":"path '/a' does not exist"}`, 404, "not_found", "path '/a' does not exist"},
		{400, `{"code":400,"message":"is a directory"}`, 400, "invalid_argument", "is a directory"},
		{507, `{"code":507,"message":"full"}`, 507, "not_enough_space", "full"},
		{502, `bad gateway`, 502, "unavailable", "bad gateway"},
		{500, ``, 500, "internal", ""},
	} {
		ae := decodeErrorBody(tc.status, http.Header{}, []byte(tc.body))
		if ae.Status != tc.wantStatus || ae.Code != tc.code || ae.Message != tc.msg {
			t.Errorf("%d %q: got %+v", tc.status, tc.body, ae)
		}
	}
}

func TestApplyEnd(t *testing.T) {
	s := func(v string) *string { return &v }
	for _, tc := range []struct {
		name   string
		end    *process.ProcessEvent_EndEvent
		code   int
		reason string
	}{
		{"ok", &process.ProcessEvent_EndEvent{Exited: true, Status: "exit status 0"}, 0, ""},
		{"exit3", &process.ProcessEvent_EndEvent{ExitCode: 3, Exited: true, Status: "exit status 3", Error: s("exit status 3")}, 3, ""},
		{"sigkill", &process.ProcessEvent_EndEvent{ExitCode: -1, Status: "signal: killed", Error: s("signal: killed")}, 137, ""},
		{"oom", &process.ProcessEvent_EndEvent{ExitCode: -1, Status: "signal: killed", EndReason: "oom"}, 137, "oom"},
		{"segv", &process.ProcessEvent_EndEvent{ExitCode: -1, Status: "signal: segmentation fault (core dumped)"}, 139, ""},
		{"term", &process.ProcessEvent_EndEvent{ExitCode: -1, Status: "signal: terminated"}, 143, ""},
		{"rt", &process.ProcessEvent_EndEvent{ExitCode: -1, Status: "signal: signal 34"}, 162, ""},
		{"timeout", &process.ProcessEvent_EndEvent{ExitCode: -1, Status: "signal: killed", TimedOut: true}, 124, "timeout"},
		{"killed-nostatus", &process.ProcessEvent_EndEvent{ExitCode: -1, EndReason: "killed"}, 137, "killed"},
	} {
		var r CommandResult
		applyEnd(&r, tc.end)
		if r.ExitCode != tc.code || r.EndReason != tc.reason {
			t.Errorf("%s: got exit %d reason %q", tc.name, r.ExitCode, r.EndReason)
		}
	}
}

// fakeProcess is a Process service that scripts the events of Start.
type fakeProcess struct {
	processconnect.UnimplementedProcessHandler
	mu        sync.Mutex
	headers   http.Header
	req       *process.StartRequest
	stdin     bytes.Buffer
	chunks    []int
	closed    chan struct{}
	events    []*process.ProcessEvent
	waitStdin bool
	// hold, when set, keeps the stream open after the events until it
	// is closed.
	hold chan struct{}
}

func (f *fakeProcess) Start(ctx context.Context, req *connect.Request[process.StartRequest], st *connect.ServerStream[process.StartResponse]) error {
	f.mu.Lock()
	f.headers = req.Header().Clone()
	f.req = req.Msg
	f.mu.Unlock()
	if err := st.Send(&process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: 42}}}}); err != nil {
		return err
	}
	if f.waitStdin {
		select {
		case <-f.closed:
		case <-ctx.Done():
			return ctx.Err()
		}
		f.mu.Lock()
		data := append([]byte(nil), f.stdin.Bytes()...)
		f.mu.Unlock()
		st.Send(&process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: data}}}}})
	}
	for _, ev := range f.events {
		if err := st.Send(&process.StartResponse{Event: ev}); err != nil {
			return err
		}
	}
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-ctx.Done():
		}
	}
	return nil
}

func (f *fakeProcess) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	if req.Msg.GetProcess().GetPid() != 42 {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("process with pid 1 not found"))
	}
	f.mu.Lock()
	f.stdin.Write(req.Msg.GetInput().GetStdin())
	f.chunks = append(f.chunks, len(req.Msg.GetInput().GetStdin()))
	f.mu.Unlock()
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func (f *fakeProcess) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	close(f.closed)
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

func (f *fakeProcess) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	return nil, connect.NewError(connect.CodeNotFound, errors.New("process with pid 7 not found"))
}

func dataEv(stdout, stderr string) *process.ProcessEvent {
	d := &process.ProcessEvent_DataEvent{}
	if stdout != "" {
		d.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: []byte(stdout)}
	} else {
		d.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: []byte(stderr)}
	}
	return &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}}
}

func endEv(e *process.ProcessEvent_EndEvent) *process.ProcessEvent {
	return &process.ProcessEvent{Event: &process.ProcessEvent_End{End: e}}
}

func agentServer(t *testing.T, fp *fakeProcess, sandboxJSON string) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	path, h := processconnect.NewProcessHandler(fp)
	mux.Handle("/v1/sandboxes/sbabc/agent"+path, http.StripPrefix("/v1/sandboxes/sbabc/agent", h))
	mux.HandleFunc("GET /v1/sandboxes/sbabc", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, sandboxJSON)
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-API-Key") != testKey {
			writeJSON(w, 401, map[string]string{"code": "unauthenticated", "message": "bad key"})
			return
		}
		if strings.HasPrefix(r.URL.Path, "/v1/sandboxes/gone/") {
			writeJSON(w, 404, map[string]string{"code": "not_found", "message": "sandbox gone not found"})
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestRunStreamsAndMapsExit(t *testing.T) {
	fp := &fakeProcess{events: []*process.ProcessEvent{
		dataEv("hello ", ""), dataEv("", "oops"), dataEv("world", ""),
		endEv(&process.ProcessEvent_EndEvent{ExitCode: -1, Status: "signal: killed", TimedOut: true, EndReason: "timeout"}),
	}}
	srv := agentServer(t, fp, sbJSON)
	sb := New(srv.URL, testKey).Sandbox("sbabc")
	var out, errOut bytes.Buffer
	res, err := sb.Run(context.Background(), "python3", RunOptions{
		Args: []string{"-c", "x"}, Cwd: "/tmp", Env: map[string]string{"A": "1"}, User: "root",
		Timeout: 2500 * time.Millisecond, MaxOutput: 4,
		OnStdout: func(b []byte) { out.Write(b) }, OnStderr: func(b []byte) { errOut.Write(b) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != "hello world" || errOut.String() != "oops" {
		t.Fatalf("streamed %q %q", out.String(), errOut.String())
	}
	if res.ExitCode != 124 || !res.TimedOut || res.EndReason != "timeout" || res.PID != 42 ||
		res.Stdout != "orld" || res.StdoutBytes != 11 || res.Stderr != "oops" || !res.Truncated {
		t.Fatalf("result %+v", res)
	}
	if got := fp.headers.Get("Connect-Timeout-Ms"); got != "2500" {
		t.Errorf("Connect-Timeout-Ms %q", got)
	}
	if got := fp.headers.Get("Authorization"); got != "Basic "+base64.StdEncoding.EncodeToString([]byte("root:")) {
		t.Errorf("Authorization %q", got)
	}
	p := fp.req.GetProcess()
	if p.GetCmd() != "python3" || strings.Join(p.GetArgs(), " ") != "-c x" || p.GetCwd() != "/tmp" ||
		p.GetEnvs()["A"] != "1" || fp.req.Stdin == nil || fp.req.GetStdin() {
		t.Fatalf("start request %v", fp.req)
	}

	// Shell form, no timeout header, normal exit code.
	fp2 := &fakeProcess{events: []*process.ProcessEvent{endEv(&process.ProcessEvent_EndEvent{ExitCode: 3, Exited: true, Status: "exit status 3"})}}
	sb2 := New(agentServer(t, fp2, sbJSON).URL, testKey).Sandbox("sbabc")
	res, err = sb2.Run(context.Background(), "exit 3", RunOptions{})
	if err != nil || res.ExitCode != 3 || res.EndReason != "" {
		t.Fatalf("exit 3: %+v %v", res, err)
	}
	if fp2.headers.Get("Connect-Timeout-Ms") != "" || fp2.headers.Get("Authorization") != "" {
		t.Errorf("unexpected headers %v", fp2.headers)
	}
	if p := fp2.req.GetProcess(); p.GetCmd() != "/bin/bash" || strings.Join(p.GetArgs(), "|") != "-l|-c|exit 3" || p.Cwd != nil {
		t.Errorf("shell form %v", p)
	}
}

// TestRunReturnsAtEndEvent defends against a command's answer waiting
// for work the server does after the command ended: Run returns the
// result as soon as the end event arrives, while the stream's own end is
// still to come (the server records the command after sending its end
// event), and reads the rest of the stream after.
func TestRunReturnsAtEndEvent(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold)
	fp := &fakeProcess{hold: hold, events: []*process.ProcessEvent{
		dataEv("out", ""), endEv(&process.ProcessEvent_EndEvent{ExitCode: 0, Exited: true, Status: "exit status 0"}),
	}}
	sb := New(agentServer(t, fp, sbJSON).URL, testKey).Sandbox("sbabc")
	type result struct {
		res *CommandResult
		err error
	}
	got := make(chan result, 1)
	go func() {
		res, err := sb.Run(context.Background(), "true", RunOptions{})
		got <- result{res, err}
	}()
	select {
	case r := <-got:
		if r.err != nil || r.res.ExitCode != 0 || r.res.Stdout != "out" || r.res.Status != "exit status 0" {
			t.Fatalf("result %+v, %v", r.res, r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return at the end event: it waited for the end of the stream")
	}
}

func TestRunStdin(t *testing.T) {
	fp := &fakeProcess{waitStdin: true, closed: make(chan struct{}), events: []*process.ProcessEvent{
		endEv(&process.ProcessEvent_EndEvent{Exited: true, Status: "exit status 0"}),
	}}
	sb := New(agentServer(t, fp, sbJSON).URL, testKey).Sandbox("sbabc")
	in := bytes.Repeat([]byte("0123456789abcdef"), 10000) // 160000 bytes
	res, err := sb.Run(context.Background(), "cat", RunOptions{Args: []string{}, Stdin: bytes.NewReader(in), MaxOutput: -1})
	if err != nil {
		t.Fatal(err)
	}
	if res.StdoutBytes != int64(len(in)) || res.Stdout != "" || !fp.req.GetStdin() {
		t.Fatalf("stdin result %+v", res)
	}
	for _, n := range fp.chunks {
		if n > 64<<10 {
			t.Fatalf("chunk of %d bytes", n)
		}
	}
	if !bytes.Equal(fp.stdin.Bytes(), in) {
		t.Fatal("stdin content differs")
	}
}

func TestRunStreamBrokenReportsSandboxEnd(t *testing.T) {
	fp := &fakeProcess{events: []*process.ProcessEvent{dataEv("partial", "")}} // no end event
	ended := strings.Replace(strings.Replace(sbJSON, `"running"`, `"ended"`, 1), `"end_reason":""`, `"end_reason":"oom"`, 1)
	sb := New(agentServer(t, fp, ended).URL, testKey).Sandbox("sbabc")
	res, err := sb.Run(context.Background(), "x", RunOptions{})
	if err == nil || res == nil || res.EndReason != "oom" || res.ExitCode != 137 || res.Stdout != "partial" {
		t.Fatalf("broken stream: %+v %v", res, err)
	}
}

func TestAgentErrors(t *testing.T) {
	fp := &fakeProcess{}
	srv := agentServer(t, fp, sbJSON)
	c := New(srv.URL, testKey)
	ctx := context.Background()
	// The REST proxy's JSON error wins over Connect's status-derived code.
	_, err := c.Sandbox("gone").Run(ctx, "true", RunOptions{})
	if !IsNotFound(err) || !strings.Contains(err.Error(), "sandbox gone not found") {
		t.Fatalf("stream on gone sandbox: %v", err)
	}
	if err := c.Sandbox("gone").KillProcess(ctx, 1); !IsNotFound(err) {
		t.Fatalf("unary on gone sandbox: %v", err)
	}
	// A Connect error from the agent itself.
	err = c.Sandbox("sbabc").KillProcess(ctx, 7)
	var ae *APIError
	var ce *connect.Error
	if !errors.As(err, &ae) || ae.Code != "not_found" || ae.Status != 404 || !errors.As(err, &ce) {
		t.Fatalf("agent error: %#v", err)
	}
	_, err = New(srv.URL, "bad").Sandbox("sbabc").Run(ctx, "true", RunOptions{})
	if !IsUnauthenticated(err) {
		t.Fatalf("bad key: %v", err)
	}
}

func TestFilesHTTP(t *testing.T) {
	var gotQuery, gotCT string
	var gotBody []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/sandboxes/sbabc/agent/files" || r.Header.Get("X-API-Key") != testKey {
			writeJSON(w, 404, map[string]string{"code": "not_found", "message": "?"})
			return
		}
		gotQuery = r.URL.RawQuery
		switch r.Method {
		case "POST":
			gotCT = r.Header.Get("Content-Type")
			gotBody, _ = io.ReadAll(r.Body)
			writeJSON(w, 200, []map[string]string{{"path": "/home/user/a", "name": "a", "type": "file"}})
		case "GET":
			switch r.URL.Query().Get("path") {
			case "missing":
				writeJSON(w, 404, map[string]any{"code": 404, "message": "path 'missing' does not exist"})
			case "big":
				w.Write(bytes.Repeat([]byte("x"), 100))
			default:
				io.WriteString(w, "content")
			}
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	fs := New(srv.URL, testKey).Sandbox("sbabc").Files().WithUser("root")
	if err := fs.Write(ctx, "dir/a b", []byte("data")); err != nil {
		t.Fatal(err)
	}
	if gotQuery != "path=dir%2Fa+b&username=root" || gotCT != "application/octet-stream" || string(gotBody) != "data" {
		t.Fatalf("upload %q %q %q", gotQuery, gotCT, gotBody)
	}
	b, err := fs.Read(ctx, "a")
	if err != nil || string(b) != "content" {
		t.Fatalf("read %q %v", b, err)
	}
	_, err = fs.Read(ctx, "missing")
	if !IsNotFound(err) || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("missing: %v", err)
	}
	small := *fs
	small.MaxReadSize = 10
	if _, err := small.Read(ctx, "big"); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("big: %v", err)
	}
	var buf bytes.Buffer
	if n, err := fs.Download(ctx, "big", &buf); err != nil || n != 100 {
		t.Fatalf("download %d %v", n, err)
	}
}

func TestLocalAdminKey(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "admin.key"), []byte("secret\n"), 0o600)
	if k, err := LocalAdminKey("http://127.0.0.1:7420", dir); err != nil || k != "secret" {
		t.Fatalf("%q %v", k, err)
	}
	if k, err := LocalAdminKey("http://localhost:1", dir); err != nil || k != "secret" {
		t.Fatalf("%q %v", k, err)
	}
	if _, err := LocalAdminKey("http://example.com:7420", dir); err == nil {
		t.Fatal("remote server must not use the local key")
	}
	if _, err := LocalAdminKey("http://127.0.0.1:7420", t.TempDir()); err == nil {
		t.Fatal("missing key file")
	}
	t.Setenv("CORRAL_URL", "http://127.0.0.1:9")
	t.Setenv("CORRAL_API_KEY", "")
	t.Setenv("CORRAL_DATA", dir)
	c, err := NewFromEnv()
	if err != nil || c.apiKey != "secret" || c.BaseURL() != "http://127.0.0.1:9" {
		t.Fatalf("from env: %v", err)
	}
}
