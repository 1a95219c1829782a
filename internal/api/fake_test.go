package api_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/corralhq/corral/internal/api"
	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/runtime/runtimetest"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template/registry/registrytest"
	pb "github.com/corralhq/corral/proto/process"
	"github.com/corralhq/corral/proto/process/processconnect"
)

const apiKey = "e2b_test_key_0123456789"

// env is an API server over a Manager with the fake runtime driver and a
// real SQLite store, served by httptest: no root, no runc, no network.
type env struct {
	t   *testing.T
	st  *store.Store
	d   *runtimetest.Driver
	m   *sandbox.Manager
	srv *httptest.Server
}

func newEnv(t *testing.T, maxSandboxes int, opts ...func(*sandbox.Config)) *env {
	t.Helper()
	return newEnvDriver(t, maxSandboxes, nil, opts...)
}

// newEnvDriver is newEnv whose Manager runs on wrap(the fake driver)
// (wrap nil: the fake driver itself).
func newEnvDriver(t *testing.T, maxSandboxes int, wrap func(*runtimetest.Driver) runtime.Driver, opts ...func(*sandbox.Config)) *env {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.AddAPIKey(context.Background(), "admin", apiKey, "", "admin"); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	d := runtimetest.New()
	reg, _ := registrytest.New(t, st)
	mc := sandbox.Config{
		WatchInterval: 20 * time.Millisecond, KillGrace: time.Millisecond,
		SnapshotDir: filepath.Join(t.TempDir(), "snapshots"), MemoryPressure: func() bool { return false },
		Admission: govern.NewAdmission(govern.AdmissionConfig{MaxConcurrent: maxSandboxes, MaxPerAgent: maxSandboxes,
			AgentRate: 1000, AgentBurst: 1000}),
	}
	for _, o := range opts {
		o(&mc)
	}
	var drv runtime.Driver = d
	if wrap != nil {
		drv = wrap(d)
	}
	m := sandbox.New(mc, st, drv, reg, log)
	if err := m.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.Config{Templates: reg}, m, st, log))
	t.Cleanup(func() {
		srv.Close()
		m.Shutdown(context.Background(), true)
		st.Close()
	})
	return &env{t: t, st: st, d: d, m: m, srv: srv}
}

// call sends a request with the API key (unless key is "") and decodes
// a JSON answer into out (when not nil); it returns the status.
func (e *env) call(method, path, key string, body any, out any, hdr ...string) int {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		data, _ := json.Marshal(b)
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			e.t.Fatalf("%s %s: %d %q: %v", method, path, resp.StatusCode, data, err)
		}
	}
	return resp.StatusCode
}

type sandboxView struct {
	ID        string `json:"id"`
	State     string `json:"state"`
	Tier      string `json:"tier"`
	EndReason string `json:"end_reason"`
}

type apiErr struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *env) createNative(body any) sandboxView {
	e.t.Helper()
	var v sandboxView
	if st := e.call("POST", "/v1/sandboxes", apiKey, body, &v); st != http.StatusCreated || v.ID == "" {
		e.t.Fatalf("create: %d %+v", st, v)
	}
	return v
}

// TestNativeLifecycle: create, get, list and kill over the native API,
// asserted on the answers and on the record and the driver.
func TestNativeLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10)
	v := e.createNative(map[string]any{"tier": "medium", "metadata": map[string]string{"team": "a"}})
	if v.State != "running" || v.Tier != "medium" {
		t.Fatalf("created %+v", v)
	}
	var got sandboxView
	if st := e.call("GET", "/v1/sandboxes/"+v.ID, apiKey, nil, &got); st != http.StatusOK || got.ID != v.ID || got.State != "running" {
		t.Fatalf("get: %d %+v", st, got)
	}
	var list struct {
		Sandboxes []sandboxView `json:"sandboxes"`
	}
	if st := e.call("GET", "/v1/sandboxes", apiKey, nil, &list); st != http.StatusOK || len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != v.ID {
		t.Fatalf("list: %d %+v", st, list)
	}
	var killed sandboxView
	if st := e.call("DELETE", "/v1/sandboxes/"+v.ID, apiKey, nil, &killed); st != http.StatusOK || killed.State != "ended" || killed.EndReason != "killed" {
		t.Fatalf("kill: %d %+v", st, killed)
	}
	if ids, _ := e.d.List(context.Background()); len(ids) != 0 {
		t.Fatalf("the driver still holds %v", ids)
	}
	var ae apiErr
	if st := e.call("DELETE", "/v1/sandboxes/"+v.ID, apiKey, nil, &ae); st != http.StatusNotFound || ae.Code != api.CodeNotFound {
		t.Fatalf("second kill: %d %+v", st, ae)
	}
}

// TestNativeErrors: refusals answer their status and stable code, and a
// refused create records and starts nothing.
func TestNativeErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cases := []struct {
		name, method, path, key string
		body                    any
		status                  int
		code                    string
	}{
		{"no key", "GET", "/v1/sandboxes", "", nil, 401, api.CodeUnauthenticated},
		{"wrong key", "GET", "/v1/sandboxes", "nope", nil, 401, api.CodeUnauthenticated},
		{"bad tier", "POST", "/v1/sandboxes", apiKey, `{"tier":"huge"}`, 400, api.CodeInvalidArgument},
		{"bad template", "POST", "/v1/sandboxes", apiKey, `{"template":"nosuch"}`, 400, api.CodeInvalidArgument},
		{"no network here", "POST", "/v1/sandboxes", apiKey, `{"network":"all-public"}`, 503, api.CodeNetworkUnavailable},
		{"unknown sandbox", "GET", "/v1/sandboxes/nosuchsandbox", apiKey, nil, 404, api.CodeNotFound},
		{"exec in unknown", "POST", "/v1/sandboxes/nosuchsandbox/exec", apiKey, `{"command":"echo"}`, 404, api.CodeNotFound},
		{"no route", "GET", "/v1/nothing", apiKey, nil, 404, api.CodeNotFound},
	}
	for _, c := range cases {
		var ae apiErr
		if st := e.call(c.method, c.path, c.key, c.body, &ae); st != c.status || ae.Code != c.code {
			t.Errorf("%s: %d %+v, want %d %s", c.name, st, ae, c.status, c.code)
		}
	}
	if all, _ := e.st.ListSandboxes(context.Background(), store.SandboxFilter{}); len(all) != 0 || e.d.Starts() != 0 {
		t.Fatalf("refused creates left %d records, %d starts", len(all), e.d.Starts())
	}
	e.createNative(map[string]any{})
	var ae apiErr
	if st := e.call("POST", "/v1/sandboxes", apiKey, map[string]any{}, &ae); st != http.StatusTooManyRequests || ae.Code != api.CodeCapacityExceeded {
		t.Fatalf("over capacity: %d %+v", st, ae)
	}
	if all, _ := e.st.ListSandboxes(context.Background(), store.SandboxFilter{}); len(all) != 1 {
		t.Fatalf("%d records after a refused create, want 1", len(all))
	}
}

type execResp struct {
	ExitCode  int    `json:"exit_code"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	TimedOut  bool   `json:"timed_out"`
	EndReason string `json:"end_reason"`
}

// TestNativeExec: exec runs commands through the fake agent (shell text,
// argv, stdin, timeouts), refuses bad requests with invalid_argument and
// a paused sandbox with conflict; pause and resume answer the new state.
func TestNativeExec(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10)
	v := e.createNative(map[string]any{})
	path := "/v1/sandboxes/" + v.ID
	cases := []struct {
		name string
		body map[string]any
		want execResp
	}{
		{"shell text", map[string]any{"command": "echo hi"}, execResp{Stdout: "hi\n"}},
		{"argv", map[string]any{"cmd": []string{"false"}}, execResp{ExitCode: 1}},
		{"stdin", map[string]any{"cmd": []string{"cat"}, "stdin": base64.StdEncoding.EncodeToString([]byte("abc"))}, execResp{Stdout: "abc"}},
		{"root", map[string]any{"command": "whoami", "user": "root"}, execResp{Stdout: "root\n"}},
		{"timeout", map[string]any{"command": "sleep infinity", "timeout": 0.2}, execResp{ExitCode: 124, TimedOut: true, EndReason: "timeout"}},
	}
	for _, c := range cases {
		var r execResp
		if st := e.call("POST", path+"/exec", apiKey, c.body, &r); st != http.StatusOK || r != c.want {
			t.Errorf("%s: %d %+v, want %+v", c.name, st, r, c.want)
		}
	}
	var ae apiErr
	if st := e.call("POST", path+"/exec", apiKey, map[string]any{"command": "x", "user": "mallory"}, &ae); st != 400 || ae.Code != api.CodeInvalidArgument {
		t.Errorf("bad user: %d %+v", st, ae)
	}
	if st := e.call("POST", path+"/exec", apiKey, map[string]any{"command": "x", "cmd": []string{"y"}}, &ae); st != 400 || ae.Code != api.CodeInvalidArgument {
		t.Errorf("cmd and command: %d %+v", st, ae)
	}
	var sv sandboxView
	if st := e.call("POST", path+"/pause", apiKey, nil, &sv); st != http.StatusOK || sv.State != "paused" {
		t.Fatalf("pause: %d %+v", st, sv)
	}
	if st := e.call("POST", path+"/pause", apiKey, nil, &ae); st != http.StatusConflict || ae.Code != api.CodeConflict {
		t.Errorf("second pause: %d %+v", st, ae)
	}
	if st := e.call("POST", path+"/exec", apiKey, map[string]any{"command": "echo hi"}, &ae); st != http.StatusConflict || ae.Code != api.CodeConflict {
		t.Errorf("exec while paused: %d %+v", st, ae)
	}
	if st := e.call("POST", path+"/resume", apiKey, nil, &sv); st != http.StatusOK || sv.State != "running" {
		t.Fatalf("resume: %d %+v", st, sv)
	}
	var r execResp
	if st := e.call("POST", path+"/exec", apiKey, map[string]any{"command": "echo again"}, &r); st != 200 || r.Stdout != "again\n" {
		t.Errorf("exec after resume: %d %+v", st, r)
	}
	cmds, _ := e.st.ListCommands(context.Background(), v.ID)
	if len(cmds) != len(cases)+1 {
		t.Errorf("%d command records, want %d", len(cmds), len(cases)+1)
	}
}

type e2bSandbox struct {
	SandboxID       string `json:"sandboxID"`
	EnvdAccessToken string `json:"envdAccessToken"`
	State           string `json:"state"`
	Code            int    `json:"code"`
	Message         string `json:"message"`
}

// envdProcess is a process client that reaches a sandbox's agent the way
// the e2b SDK does: through the API server with E2b-Sandbox-Id and the
// sandbox's access token.
func (e *env) envdProcess(id, token string) processconnect.ProcessClient {
	hc := &http.Client{Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set("E2b-Sandbox-Id", id)
		r.Header.Set("E2b-Sandbox-Port", "49983")
		if token != "" {
			r.Header.Set("X-Access-Token", token)
		}
		return http.DefaultTransport.RoundTrip(r)
	})}
	return processconnect.NewProcessClient(hc, e.srv.URL)
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// envdRun starts a command through the envd route and returns its stdout
// and end event, or the error that refused it.
func envdRun(pc processconnect.ProcessClient, cmd string, args ...string) (string, *pb.ProcessEvent_EndEvent, error) {
	s, err := pc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: cmd, Args: args}}))
	if err != nil {
		return "", nil, err
	}
	defer s.Close()
	var out string
	for s.Receive() {
		ev := s.Msg().GetEvent()
		out += string(ev.GetData().GetStdout())
		if end := ev.GetEnd(); end != nil {
			return out, end, nil
		}
	}
	return out, nil, s.Err()
}

// TestE2BRoutes: the E2B control routes (create, get, pause, connect,
// kill) answer E2B's statuses and shapes, and envd traffic routed by
// E2b-Sandbox-Id reaches the sandbox's agent only with its access token.
func TestE2BRoutes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10)
	var sb e2bSandbox
	if st := e.call("POST", "/sandboxes", apiKey, map[string]any{"templateID": "base", "timeout": 60}, &sb); st != http.StatusCreated || sb.SandboxID == "" || sb.EnvdAccessToken == "" {
		t.Fatalf("create: %d %+v", st, sb)
	}
	id := sb.SandboxID
	var got e2bSandbox
	if st := e.call("GET", "/sandboxes/"+id, apiKey, nil, &got); st != 200 || got.State != "running" || got.SandboxID != id {
		t.Fatalf("get: %d %+v", st, got)
	}

	out, end, err := envdRun(e.envdProcess(id, sb.EnvdAccessToken), "/bin/bash", "-l", "-c", "echo from envd")
	if err != nil || out != "from envd\n" || end.GetExitCode() != 0 {
		t.Fatalf("envd process: %q %v %v", out, end, err)
	}
	if cmds, _ := e.st.ListCommands(context.Background(), id); len(cmds) != 1 || cmds[0].Command != "/bin/bash -l -c echo from envd" {
		t.Errorf("envd command not recorded: %+v", cmds)
	}
	if _, _, err := envdRun(e.envdProcess(id, "wrong-token"), "echo", "x"); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("envd with a wrong token: %v", err)
	}
	if _, _, err := envdRun(e.envdProcess(id, ""), "echo", "x"); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("envd without a token: %v", err)
	}
	if n := len(e.d.Commands(id)); n != 1 {
		t.Errorf("refused envd calls reached the agent: %d commands", n)
	}

	if st := e.call("POST", "/sandboxes/"+id+"/pause", apiKey, nil, nil); st != http.StatusNoContent {
		t.Fatalf("pause: %d", st)
	}
	if e.call("GET", "/sandboxes/"+id, apiKey, nil, &got); got.State != "paused" {
		t.Errorf("state after pause %q", got.State)
	}
	var ee e2bSandbox
	if st := e.call("POST", "/sandboxes/"+id+"/pause", apiKey, nil, &ee); st != http.StatusConflict || ee.Code != 409 {
		t.Errorf("second pause: %d %+v", st, ee)
	}
	if _, _, err := envdRun(e.envdProcess(id, sb.EnvdAccessToken), "echo", "x"); err == nil {
		t.Error("envd call into a paused sandbox succeeded")
	}
	if st := e.call("POST", "/sandboxes/"+id+"/connect", apiKey, map[string]any{"timeout": 60}, &got); st != http.StatusCreated || got.SandboxID != id {
		t.Fatalf("connect (resume): %d %+v", st, got)
	}
	if st := e.call("POST", "/sandboxes/"+id+"/connect", apiKey, map[string]any{"timeout": 60}, &got); st != http.StatusOK {
		t.Errorf("connect to a running sandbox: %d", st)
	}
	if st := e.call("DELETE", "/sandboxes/"+id, apiKey, nil, nil); st != http.StatusNoContent {
		t.Fatalf("kill: %d", st)
	}
	if rec, _ := e.st.GetSandbox(context.Background(), id); rec == nil || rec.State != store.StateEnded || rec.EndReason != sandbox.EndKilled {
		t.Fatalf("record after kill: %+v", rec)
	}
	if st := e.call("GET", "/sandboxes/"+id, apiKey, nil, &ee); st != http.StatusNotFound || ee.Code != 404 {
		t.Errorf("get after kill: %d %+v", st, ee)
	}
	if st := e.call("DELETE", "/sandboxes/"+id, apiKey, nil, &ee); st != http.StatusNotFound || ee.Code != 404 {
		t.Errorf("second kill: %d %+v", st, ee)
	}
	var nf map[string]any
	if st := e.call("GET", "/health", "", nil, &nf, "E2b-Sandbox-Id", id); st != http.StatusBadGateway || nf["message"] != "The sandbox was not found" {
		t.Errorf("envd after kill: %d %v", st, nf)
	}
}

// TestE2BErrors: E2B create refusals answer E2B's error shape with the
// status the SDK maps (401, 400, 404, 429) and record nothing.
func TestE2BErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cases := []struct {
		name, key string
		body      any
		status    int
	}{
		{"no key", "", map[string]any{}, 401},
		{"bad json", apiKey, "{", 400},
		{"unknown template", apiKey, map[string]any{"templateID": "nosuch:v1"}, 404},
		{"bad timeout", apiKey, map[string]any{"timeout": 0}, 400},
		{"mcp", apiKey, map[string]any{"mcp": map[string]any{"x": 1}}, 400},
	}
	for _, c := range cases {
		var ee e2bSandbox
		if st := e.call("POST", "/sandboxes", c.key, c.body, &ee); st != c.status || ee.Code != c.status || ee.Message == "" {
			t.Errorf("%s: %d %+v, want %d", c.name, st, ee, c.status)
		}
	}
	if all, _ := e.st.ListSandboxes(context.Background(), store.SandboxFilter{}); len(all) != 0 {
		t.Fatalf("refused creates left %d records", len(all))
	}
	var sb e2bSandbox
	if st := e.call("POST", "/sandboxes", apiKey, map[string]any{}, &sb); st != http.StatusCreated {
		t.Fatalf("create: %d", st)
	}
	var ee e2bSandbox
	if st := e.call("POST", "/sandboxes", apiKey, map[string]any{}, &ee); st != http.StatusTooManyRequests || !strings.HasPrefix(ee.Message, api.CodeCapacityExceeded) {
		t.Errorf("over capacity: %d %+v", st, ee)
	}
	if st := e.call("GET", "/health", "", nil, nil, "E2b-Sandbox-Id", "nosuchsandbox"); st != http.StatusBadGateway {
		t.Errorf("envd for an unknown sandbox: %d", st)
	}
}

// TestE2BEnvdFiles: an upload and a download through the envd route land
// in (and come from) the sandbox's files, with the access token.
func TestE2BEnvdFiles(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10)
	var sb e2bSandbox
	if st := e.call("POST", "/sandboxes", apiKey, map[string]any{}, &sb); st != http.StatusCreated {
		t.Fatalf("create: %d", st)
	}
	hdr := []string{"E2b-Sandbox-Id", sb.SandboxID, "X-Access-Token", sb.EnvdAccessToken, "Content-Type", "application/octet-stream"}
	var up []map[string]string
	if st := e.call("POST", "/files?path=/home/user/in.txt", "", "uploaded", &up, hdr...); st != 200 || len(up) != 1 {
		t.Fatalf("upload: %d %v", st, up)
	}
	if data, ok := e.d.ReadFile(sb.SandboxID, "/home/user/in.txt"); !ok || string(data) != "uploaded" {
		t.Fatalf("sandbox file: %q %v", data, ok)
	}
	req, _ := http.NewRequest("GET", e.srv.URL+"/files?path=/home/user/in.txt", nil)
	req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
	req.Header.Set("X-Access-Token", sb.EnvdAccessToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "uploaded" {
		t.Fatalf("download: %d %q", resp.StatusCode, body)
	}
	req.Header.Set("X-Access-Token", "wrong")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("download with a wrong token: %d", resp.StatusCode)
	}
}

// TestNativeExecSandboxDies: when the sandbox dies at its memory limit
// under a running command, exec answers the command killed (137) with
// reason oom, and the sandbox is recorded ended "oom".
func TestNativeExecSandboxDies(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10)
	v := e.createNative(map[string]any{})
	done := make(chan execResp, 1)
	go func() {
		var r execResp
		e.call("POST", "/v1/sandboxes/"+v.ID+"/exec", apiKey, map[string]any{"command": "sleep infinity"}, &r)
		done <- r
	}()
	deadline := time.Now().Add(15 * time.Second)
	for len(e.d.Commands(v.ID)) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	e.d.OOM(v.ID)
	if r := <-done; r.ExitCode != 137 || r.EndReason != sandbox.EndOOM {
		t.Fatalf("exec in a sandbox that died: %+v", r)
	}
	var sv sandboxView
	if e.call("GET", "/v1/sandboxes/"+v.ID, apiKey, nil, &sv); sv.State != "ended" || sv.EndReason != sandbox.EndOOM {
		t.Fatalf("record after death: %+v", sv)
	}
}

// TestNativeAgentRoute: the native agent route relays process calls to
// the sandbox's agent with the API key (the agent's token is added by the
// control plane, never given by the caller).
func TestNativeAgentRoute(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10)
	v := e.createNative(map[string]any{})
	hc := &http.Client{Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set("X-API-Key", apiKey)
		return http.DefaultTransport.RoundTrip(r)
	})}
	pc := processconnect.NewProcessClient(hc, e.srv.URL+"/v1/sandboxes/"+v.ID+"/agent")
	out, end, err := envdRun(pc, "echo", "relayed")
	if err != nil || out != "relayed\n" || end.GetExitCode() != 0 {
		t.Fatalf("relay: %q %v %v", out, end, err)
	}
	if st := e.call("GET", "/v1/sandboxes/"+v.ID+"/agent/health", "", nil, nil); st != http.StatusUnauthorized {
		t.Errorf("agent route without an API key: %d", st)
	}
}

// TestE2BSignedFiles: a signed /files URL that names no sandbox reaches
// the sandbox whose token made the signature; a signature made with any
// other token is refused with 401 and writes nothing.
func TestE2BSignedFiles(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10)
	var sb e2bSandbox
	if st := e.call("POST", "/sandboxes", apiKey, map[string]any{}, &sb); st != http.StatusCreated {
		t.Fatalf("create: %d", st)
	}
	signed := func(path, token string) string {
		return "/files?path=" + path + "&username=user&signature=" + url.QueryEscape(runtimetest.Sign(path, "write", "user", token, 0))
	}
	hdr := []string{"Content-Type", "application/octet-stream"}
	if st := e.call("POST", signed("/home/user/signed.txt", sb.EnvdAccessToken), "", "signed", nil, hdr...); st != http.StatusOK {
		t.Fatalf("signed upload: %d", st)
	}
	if data, ok := e.d.ReadFile(sb.SandboxID, "/home/user/signed.txt"); !ok || string(data) != "signed" {
		t.Fatalf("sandbox file: %q %v", data, ok)
	}
	var ee e2bSandbox
	if st := e.call("POST", signed("/home/user/forged.txt", "not-the-token"), "", "forged", &ee, hdr...); st != http.StatusUnauthorized || ee.Message != "invalid signature" {
		t.Fatalf("forged signature: %d %+v", st, ee)
	}
	if _, ok := e.d.ReadFile(sb.SandboxID, "/home/user/forged.txt"); ok {
		t.Fatal("a forged signature wrote a file")
	}
}

// TestNativeMetricsAndProcesses: the metrics route reports what the
// driver reads (here set by the test) and the processes route the
// sandbox's processes; both are not_found once it has ended.
func TestNativeMetricsAndProcesses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10)
	v := e.createNative(map[string]any{})
	e.d.SetStats(v.ID, runtime.Stats{MemoryBytes: 42 << 20, Pids: 7, CPUSeconds: 1.5})
	var m struct {
		Current struct {
			MemoryBytes int64 `json:"memory_bytes"`
			Pids        int64 `json:"pids"`
		} `json:"current"`
	}
	if st := e.call("GET", "/v1/sandboxes/"+v.ID+"/metrics", apiKey, nil, &m); st != 200 || m.Current.MemoryBytes != 42<<20 || m.Current.Pids != 7 {
		t.Fatalf("metrics: %d %+v", st, m)
	}
	var p struct {
		Processes []runtime.Process `json:"processes"`
	}
	if st := e.call("GET", "/v1/sandboxes/"+v.ID+"/processes", apiKey, nil, &p); st != 200 || len(p.Processes) != 1 || p.Processes[0].User != "root" {
		t.Fatalf("processes: %d %+v", st, p)
	}
	e.call("DELETE", "/v1/sandboxes/"+v.ID, apiKey, nil, nil)
	var ae apiErr
	for _, route := range []string{"/metrics", "/processes"} {
		if st := e.call("GET", "/v1/sandboxes/"+v.ID+route, apiKey, nil, &ae); st != http.StatusNotFound || ae.Code != api.CodeNotFound {
			t.Errorf("%s after kill: %d %+v", route, st, ae)
		}
	}
}
