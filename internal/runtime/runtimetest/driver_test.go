package runtimetest_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/runtime/runtimetest"
	"github.com/corralhq/corral/proto/agentproto"
	pb "github.com/corralhq/corral/proto/process"
	"github.com/corralhq/corral/proto/process/processconnect"
)

const token = "secret-token"

func start(t *testing.T, d *runtimetest.Driver, id string, layers ...string) {
	t.Helper()
	h, err := d.Start(context.Background(), runtime.Config{ID: id, Runtime: runtime.Runc, RootFS: t.TempDir(),
		Layers: layers, AccessToken: token, Env: map[string]string{"GREETING": "hello"}})
	if err != nil {
		t.Fatalf("start %s: %v", id, err)
	}
	if h.ID != id || h.Pid <= 0 {
		t.Fatalf("handle = %+v", h)
	}
}

// client returns an HTTP client whose connections reach the agent of id;
// tok is sent as the access token unless empty.
func client(d *runtimetest.Driver, id, tok string) *http.Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return d.Dial(ctx, id) }}
	return &http.Client{Transport: rt(func(r *http.Request) (*http.Response, error) {
		if tok != "" {
			r = r.Clone(r.Context())
			r.Header.Set(agentproto.AccessTokenHeader, tok)
		}
		return tr.RoundTrip(r)
	})}
}

type rt func(*http.Request) (*http.Response, error)

func (f rt) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func procClient(d *runtimetest.Driver, id string) processconnect.ProcessClient {
	return processconnect.NewProcessClient(client(d, id, token), "http://agent")
}

// result is what a process stream said.
type result struct {
	pid            uint32
	stdout, stderr string
	end            *pb.ProcessEvent_EndEvent
	err            error
}

func run(ctx context.Context, pc processconnect.ProcessClient, user string, stdin bool, cmd string, args ...string) result {
	req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: cmd, Args: args}, Stdin: &stdin})
	if user != "" {
		req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	s, err := pc.Start(ctx, req)
	if err != nil {
		return result{err: err}
	}
	defer s.Close()
	var r result
	for s.Receive() {
		ev := s.Msg().GetEvent()
		if st := ev.GetStart(); st != nil {
			r.pid = st.GetPid()
		}
		r.stdout += string(ev.GetData().GetStdout())
		r.stderr += string(ev.GetData().GetStderr())
		if e := ev.GetEnd(); e != nil {
			r.end = e
			return r
		}
	}
	r.err = s.Err()
	return r
}

// TestStopIsTotalAndIdempotent checks the contract points the Manager
// relies on: an invalid id or runtime is refused, a held id cannot be
// started twice, Stop of an unknown or stopped sandbox is not an error,
// and after Stop the driver holds nothing of it.
func TestStopIsTotalAndIdempotent(t *testing.T) {
	ctx := context.Background()
	d := runtimetest.New()
	for _, cfg := range []runtime.Config{{ID: "BAD", Runtime: runtime.Runc}, {ID: "ok1", Runtime: "kvm"}, {ID: "../x", Runtime: runtime.Runc}} {
		if _, err := d.Start(ctx, cfg); err == nil {
			t.Errorf("Start(%+v) succeeded", cfg)
		}
	}
	if err := d.Stop(ctx, "../x", 0); err == nil {
		t.Error("Stop of an invalid id succeeded")
	}
	start(t, d, "sb1")
	if _, err := d.Start(ctx, runtime.Config{ID: "sb1", Runtime: runtime.Runc}); err == nil {
		t.Error("second Start of sb1 succeeded")
	}
	if ids, _ := d.List(ctx); !slices.Equal(ids, []string{"sb1"}) {
		t.Fatalf("List = %v", ids)
	}
	for i := 0; i < 2; i++ {
		if err := d.Stop(ctx, "sb1", time.Second); err != nil {
			t.Fatalf("Stop #%d: %v", i+1, err)
		}
	}
	if err := d.Stop(ctx, "never", 0); err != nil {
		t.Fatalf("Stop of an unknown sandbox: %v", err)
	}
	if ids, _ := d.List(ctx); len(ids) != 0 {
		t.Fatalf("List after Stop = %v", ids)
	}
	if d.Alive("sb1") {
		t.Error("Alive after Stop")
	}
	if _, err := d.Dial(ctx, "sb1"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Dial after Stop: %v, want ErrNotFound", err)
	}
	if _, err := d.Stats("sb1"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Stats after Stop: %v, want ErrNotFound", err)
	}
	if err := d.Pause(ctx, "sb1"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Pause after Stop: %v, want ErrNotFound", err)
	}
}

// TestPauseFreezesAgent: a paused sandbox is alive, refuses a second
// pause, and its agent answers nothing until it is resumed.
func TestPauseFreezesAgent(t *testing.T) {
	ctx := context.Background()
	d := runtimetest.New()
	start(t, d, "sb1")
	if err := d.Resume(ctx, "sb1"); err == nil {
		t.Error("Resume of a running sandbox succeeded")
	}
	if err := d.Pause(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	if err := d.Pause(ctx, "sb1"); err == nil {
		t.Error("second Pause succeeded")
	}
	if !d.Alive("sb1") || d.StateOf("sb1") != runtimetest.Paused {
		t.Fatalf("paused sandbox: alive %v state %q", d.Alive("sb1"), d.StateOf("sb1"))
	}
	answered := make(chan result, 1)
	go func() { answered <- run(ctx, procClient(d, "sb1"), "", false, "echo", "thawed") }()
	// The frozen agent must not answer; a short wait cannot give a false
	// pass (an answer that comes later fails the check below too).
	select {
	case r := <-answered:
		t.Fatalf("a paused sandbox's agent answered: %+v", r)
	case <-time.After(50 * time.Millisecond):
	}
	if err := d.Resume(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	r := <-answered
	if r.err != nil || r.stdout != "thawed\n" || r.end.GetExitCode() != 0 {
		t.Fatalf("after resume: %+v", r)
	}
}

// TestDeathAndOOM: a killed sandbox is not alive, refuses connections
// and is still held (and listed) until Stop; OOM also counts the kill.
func TestDeathAndOOM(t *testing.T) {
	ctx := context.Background()
	d := runtimetest.New()
	start(t, d, "crash")
	start(t, d, "oom")
	if !d.Kill("crash") || !d.OOM("oom") {
		t.Fatal("Kill or OOM of a live sandbox reported false")
	}
	if d.Kill("crash") {
		t.Error("second Kill reported a live sandbox")
	}
	for _, id := range []string{"crash", "oom"} {
		if d.Alive(id) {
			t.Errorf("%s alive after death", id)
		}
		if _, err := d.Dial(ctx, id); err == nil {
			t.Errorf("Dial of dead %s succeeded", id)
		}
		if d.StateOf(id) != runtimetest.Dead {
			t.Errorf("%s state %q", id, d.StateOf(id))
		}
	}
	if ids, _ := d.List(ctx); len(ids) != 2 {
		t.Fatalf("List = %v, want the dead sandboxes until Stop", ids)
	}
	if st, err := d.Stats("oom"); err != nil || st.OOMKills != 1 {
		t.Fatalf("Stats(oom) = %+v, %v", st, err)
	}
	if st, err := d.Stats("crash"); err != nil || st.OOMKills != 0 {
		t.Fatalf("Stats(crash) = %+v, %v", st, err)
	}
	_ = d.Stop(ctx, "crash", 0)
	_ = d.Stop(ctx, "oom", 0)
	if ids, _ := d.List(ctx); len(ids) != 0 {
		t.Fatalf("List after Stop = %v", ids)
	}
}

// TestAgentChecksAccessToken: like the real agent, every call but GET
// /health needs the sandbox's access token, and /files takes a URL
// signature made with it instead.
func TestAgentChecksAccessToken(t *testing.T) {
	d := runtimetest.New()
	start(t, d, "sb1")
	get := func(tok, path string) int {
		resp, err := client(d, "sb1", tok).Get("http://agent" + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get("", "/health"); got != http.StatusNoContent {
		t.Errorf("/health without token: %d", got)
	}
	if got := get("", "/files?path=/etc/hostname"); got != http.StatusUnauthorized {
		t.Errorf("/files without token or signature: %d", got)
	}
	if got := get("wrong", "/files?path=/x"); got != http.StatusUnauthorized {
		t.Errorf("/files with a wrong token: %d", got)
	}
	r := run(context.Background(), processconnect.NewProcessClient(client(d, "sb1", "wrong"), "http://agent"), "", false, "echo", "hi")
	if connect.CodeOf(r.err) != connect.CodeUnauthenticated {
		t.Errorf("Start with a wrong token: %+v", r)
	}
	d.WriteFile("sb1", "/home/user/a.txt", []byte("data"))
	sig := runtimetest.Sign("/home/user/a.txt", "read", "user", token, 0)
	if got := get("", "/files?path=/home/user/a.txt&username=user&signature="+url.QueryEscape(sig)); got != http.StatusOK {
		t.Errorf("/files with a valid signature: %d", got)
	}
	bad := runtimetest.Sign("/home/user/a.txt", "read", "user", "other", 0)
	if got := get("", "/files?path=/home/user/a.txt&username=user&signature="+url.QueryEscape(bad)); got != http.StatusUnauthorized {
		t.Errorf("/files signed with another token: %d", got)
	}
}

// TestScriptedProcesses: the built-in table, registered responders,
// users, env, stdin, signals and lifetimes; nothing runs on the host.
func TestScriptedProcesses(t *testing.T) {
	ctx := context.Background()
	d := runtimetest.New()
	start(t, d, "sb1")
	pc := procClient(d, "sb1")
	d.RespondLine("make build", runtimetest.Result{Stdout: "built\n", Stderr: "warn\n", ExitCode: 2})
	cases := []struct {
		name, user     string
		cmd            []string
		stdout, stderr string
		exit           int32
	}{
		{"echo", "", []string{"echo", "hi"}, "hi\n", "", 0},
		{"shell wrapper", "", []string{"/bin/bash", "-l", "-c", "echo hi there"}, "hi there\n", "", 0},
		{"false", "", []string{"false"}, "", "", 1},
		{"responder", "", []string{"/bin/bash", "-l", "-c", "make build"}, "built\n", "warn\n", 2},
		{"whoami root", "root", []string{"whoami"}, "root\n", "", 0},
		{"env", "", []string{"printenv", "GREETING"}, "hello\n", "", 0},
		{"unknown", "", []string{"rm", "-rf", "/"}, "", "fake agent: rm: command not found (register a responder)\n", 127},
	}
	for _, c := range cases {
		r := run(ctx, pc, c.user, false, c.cmd[0], c.cmd[1:]...)
		if r.err != nil || r.end == nil {
			t.Errorf("%s: %+v", c.name, r)
			continue
		}
		if r.stdout != c.stdout || r.stderr != c.stderr || r.end.GetExitCode() != c.exit || !r.end.GetExited() {
			t.Errorf("%s: stdout %q stderr %q end %v", c.name, r.stdout, r.stderr, r.end)
		}
	}
	if r := run(ctx, pc, "mallory", false, "echo"); connect.CodeOf(r.err) != connect.CodeUnauthenticated {
		t.Errorf("unknown user: %+v", r)
	}
	if cmds := d.Commands("sb1"); len(cmds) != len(cases) || cmds[3].Line() != "make build" {
		t.Errorf("Commands = %+v", cmds)
	}

	// A waiting process ends when signalled.
	d.RespondLine("serve", runtimetest.Result{Stdout: "ready\n", Wait: true})
	done := make(chan result, 1)
	go func() { done <- run(ctx, pc, "", false, "serve") }()
	pid := waitProcess(t, pc, "serve")
	if _, err := pc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGTERM})); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.stdout != "ready\n" || r.end.GetExited() || r.end.GetStatus() != "signal: terminated" {
		t.Fatalf("signalled: %+v", r)
	}

	// A lifetime (Connect-Timeout-Ms, set as the Manager sets it: in the
	// transport, with no deadline on the caller's side) kills it and says
	// timed out.
	inner := client(d, "sb1", token)
	lc := &http.Client{Transport: rt(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set("Connect-Timeout-Ms", "50")
		return inner.Transport.RoundTrip(r)
	})}
	if r := run(ctx, processconnect.NewProcessClient(lc, "http://agent"), "", false, "sleep", "infinity"); r.end == nil || !r.end.GetTimedOut() || r.end.GetEndReason() != "timeout" {
		t.Fatalf("lifetime: %+v", r)
	}

	// cat copies stdin until it is closed.
	go func() { done <- run(ctx, pc, "", true, "cat") }()
	pid = waitProcess(t, pc, "cat")
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	if _, err := pc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel,
		Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("piped")}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.stdout != "piped" || r.end.GetExitCode() != 0 {
		t.Fatalf("cat: %+v", r)
	}
}

// waitProcess polls List until a process whose command is cmd runs.
func waitProcess(t *testing.T, pc processconnect.ProcessClient, cmd string) uint32 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := pc.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range resp.Msg.GetProcesses() {
			if p.GetConfig().GetCmd() == cmd {
				return p.GetPid()
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("process %s never ran", cmd)
	return 0
}

// TestStopBreaksStreams: a sandbox that stops or dies under a running
// command breaks its stream without an end event, as the real one does.
func TestStopBreaksStreams(t *testing.T) {
	ctx := context.Background()
	for _, how := range []string{"stop", "kill"} {
		d := runtimetest.New()
		start(t, d, "sb1")
		pc := procClient(d, "sb1")
		done := make(chan result, 1)
		go func() { done <- run(ctx, pc, "", false, "sleep", "infinity") }()
		waitProcess(t, pc, "sleep")
		if procs, err := d.Processes("sb1"); err != nil || len(procs) != 2 || procs[1].Command != "sleep infinity" {
			t.Fatalf("%s: Processes = %+v, %v", how, procs, err)
		}
		if how == "stop" {
			_ = d.Stop(ctx, "sb1", 0)
		} else {
			d.Kill("sb1")
		}
		if r := <-done; r.end != nil || r.err == nil {
			t.Fatalf("%s: stream of a stopped sandbox: %+v", how, r)
		}
	}
}

// TestOOMKillCommands: the memory limit kills the running commands but
// not the sandbox, and counts the kill.
func TestOOMKillCommands(t *testing.T) {
	ctx := context.Background()
	d := runtimetest.New()
	start(t, d, "sb1")
	pc := procClient(d, "sb1")
	done := make(chan result, 1)
	go func() { done <- run(ctx, pc, "", false, "sleep", "infinity") }()
	waitProcess(t, pc, "sleep")
	if n := d.OOMKillCommands("sb1"); n != 1 {
		t.Fatalf("OOMKillCommands ended %d processes", n)
	}
	if r := <-done; r.end == nil || r.end.GetExited() || r.end.GetStatus() != "signal: killed" {
		t.Fatalf("OOM-killed command: %+v", r)
	}
	if st, _ := d.Stats("sb1"); st.OOMKills != 1 || !d.Alive("sb1") {
		t.Fatalf("after OOMKillCommands: stats %+v alive %v", st, d.Alive("sb1"))
	}
}

// TestSnapshotLayers: Snapshot writes the files a sandbox changed (and a
// marker naming what it removed) to a new directory; sandboxes started
// on the layers see the files, and a later layer's removals hide them.
func TestSnapshotLayers(t *testing.T) {
	ctx := context.Background()
	d := runtimetest.New()
	start(t, d, "sb1")
	hc := client(d, "sb1", token)
	resp, err := hc.Post("http://agent/files?path=/home/user/notes/a.txt", "application/octet-stream", strings.NewReader("kept"))
	if err != nil {
		t.Fatal(err)
	}
	var up []map[string]string
	_ = json.NewDecoder(resp.Body).Decode(&up)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(up) != 1 || up[0]["path"] != "/home/user/notes/a.txt" {
		t.Fatalf("upload: %d %v", resp.StatusCode, up)
	}
	snap1 := filepath.Join(t.TempDir(), "snap1", "layer")
	if err := d.Pause(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	n, err := d.Snapshot(ctx, "sb1", snap1)
	if err != nil || n != 4 {
		t.Fatalf("Snapshot = %d, %v", n, err)
	}
	if d.StateOf("sb1") != runtimetest.Paused {
		t.Error("a paused sandbox did not stay paused through Snapshot")
	}
	if _, err := d.Snapshot(ctx, "sb1", snap1); err == nil {
		t.Error("Snapshot onto an existing directory succeeded")
	}
	if b, err := os.ReadFile(filepath.Join(snap1, "home/user/notes/a.txt")); err != nil || string(b) != "kept" {
		t.Fatalf("layer file: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(snap1, runtimetest.LayerMarker)); err != nil {
		t.Fatalf("layer marker: %v", err)
	}

	start(t, d, "sb2", snap1)
	if b, ok := d.ReadFile("sb2", "/home/user/notes/a.txt"); !ok || string(b) != "kept" {
		t.Fatalf("sb2 sees %q, %v", b, ok)
	}
	if r := run(ctx, procClient(d, "sb2"), "", false, "cat", "notes/a.txt"); r.stdout != "kept" {
		t.Fatalf("cat in sb2: %+v", r)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://agent/files?path=/home/user/notes/a.txt", nil)
	resp, err = client(d, "sb2", token).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Equal(body, []byte("kept")) {
		t.Fatalf("download in sb2: %q", body)
	}
	// sb2 removes the file; a sandbox on both layers does not see it.
	rmReq, _ := http.NewRequest(http.MethodPost, "http://agent/filesystem.Filesystem/Remove", strings.NewReader(`{"path":"/home/user/notes/a.txt"}`))
	rmReq.Header.Set("Content-Type", "application/json")
	resp, err = client(d, "sb2", token).Do(rmReq)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("remove: %v %v", resp, err)
	}
	resp.Body.Close()
	snap2 := filepath.Join(t.TempDir(), "snap2")
	if _, err := d.Snapshot(ctx, "sb2", snap2); err != nil {
		t.Fatal(err)
	}
	if d.StateOf("sb2") != runtimetest.Running {
		t.Error("a running sandbox did not keep running through Snapshot")
	}
	start(t, d, "sb3", snap2, snap1)
	if _, ok := d.ReadFile("sb3", "/home/user/notes/a.txt"); ok {
		t.Fatal("a file removed in the top layer is visible")
	}
}

// TestNothingRunsOnHost: the fake agent answers from its table and never
// executes a command on the host (the project's rule: no untrusted code
// outside a sandbox, not in tests either): a command that would create a
// host file leaves none, and an upload lands in memory, not on the host.
func TestNothingRunsOnHost(t *testing.T) {
	d := runtimetest.New()
	start(t, d, "sb1")
	marker := filepath.Join(t.TempDir(), "ran")
	for _, argv := range [][]string{{"touch", marker}, {"/bin/sh", "-c", "touch " + marker}, {"/usr/bin/touch", marker}} {
		r := run(context.Background(), procClient(d, "sb1"), "root", false, argv[0], argv[1:]...)
		if r.end == nil || r.end.GetExitCode() != 127 {
			t.Errorf("%v: %+v, want exit 127 (no responder)", argv, r)
		}
	}
	resp, err := client(d, "sb1", token).Post("http://agent/files?path="+url.QueryEscape(marker), "application/octet-stream", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a host file appeared: %v", err)
	}
	if data, ok := d.ReadFile("sb1", marker); !ok || string(data) != "x" {
		t.Fatalf("upload not in the sandbox's memory: %q %v", data, ok)
	}
}
