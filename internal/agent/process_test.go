package agent

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	pb "github.com/corralhq/corral/proto/process"
)

func TestStartEndEvents(t *testing.T) {
	e := newTestEnv(t, nil)
	tests := []struct {
		name           string
		cmd            string
		args           []string
		stdout, stderr string
		end            *pb.ProcessEvent_EndEvent
	}{
		{"exit0", "/bin/echo", []string{"hello", "world"}, "hello world\n", "",
			&pb.ProcessEvent_EndEvent{Exited: true, Status: "exit status 0"}},
		{"exit3", "/bin/sh", []string{"-c", "exit 3"}, "", "",
			&pb.ProcessEvent_EndEvent{ExitCode: 3, Exited: true, Status: "exit status 3", Error: proto.String("exit status 3")}},
		{"exit1 stderr", "/bin/sh", []string{"-c", "echo out; echo err >&2; exit 1"}, "out\n", "err\n",
			&pb.ProcessEvent_EndEvent{ExitCode: 1, Exited: true, Status: "exit status 1", Error: proto.String("exit status 1")}},
		{"PATH lookup", "echo", []string{"x"}, "x\n", "",
			&pb.ProcessEvent_EndEvent{Exited: true, Status: "exit status 0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := e.run(t, context.Background(), startReq(tc.cmd, tc.args...))
			if string(r.stdout) != tc.stdout || string(r.stderr) != tc.stderr {
				t.Errorf("stdout %q stderr %q, want %q %q", r.stdout, r.stderr, tc.stdout, tc.stderr)
			}
			if !proto.Equal(r.end, tc.end) {
				t.Errorf("end = %v, want %v", r.end, tc.end)
			}
			if r.pid == 0 {
				t.Error("start event without pid")
			}
		})
	}
}

func TestSendSignalKill(t *testing.T) {
	e := newTestEnv(t, nil)
	for _, tc := range []struct {
		sig    pb.Signal
		status string
	}{
		{pb.Signal_SIGNAL_SIGKILL, "signal: killed"},
		{pb.Signal_SIGNAL_SIGTERM, "signal: terminated"},
	} {
		t.Run(tc.sig.String(), func(t *testing.T) {
			st, pid := e.startWait(t, context.Background(), startReq("/bin/sleep", "30"))
			defer st.Close()
			if _, err := e.proc.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{Process: sel(pid), Signal: tc.sig})); err != nil {
				t.Fatal(err)
			}
			var end *pb.ProcessEvent_EndEvent
			for st.Receive() {
				if ev := st.Msg().GetEvent().GetEnd(); ev != nil {
					end = ev
				}
			}
			want := &pb.ProcessEvent_EndEvent{ExitCode: -1, Status: tc.status, Error: proto.String(tc.status), EndReason: "killed"}
			if !proto.Equal(end, want) {
				t.Fatalf("end = %v, want %v", end, want)
			}
		})
	}
	_, err := e.proc.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{Process: sel(999999999), Signal: pb.Signal_SIGNAL_SIGKILL}))
	wantCode(t, err, connect.CodeNotFound, "process with pid 999999999 not found")

	st, pid := e.startWait(t, context.Background(), startReq("/bin/sleep", "30"))
	defer st.Close()
	defer e.kill(pid)
	_, err = e.proc.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{Process: sel(pid), Signal: pb.Signal_SIGNAL_UNSPECIFIED}))
	wantCode(t, err, connect.CodeUnimplemented, "")
}

func alive(pid int) bool {
	return syscall.Kill(pid, 0) != syscall.ESRCH
}

// TestLifetimeTimeout: Connect-Timeout-Ms on Start is the process lifetime.
// The client has no deadline of its own, so the end event must arrive after
// the server-side deadline, and the whole process group must be gone.
func TestLifetimeTimeout(t *testing.T) {
	e := newTestEnv(t, nil)
	ctx := withHeader(context.Background(), "Connect-Timeout-Ms", "700")
	st, pid := e.startWait(t, ctx, startReq("/bin/sh", "-c", "/bin/sleep 30 & echo $!; wait"))
	defer st.Close()
	var out []byte
	var end *pb.ProcessEvent_EndEvent
	began := time.Now()
	for st.Receive() {
		ev := st.Msg().GetEvent()
		out = append(out, ev.GetData().GetStdout()...)
		if ev.GetEnd() != nil {
			end = ev.GetEnd()
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream error: %v", err)
	}
	want := &pb.ProcessEvent_EndEvent{ExitCode: -1, Status: "signal: killed", Error: proto.String("command timed out"), TimedOut: true, EndReason: "timeout"}
	if !proto.Equal(end, want) {
		t.Fatalf("end = %v, want %v", end, want)
	}
	if el := time.Since(began); el > 5*time.Second {
		t.Fatalf("timeout took %v", el)
	}
	grandchild, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("grandchild pid %q: %v", out, err)
	}
	for _, p := range []int{int(pid), grandchild} {
		if !eventually(3*time.Second, func() bool { return !alive(p) }) {
			t.Errorf("pid %d still exists after timeout", p)
		}
	}
}

// TestDisconnectKeepsProcess: a client going away does not kill the
// process; it stays listed and can be killed later.
func TestDisconnectKeepsProcess(t *testing.T) {
	e := newTestEnv(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	st, pid := e.startWait(t, ctx, startReq("/bin/sleep", "30"))
	cancel()
	st.Close()
	time.Sleep(200 * time.Millisecond)
	if !alive(int(pid)) {
		t.Fatal("process died with its stream")
	}
	if adj, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid)); err != nil || strings.TrimSpace(string(adj)) != "100" {
		t.Errorf("oom_score_adj = %q, %v", adj, err)
	}
	list, err := e.proc.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range list.Msg.GetProcesses() {
		if p.GetPid() == pid {
			found = true
			if p.GetConfig().GetCmd() != "/bin/sleep" || strings.Join(p.GetConfig().GetArgs(), " ") != "30" {
				t.Errorf("config = %v", p.GetConfig())
			}
		}
	}
	if !found {
		t.Fatalf("pid %d not listed: %v", pid, list.Msg)
	}
	e.kill(pid)
	if !eventually(3*time.Second, func() bool { return !alive(int(pid)) }) {
		t.Fatal("not killed")
	}
	if !eventually(3*time.Second, func() bool {
		l, _ := e.proc.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
		return len(l.Msg.GetProcesses()) == 0
	}) {
		t.Fatal("exited process still listed")
	}
}

func TestStdin(t *testing.T) {
	e := newTestEnv(t, nil)
	t.Run("pipe round trip", func(t *testing.T) {
		st, pid := e.startWait(t, context.Background(), startReq("/bin/cat"))
		defer st.Close()
		for _, chunk := range []string{"abc", "", "def\n"} {
			if _, err := e.proc.SendInput(context.Background(), connect.NewRequest(&pb.SendInputRequest{
				Process: sel(pid), Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte(chunk)}}})); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := e.proc.CloseStdin(context.Background(), connect.NewRequest(&pb.CloseStdinRequest{Process: sel(pid)})); err != nil {
			t.Fatal(err)
		}
		var out []byte
		var end *pb.ProcessEvent_EndEvent
		for st.Receive() {
			out = append(out, st.Msg().GetEvent().GetData().GetStdout()...)
			if x := st.Msg().GetEvent().GetEnd(); x != nil {
				end = x
			}
		}
		if string(out) != "abcdef\n" || end.GetStatus() != "exit status 0" {
			t.Fatalf("out %q end %v", out, end)
		}
	})
	t.Run("stdin false is /dev/null", func(t *testing.T) {
		req := startReq("/bin/cat")
		req.Msg.Stdin = proto.Bool(false)
		ctx := withHeader(context.Background(), "Connect-Timeout-Ms", "5000")
		r := e.run(t, ctx, req)
		if len(r.stdout) != 0 || r.end.GetStatus() != "exit status 0" || r.end.GetTimedOut() {
			t.Fatalf("got %q %v", r.stdout, r.end)
		}
		_, err := e.proc.SendInput(context.Background(), connect.NewRequest(&pb.SendInputRequest{
			Process: sel(r.pid), Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("x")}}}))
		wantCode(t, err, connect.CodeNotFound, fmt.Sprintf("process with pid %d not found", r.pid))
	})
	t.Run("stream input", func(t *testing.T) {
		st, pid := e.startWait(t, context.Background(), startReq("/bin/cat"))
		defer st.Close()
		cs := e.proc.StreamInput(context.Background())
		for _, m := range []*pb.StreamInputRequest{
			{Event: &pb.StreamInputRequest_Start{Start: &pb.StreamInputRequest_StartEvent{Process: sel(pid)}}},
			{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("streamed")}}}}},
			{Event: &pb.StreamInputRequest_Keepalive{Keepalive: &pb.StreamInputRequest_KeepAlive{}}},
		} {
			if err := cs.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := cs.CloseAndReceive(); err != nil {
			t.Fatal(err)
		}
		if _, err := e.proc.CloseStdin(context.Background(), connect.NewRequest(&pb.CloseStdinRequest{Process: sel(pid)})); err != nil {
			t.Fatal(err)
		}
		r := collectFrom(t, st, false)
		if string(r.stdout) != "streamed" {
			t.Fatalf("out %q", r.stdout)
		}
	})
}

func TestPTY(t *testing.T) {
	e := newTestEnv(t, nil)
	req := startReq("/bin/cat")
	req.Msg.Pty = &pb.PTY{Size: &pb.PTY_Size{Cols: 80, Rows: 24}}
	st, pid := e.startWait(t, context.Background(), req)
	defer st.Close()
	defer e.kill(pid)
	if _, err := e.proc.Update(context.Background(), connect.NewRequest(&pb.UpdateRequest{Process: sel(pid), Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 100, Rows: 30}}})); err != nil {
		t.Fatal(err)
	}
	_, err := e.proc.SendInput(context.Background(), connect.NewRequest(&pb.SendInputRequest{
		Process: sel(pid), Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("x")}}}))
	wantCode(t, err, connect.CodeInternal, "PTY")
	if _, err := e.proc.SendInput(context.Background(), connect.NewRequest(&pb.SendInputRequest{
		Process: sel(pid), Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte("hello\n\x04")}}})); err != nil {
		t.Fatal(err)
	}
	var out []byte
	var end *pb.ProcessEvent_EndEvent
	for st.Receive() {
		ev := st.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			if len(d.GetStdout()) > 0 {
				t.Fatal("PTY output arrived as stdout")
			}
			out = append(out, d.GetPty()...)
		}
		if ev.GetEnd() != nil {
			end = ev.GetEnd()
		}
	}
	// The terminal echoes the line, then cat writes it back; ^D ends cat.
	if string(out) != "hello\r\nhello\r\n" || end.GetStatus() != "exit status 0" {
		t.Fatalf("pty out %q end %v", out, end)
	}

	// Resize of a non-PTY process is an internal error.
	st2, pid2 := e.startWait(t, context.Background(), startReq("/bin/sleep", "30"))
	defer st2.Close()
	defer e.kill(pid2)
	_, err = e.proc.Update(context.Background(), connect.NewRequest(&pb.UpdateRequest{Process: sel(pid2), Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 1, Rows: 1}}}))
	wantCode(t, err, connect.CodeInternal, "no PTY")
}

func TestConnect(t *testing.T) {
	e := newTestEnv(t, nil)
	t.Run("replay after exit", func(t *testing.T) {
		r := e.run(t, context.Background(), startReq("/bin/sh", "-c", "exit 3"))
		st, err := e.proc.Connect(context.Background(), connect.NewRequest(&pb.ConnectRequest{Process: sel(r.pid)}))
		if err != nil {
			t.Fatal(err)
		}
		got := collect[*pb.ConnectResponse](t, st)
		if got.pid != r.pid || !proto.Equal(got.end, r.end) || got.end.GetExitCode() != 3 {
			t.Fatalf("replay %d %v, want %d %v", got.pid, got.end, r.pid, r.end)
		}
	})
	t.Run("unknown pid", func(t *testing.T) {
		st, err := e.proc.Connect(context.Background(), connect.NewRequest(&pb.ConnectRequest{Process: sel(4242424)}))
		if err == nil {
			for st.Receive() {
				t.Fatalf("unexpected event %v", st.Msg())
			}
			err = st.Err()
		}
		wantCode(t, err, connect.CodeNotFound, "process with pid 4242424 not found")
	})
	t.Run("attach live", func(t *testing.T) {
		st, pid := e.startWait(t, context.Background(), startReq("/bin/cat"))
		defer st.Close()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cst, err := e.proc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: sel(pid)}))
		if err != nil {
			t.Fatal(err)
		}
		if !cst.Receive() || cst.Msg().GetEvent().GetStart().GetPid() != pid {
			t.Fatalf("connect start: %v %v", cst.Msg(), cst.Err())
		}
		if _, err := e.proc.SendInput(context.Background(), connect.NewRequest(&pb.SendInputRequest{
			Process: sel(pid), Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("live")}}})); err != nil {
			t.Fatal(err)
		}
		if !cst.Receive() || string(cst.Msg().GetEvent().GetData().GetStdout()) != "live" {
			t.Fatalf("connect data: %v %v", cst.Msg(), cst.Err())
		}
		if _, err := e.proc.CloseStdin(context.Background(), connect.NewRequest(&pb.CloseStdinRequest{Process: sel(pid)})); err != nil {
			t.Fatal(err)
		}
		got := collectFrom(t, st, false)
		if string(got.stdout) != "live" {
			t.Fatalf("start stream got %q", got.stdout)
		}
		var end *pb.ProcessEvent_EndEvent
		for cst.Receive() {
			end = cst.Msg().GetEvent().GetEnd()
		}
		if end.GetStatus() != "exit status 0" {
			t.Fatalf("connect end %v", end)
		}
	})
}

func TestStartErrors(t *testing.T) {
	e := newTestEnv(t, nil)
	many := make([]string, maxArgs+1)
	envs := map[string]string{}
	for i := 0; i <= maxEnvs; i++ {
		envs[fmt.Sprintf("V%d", i)] = "x"
	}
	tests := []struct {
		name string
		req  func() *connect.Request[pb.StartRequest]
		code connect.Code
		msg  string
	}{
		{"unknown user", func() *connect.Request[pb.StartRequest] {
			r := startReq("/bin/echo")
			r.Header().Set("Authorization", "Basic bm9ib2R5X3g6") // "nobody_x:"
			return r
		}, connect.CodeUnauthenticated, "invalid username: 'nobody_x'"},
		{"missing cwd", func() *connect.Request[pb.StartRequest] {
			r := startReq("/bin/echo")
			r.Msg.Process.Cwd = proto.String("/nonexistent-corral-test")
			return r
		}, connect.CodeInvalidArgument, "cwd '/nonexistent-corral-test' does not exist"},
		{"too many args", func() *connect.Request[pb.StartRequest] {
			return startReq("/bin/echo", many...)
		}, connect.CodeInvalidArgument, "too many args"},
		{"args too long", func() *connect.Request[pb.StartRequest] {
			return startReq("/bin/echo", strings.Repeat("a", maxArgsBytes))
		}, connect.CodeInvalidArgument, "args too long"},
		{"too many envs", func() *connect.Request[pb.StartRequest] {
			r := startReq("/bin/echo")
			r.Msg.Process.Envs = envs
			return r
		}, connect.CodeInvalidArgument, "too many envs"},
		{"no such command", func() *connect.Request[pb.StartRequest] {
			return startReq("corral-no-such-command")
		}, connect.CodeInvalidArgument, "not found"},
		{"request over 1 MiB", func() *connect.Request[pb.StartRequest] {
			return startReq("/bin/echo", strings.Repeat("a", maxRequestBytes+1))
		}, connect.CodeResourceExhausted, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, err := e.proc.Start(context.Background(), tc.req())
			if err == nil {
				for st.Receive() {
					t.Fatalf("unexpected event %v", st.Msg())
				}
				err = st.Err()
			}
			wantCode(t, err, tc.code, tc.msg)
		})
	}
}

func TestEnvAndCwd(t *testing.T) {
	t.Setenv("CORRAL_ENV_GLOBAL_A", "from-sandbox")
	t.Setenv("CORRAL_ENV_OVERRIDE", "sandbox")
	t.Setenv("CORRAL_TEST_SECRET", "must-not-leak")
	e := newTestEnv(t, func(c *Config) { c.Env = nil })
	if err := os.Mkdir(e.home+"/sub", 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cwd  *string
		want string
	}{
		{"home by default", nil, e.home},
		{"relative to home", proto.String("sub"), e.home + "/sub"},
		{"tilde", proto.String("~/sub"), e.home + "/sub"},
		{"absolute", proto.String("/"), "/"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := startReq("/bin/sh", "-c", `echo "$PWD|$HOME|$USER|$LOGNAME|$GLOBAL_A|$OVERRIDE|$REQ|$CORRAL_TEST_SECRET|$CORRAL_ENV_GLOBAL_A"`)
			req.Msg.Process.Cwd = tc.cwd
			req.Msg.Process.Envs = map[string]string{"OVERRIDE": "request", "REQ": "r"}
			r := e.run(t, context.Background(), req)
			want := tc.want + "|" + e.home + "|root|root|from-sandbox|request|r||\n"
			if string(r.stdout) != want {
				t.Fatalf("got %q, want %q", r.stdout, want)
			}
		})
	}
	t.Run("user from Authorization", func(t *testing.T) {
		req := startReq("/bin/sh", "-c", `echo "$PWD|$HOME|$USER"`)
		req.Header().Set("Authorization", "Basic YWx0Og==") // "alt:"
		r := e.run(t, context.Background(), req)
		alt := filepath.Join(filepath.Dir(e.home), "alt")
		if want := alt + "|" + alt + "|alt\n"; string(r.stdout) != want {
			t.Fatalf("got %q, want %q", r.stdout, want)
		}
	})
	got := sandboxEnv([]string{"CORRAL_ENV_FOO=bar", "FOO=leak", "CORRAL_ENV_=x", "CORRAL_ENVX=y"})
	if strings.Join(got, ",") != "FOO=bar" {
		t.Fatalf("sandboxEnv = %v", got)
	}
}

func TestKeepalive(t *testing.T) {
	e := newTestEnv(t, nil)
	req := startReq("/bin/sleep", "2.5")
	req.Header().Set("Keepalive-Ping-Interval", "1")
	r := e.run(t, context.Background(), req)
	if r.keepalives < 2 {
		t.Fatalf("keepalives = %d, want >= 2", r.keepalives)
	}
}

// TestSlowConsumerBackpressure: a flood is not buffered without bound. The
// stream is not read for a while; the producer must be blocked (still
// running) rather than its output queued in the agent, and no byte may be
// lost once the consumer reads.
func TestSlowConsumerBackpressure(t *testing.T) {
	e := newTestEnv(t, nil)
	const total = 64 << 20
	st, pid := e.startWait(t, context.Background(), startReq("/bin/sh", "-c", fmt.Sprintf("/usr/bin/yes | /usr/bin/head -c %d", total)))
	defer st.Close()
	time.Sleep(1500 * time.Millisecond)
	if h := heapInUse(); h > total/2 {
		t.Fatalf("heap in use %d bytes while the consumer is stalled", h)
	}
	l, err := e.proc.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Msg.GetProcesses()) != 1 || l.Msg.GetProcesses()[0].GetPid() != pid {
		t.Fatalf("producer not blocked by the slow consumer: %v", l.Msg)
	}
	n, maxChunk := 0, 0
	var end *pb.ProcessEvent_EndEvent
	for st.Receive() {
		d := st.Msg().GetEvent().GetData().GetStdout()
		n += len(d)
		maxChunk = max(maxChunk, len(d))
		if x := st.Msg().GetEvent().GetEnd(); x != nil {
			end = x
		}
	}
	if n != total || end.GetStatus() != "exit status 0" {
		t.Fatalf("got %d bytes (want %d), end %v", n, total, end)
	}
	if maxChunk > pipeChunk {
		t.Fatalf("chunk of %d bytes > %d", maxChunk, pipeChunk)
	}
}

// zombies counts zombie children of this process.
func zombies(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	me := os.Getpid()
	n := 0
	for _, d := range ents {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		if ppid == me && f[0] == "Z" {
			n++
		}
	}
	return n
}

// TestReapsZombies: 200 short children, each leaving an orphaned grandchild
// that is re-parented to the agent (subreaper), leave no zombie behind.
func TestReapsZombies(t *testing.T) {
	e := newTestEnv(t, nil)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := 0; i < 200; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			st, err := e.proc.Start(context.Background(), startReq("/bin/sh", "-c", "/bin/sleep 0.2 >/dev/null & exit 0"))
			if err != nil {
				t.Error(err)
				return
			}
			defer st.Close()
			for st.Receive() {
			}
		}()
	}
	wg.Wait()
	if !eventually(5*time.Second, func() bool { return zombies(t) == 0 }) {
		t.Fatalf("%d zombies left", zombies(t))
	}
}

func heapInUse() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestOutputAfterExitSlowConsumer: output a process wrote before it
// exited is delivered whole however long its consumer takes to take it.
// The drain grace bounds only the wait for descendants that keep the
// pipes open; on a busy host, a stream slow to send was cut at that
// grace and the output left in the pipe was lost. The subscriber here
// holds no event until it is read, so the process's output (less than a
// pipe holds) stays in its pipe when it exits, and it is read only well
// after the grace.
func TestOutputAfterExitSlowConsumer(t *testing.T) {
	e := newTestEnv(t, nil)
	const total = 60_000
	u, _, err := e.srv.rpcUser(http.Header{})
	if err != nil {
		t.Fatal(err)
	}
	sp, err := e.srv.prepare(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/usr/bin/head", Args: []string{"-c", strconv.Itoa(total), "/dev/zero"}}}, u)
	if err != nil {
		t.Fatal(err)
	}
	sub := &subscriber{ch: make(chan *pb.ProcessEvent), done: make(chan struct{})}
	p, err := e.srv.spawn(sp, sub)
	if err != nil {
		t.Fatal(err)
	}
	defer p.unsubscribe(sub)
	if !eventually(30*time.Second, func() bool { return !alive(p.pid) }) {
		t.Fatal("the writer did not exit")
	}
	// The ordering under test: the writer has exited with output in its
	// pipe, and the consumer reads only after the drain grace.
	time.Sleep(3 * drainGrace)
	n := 0
	for {
		select {
		case ev := <-sub.ch:
			n += len(ev.GetData().GetStdout())
			continue
		case <-p.finished:
		}
		break
	}
	if end := p.endEvent(); n != total || end.GetStatus() != "exit status 0" {
		t.Fatalf("got %d bytes of stdout (want %d), end %v", n, total, end)
	}
}

// TestDrainEndsWithDescendants: descendants that inherited the output
// pipes do not hold the stream open after the process exits, whether
// they stay silent (drainGrace) or keep writing (drainMax); the
// process's own output arrives.
func TestDrainEndsWithDescendants(t *testing.T) {
	for _, tc := range []struct{ name, script string }{
		{"silent descendant", "/bin/sleep 30 & echo own"},
		{"writing descendant", "/usr/bin/yes & echo own"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, nil)
			st, pid := e.startWait(t, context.Background(), startReq("/bin/sh", "-c", tc.script))
			defer st.Close()
			defer func() { _ = syscall.Kill(-int(pid), syscall.SIGKILL) }()
			done := make(chan result, 1)
			go func() { done <- collectFrom[*pb.StartResponse](t, st, false) }()
			select {
			case r := <-done:
				if !strings.HasPrefix(string(r.stdout), "own\n") || r.end.GetStatus() != "exit status 0" {
					t.Fatalf("stdout %.40q (%d bytes), end %v", r.stdout, len(r.stdout), r.end)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the stream did not end after the process exited")
			}
		})
	}
}

// TestKillAfterExitSparesReusedPid: a signal for a process that has
// exited (its output may still be draining to a slow consumer) goes to
// its process group only, never to its pid alone, which may be another
// process's by then. The stand-in here is a live child in no group of
// its own, with the exited process's pid.
func TestKillAfterExitSparesReusedPid(t *testing.T) {
	other := exec.Command("/bin/sleep", "30")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Process.Kill(); _ = other.Wait() }()
	p := &proc{pid: other.Process.Pid}
	p.exited.Store(true)
	if err := p.kill(syscall.SIGKILL); err != syscall.ESRCH {
		t.Fatalf("kill of an exited process: %v, want ESRCH", err)
	}
	if !alive(other.Process.Pid) {
		t.Fatal("the process now holding the exited process's pid was killed")
	}
}
