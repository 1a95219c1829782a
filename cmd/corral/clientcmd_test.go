package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/corralhq/corral/proto/process"
	"github.com/corralhq/corral/proto/process/processconnect"
)

// fakeAgent scripts process.Process/Start by the program name.
type fakeAgent struct {
	processconnect.UnimplementedProcessHandler
	mu      sync.Mutex
	timeout string
}

func (f *fakeAgent) Start(ctx context.Context, req *connect.Request[process.StartRequest], st *connect.ServerStream[process.StartResponse]) error {
	f.mu.Lock()
	f.timeout = req.Header().Get("Connect-Timeout-Ms")
	f.mu.Unlock()
	send := func(ev *process.ProcessEvent) { _ = st.Send(&process.StartResponse{Event: ev}) }
	send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: 7}}})
	out := func(s string) {
		send(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{
			Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: []byte(s)}}}})
	}
	end := func(e *process.ProcessEvent_EndEvent) {
		send(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: e}})
	}
	switch req.Msg.GetProcess().GetCmd() {
	case "echo":
		out(strings.Join(req.Msg.GetProcess().GetArgs(), " ") + "\n")
		end(&process.ProcessEvent_EndEvent{Exited: true, Status: "exit status 0"})
	case "fail":
		end(&process.ProcessEvent_EndEvent{ExitCode: 3, Exited: true, Status: "exit status 3"})
	case "oom":
		out("allocating\n")
		end(&process.ProcessEvent_EndEvent{ExitCode: -1, Status: "signal: killed", EndReason: "oom"})
	case "sleep":
		end(&process.ProcessEvent_EndEvent{ExitCode: -1, Status: "signal: killed", TimedOut: true, EndReason: "timeout"})
	}
	return nil
}

const cliSandbox = `{"id":"sbcli","template":"base","runtime":"runc","state":"running","tier":"light",
"resources":{"cpu":1,"memory_mb":512,"disk_mb":1024,"pids":256,"nofile":1024},"command_timeout":30,
"network":"none","metadata":{},"created_at":"2026-01-01T00:00:00Z","expires_at":"2099-01-01T00:00:00Z","ended_at":null,"end_reason":""}`

func cliServer(t *testing.T) (*httptest.Server, *fakeAgent, *[]string) {
	fa := &fakeAgent{}
	var calls []string
	var mu sync.Mutex
	mux := http.NewServeMux()
	p, h := processconnect.NewProcessHandler(fa)
	mux.Handle("/v1/sandboxes/sbcli/agent"+p, http.StripPrefix("/v1/sandboxes/sbcli/agent", h))
	mux.HandleFunc("/v1/sandboxes/sbcli/agent/files", func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "POST" {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			calls = append(calls, "upload "+r.URL.Query().Get("path")+" "+string(b))
			mu.Unlock()
			io.WriteString(w, `[{"path":"/x","name":"x","type":"file"}]`)
			return
		}
		if r.URL.Query().Get("path") == "dir" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(400)
			io.WriteString(w, `{"code":400,"message":"path 'dir' is a directory"}`)
			return
		}
		io.WriteString(w, "remote content")
	})
	mux.HandleFunc("/v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls = append(calls, r.Method+" "+r.URL.Path)
		mu.Unlock()
		if r.Method == "POST" {
			b, _ := io.ReadAll(r.Body)
			if strings.Contains(string(b), `"memory_mb":1`) && !strings.Contains(string(b), `"memory_mb":10`) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(400)
				io.WriteString(w, `{"code":"invalid_argument","message":"memory_mb must be 16..262144"}`)
				return
			}
			w.WriteHeader(201)
			io.WriteString(w, cliSandbox)
			return
		}
		io.WriteString(w, `{"sandboxes":[`+cliSandbox+`]}`)
	})
	mux.HandleFunc("/v1/sandboxes/sbcli", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls = append(calls, r.Method+" "+r.URL.Path)
		mu.Unlock()
		io.WriteString(w, cliSandbox)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, fa, &calls
}

// runCLI runs the client commands with args and returns stdout, stderr and
// the exit code main would use.
func runCLI(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	root := &cobra.Command{Use: "corral", SilenceUsage: true, SilenceErrors: true}
	addClientCommands(root)
	root.SetArgs(args)
	oldOut, oldErr := os.Stdout, os.Stderr
	outR, outW, _ := os.Pipe()
	errR, errW, _ := os.Pipe()
	os.Stdout, os.Stderr = outW, errW
	var stdout, stderr []byte
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { stdout, _ = io.ReadAll(outR); wg.Done() }()
	go func() { stderr, _ = io.ReadAll(errR); wg.Done() }()
	err := root.Execute()
	os.Stdout, os.Stderr = oldOut, oldErr
	outW.Close()
	errW.Close()
	wg.Wait()
	code := 0
	if err != nil {
		var ec exitCoder
		if asExitCoder(err, &ec) {
			code = ec.ExitCode()
		} else {
			var b strings.Builder
			printError(&b, err)
			stderr = append(stderr, b.String()...)
			code = 1
		}
	}
	return string(stdout), string(stderr), code
}

func TestCLIRunExitCodes(t *testing.T) {
	srv, fa, calls := cliServer(t)
	t.Setenv("CORRAL_URL", srv.URL)
	t.Setenv("CORRAL_API_KEY", "k")
	for _, tc := range []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{[]string{"run", "--no-stdin", "--", "echo", "hi", "there"}, 0, "hi there\n", ""},
		{[]string{"run", "--no-stdin", "echo", "-n"}, 0, "-n\n", ""},
		{[]string{"run", "--no-stdin", "--", "fail"}, 3, "", ""},
		{[]string{"run", "--no-stdin", "--memory", "1g", "--", "oom"}, 137, "allocating\n", "corral: command ended: oom\n"},
		{[]string{"run", "--no-stdin", "--timeout", "2s", "--", "sleep", "9"}, 124, "", "corral: command ended: timeout\n"},
		{[]string{"sandbox", "exec", "--no-stdin", "sbcli", "--", "echo", "x"}, 0, "x\n", ""},
		{[]string{"sandbox", "exec", "--no-stdin", "--timeout", "1.5", "sbcli", "sleep"}, 124, "", "corral: command ended: timeout\n"},
	} {
		out, errOut, code := runCLI(t, tc.args...)
		if code != tc.code || out != tc.stdout || errOut != tc.stderr {
			t.Errorf("%q: code %d stdout %q stderr %q; want %d %q %q", tc.args, code, out, errOut, tc.code, tc.stdout, tc.stderr)
		}
	}
	fa.mu.Lock()
	if fa.timeout != "1500" {
		t.Errorf("exec --timeout 1.5 sent Connect-Timeout-Ms %q", fa.timeout)
	}
	fa.mu.Unlock()
	// run creates and kills its sandbox.
	joined := strings.Join(*calls, ",")
	if strings.Count(joined, "POST /v1/sandboxes") < 5 || strings.Count(joined, "DELETE /v1/sandboxes/sbcli") < 5 {
		t.Errorf("calls %s", joined)
	}
	// Default timeout: the sandbox's command_timeout (30 s).
	runCLI(t, "run", "--no-stdin", "--", "echo")
	fa.mu.Lock()
	if fa.timeout != "30000" {
		t.Errorf("default timeout header %q", fa.timeout)
	}
	fa.mu.Unlock()
}

func TestCLIErrors(t *testing.T) {
	srv, _, _ := cliServer(t)
	t.Setenv("CORRAL_URL", srv.URL)
	t.Setenv("CORRAL_API_KEY", "k")
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"run", "--memory", "1", "--", "echo"}, 2, "memory_mb must be"},
		{[]string{"run", "--memory", "zz", "--", "echo"}, 2, "invalid size"},
		{[]string{"run", "--timeout", "-3s", "--", "echo"}, 2, "--timeout"},
		{[]string{"run"}, 2, "expected a command"},
		{[]string{"run", "--nope"}, 2, "unknown flag"},
		{[]string{"sandbox", "exec", "sbcli"}, 2, "expected ID and a command"},
		{[]string{"sandbox", "timeout", "sbcli", "soon"}, 2, "invalid duration"},
		{[]string{"sandbox", "cp", "a", "b"}, 2, "exactly one of SRC and DST"},
		{[]string{"sandbox", "cp", "sbcli:dir", "out"}, 1, "directories not supported yet"},
		{[]string{"sandbox", "ls", "--metadata", "x"}, 2, "KEY=VALUE"},
	} {
		_, errOut, code := runCLI(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.msg) {
			t.Errorf("%q: code %d stderr %q; want %d containing %q", tc.args, code, errOut, tc.code, tc.msg)
		}
	}
}

func TestCLISandboxCommands(t *testing.T) {
	srv, _, calls := cliServer(t)
	t.Setenv("CORRAL_URL", srv.URL)
	t.Setenv("CORRAL_API_KEY", "k")
	out, _, code := runCLI(t, "sandbox", "create", "--tier", "light")
	if code != 0 || out != "sbcli\n" {
		t.Fatalf("create: %d %q", code, out)
	}
	out, _, code = runCLI(t, "sandbox", "get", "--json", "sbcli")
	if code != 0 || !strings.Contains(out, `"id": "sbcli"`) || !strings.Contains(out, `"command_timeout": 30`) {
		t.Fatalf("get: %d %q", code, out)
	}
	out, _, code = runCLI(t, "sandbox", "ls")
	if code != 0 || !strings.HasPrefix(out, "ID ") || !strings.Contains(out, "sbcli") {
		t.Fatalf("ls: %d %q", code, out)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "in.txt")
	os.WriteFile(src, []byte("local content"), 0o644)
	if _, e, code := runCLI(t, "sandbox", "cp", src, "sbcli:/tmp/"); code != 0 {
		t.Fatalf("upload: %d %s", code, e)
	}
	if !strings.Contains(strings.Join(*calls, ","), "upload /tmp/in.txt local content") {
		t.Fatalf("upload calls %q", *calls)
	}
	if _, e, code := runCLI(t, "sandbox", "cp", "sbcli:/etc/motd", dir); code != 0 {
		t.Fatalf("download: %d %s", code, e)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "motd")); string(b) != "remote content" {
		t.Fatalf("downloaded %q", b)
	}
	if _, e, code := runCLI(t, "sandbox", "cp", dir, "sbcli:/tmp/x"); code != 1 || !strings.Contains(e, "directories not supported yet") {
		t.Fatalf("dir upload: %d %s", code, e)
	}
}
