package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/server"
	"github.com/corralhq/corral/internal/watchdog"
	corral "github.com/corralhq/corral/sdk/go"
)

// ciLine is one line of the code interpreter's NDJSON stream.
type ciLine map[string]any

func (l ciLine) str(k string) string { s, _ := l[k].(string); return s }

// ciSandbox is a sandbox of the code-interpreter template, reached by its
// port 49999 through corral's port route.
type ciSandbox struct {
	id, token string
	client    *http.Client
}

// newInterpreter creates a code-interpreter sandbox through the E2B API
// (for its access token) and waits until its server answers /health.
func newInterpreter(t *testing.T) *ciSandbox {
	t.Helper()
	var tv struct {
		Templates []struct {
			Name string `json:"name"`
		} `json:"templates"`
	}
	call(t, "GET", "/v1/templates?name=code-interpreter", nil, &tv)
	if len(tv.Templates) == 0 {
		t.Fatal("the code-interpreter template is not built for this host's uid range: run `make code-interpreter` " +
			"(corral template build-code-interpreter); tests never download it")
	}
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	start := time.Now()
	status, _, body := rest(t, env.url, env.key, "POST", "/sandboxes", map[string]any{"templateID": "code-interpreter", "timeout": 600}, &sb)
	if status != 201 || sb.SandboxID == "" {
		t.Fatalf("E2B create of code-interpreter: %d %s", status, body)
	}
	t.Cleanup(func() { rest(t, env.url, env.key, "DELETE", "/sandboxes/"+sb.SandboxID, nil, nil) })
	s := &ciSandbox{id: sb.SandboxID, token: sb.EnvdAccessToken, client: &http.Client{Timeout: 2 * time.Minute}}
	t.Cleanup(func() {
		if t.Failed() {
			r := sh(t, s.id, "ls -la /tmp; ps -ef; tail -c 8000 /tmp/corral-interpreter.log")
			t.Logf("the interpreter server's log:\n%s%s", r.Stdout, r.Stderr)
		}
	})
	waitFor(t, "the interpreter server's /health", 60*time.Second, func() bool {
		code, b := s.do(t, "GET", "/health", nil)
		return code == 200 && strings.TrimSpace(b) == `"OK"`
	})
	healthy := time.Since(start)
	if got := mainText(t, s.exec(t, map[string]any{"code": "1 + 1"})); got != "2" {
		t.Fatalf("first run: %q", got)
	}
	first := time.Since(start)
	runStart := time.Now()
	s.exec(t, map[string]any{"code": "1 + 1"})
	t.Logf("code-interpreter sandbox: created and server healthy after %s, first run (kernel start) done after %s; a warm run of 1 + 1 took %s",
		healthy.Round(time.Millisecond), first.Round(time.Millisecond), time.Since(runStart).Round(time.Millisecond))
	return s
}

func (s *ciSandbox) request(ctx context.Context, method, path string, body any) *http.Request {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequestWithContext(ctx, method, env.url+path, rd)
	req.Host = "49999-" + s.id + ".corral.test"
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Access-Token", s.token)
	return req
}

// do makes one request and returns the status and body.
func (s *ciSandbox) do(t *testing.T, method, path string, body any) (int, string) {
	t.Helper()
	resp, err := s.client.Do(s.request(context.Background(), method, path, body))
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// exec runs one /execute and returns its lines; it fails the test unless
// the stream is 200 and ends with end_of_execution.
func (s *ciSandbox) exec(t *testing.T, body map[string]any) []ciLine {
	t.Helper()
	resp, err := s.client.Do(s.request(context.Background(), "POST", "/execute", body))
	if err != nil {
		t.Fatalf("execute %v: %v", body, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("execute %v: %d %s", body, resp.StatusCode, b)
	}
	var lines []ciLine
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		var l ciLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("execute %v: line %q: %v", body, sc.Text(), err)
		}
		lines = append(lines, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("execute %v: read: %v", body, err)
	}
	if len(lines) == 0 || lines[len(lines)-1].str("type") != "end_of_execution" {
		t.Fatalf("execute %v: stream does not end with end_of_execution: %v", body, lines)
	}
	return lines
}

func ofType(lines []ciLine, typ string) []ciLine {
	var out []ciLine
	for _, l := range lines {
		if l.str("type") == typ {
			out = append(out, l)
		}
	}
	return out
}

// mainText returns the text of the run's main result, failing without one.
func mainText(t *testing.T, lines []ciLine) string {
	t.Helper()
	for _, l := range ofType(lines, "result") {
		if l["is_main_result"] == true {
			return l.str("text")
		}
	}
	t.Fatalf("no main result in %v", lines)
	return ""
}

// noError fails the test when the run sent an error line.
func noError(t *testing.T, lines []ciLine) {
	t.Helper()
	if e := ofType(lines, "error"); len(e) > 0 {
		t.Fatalf("run failed: %v", e)
	}
}

// TestInterpreter drives the code-interpreter server of a real sandbox by
// its port 49999 (host 49999-<id>.<domain>): state persists between runs,
// every line type of the stream (stdout, stderr, results, error, execution
// count, end of execution), contexts (separate state and cwd, list,
// restart clearing state but keeping cwd, remove), refused requests with
// their codes, per-run environment variables set and reset, a matplotlib
// figure as a PNG without plt.show(), a data frame as HTML and data.
func TestInterpreter(t *testing.T) {
	need(t)
	s := newInterpreter(t)

	t.Run("state persists across runs", func(t *testing.T) {
		noError(t, s.exec(t, map[string]any{"code": "x = 41"}))
		if got := mainText(t, s.exec(t, map[string]any{"code": "x + 1"})); got != "42" {
			t.Fatalf("x + 1 = %q, want 42", got)
		}
	})

	t.Run("stream lines", func(t *testing.T) {
		lines := s.exec(t, map[string]any{"code": "import sys\nprint('to out')\nprint('to err', file=sys.stderr)\n6 * 7"})
		noError(t, lines)
		out, errs := ofType(lines, "stdout"), ofType(lines, "stderr")
		if len(out) != 1 || out[0].str("text") != "to out\n" || out[0].str("timestamp") == "" {
			t.Errorf("stdout lines %v", out)
		}
		if len(errs) != 1 || errs[0].str("text") != "to err\n" {
			t.Errorf("stderr lines %v", errs)
		}
		if got := mainText(t, lines); got != "42" {
			t.Errorf("main result %q", got)
		}
		n := ofType(lines, "number_of_executions")
		if len(n) != 1 || n[0]["execution_count"].(float64) < 3 {
			t.Errorf("execution count lines %v", n)
		}
		// The count goes up by one per run.
		next := ofType(s.exec(t, map[string]any{"code": "None"}), "number_of_executions")
		if len(next) != 1 || next[0]["execution_count"].(float64) != n[0]["execution_count"].(float64)+1 {
			t.Errorf("next execution count %v after %v", next, n)
		}
		// A string's text is without its quotes.
		if got := mainText(t, s.exec(t, map[string]any{"code": "'hello'"})); got != "hello" {
			t.Errorf("'hello' gives text %q", got)
		}
	})

	t.Run("error", func(t *testing.T) {
		lines := s.exec(t, map[string]any{"code": "print('before')\n1/0\nprint('after')"})
		e := ofType(lines, "error")
		if len(e) != 1 || e[0].str("name") != "ZeroDivisionError" || e[0].str("value") != "division by zero" ||
			!strings.Contains(e[0].str("traceback"), "ZeroDivisionError") {
			t.Fatalf("error lines %v", e)
		}
		if out := ofType(lines, "stdout"); len(out) != 1 || out[0].str("text") != "before\n" {
			t.Fatalf("stdout around the error %v", out)
		}
	})

	t.Run("contexts", func(t *testing.T) {
		code, body := s.do(t, "POST", "/contexts", map[string]any{"language": "python", "cwd": "/tmp"})
		var c struct{ ID, Language, Cwd string }
		if code != 200 || json.Unmarshal([]byte(body), &c) != nil || c.ID == "" || c.Language != "python" || c.Cwd != "/tmp" {
			t.Fatalf("create context: %d %s", code, body)
		}
		noError(t, s.exec(t, map[string]any{"code": "y = 'mine'", "context_id": c.ID}))
		if got := mainText(t, s.exec(t, map[string]any{"code": "import os\n(y, os.getcwd())", "context_id": c.ID})); got != "('mine', '/tmp')" {
			t.Fatalf("new context state and cwd: %q", got)
		}
		if got := mainText(t, s.exec(t, map[string]any{"code": "import os\n('y' in globals(), os.getcwd(), x)"})); got != "(False, '/home/user', 41)" {
			t.Fatalf("default context sees %q", got)
		}
		code, body = s.do(t, "GET", "/contexts", nil)
		var list []struct{ ID, Language, Cwd string }
		if code != 200 || json.Unmarshal([]byte(body), &list) != nil || len(list) < 2 {
			t.Fatalf("list contexts: %d %s", code, body)
		}
		found := false
		for _, l := range list {
			found = found || l.ID == c.ID && l.Cwd == "/tmp"
		}
		if !found {
			t.Fatalf("list %s lacks %s", body, c.ID)
		}
		if code, body := s.do(t, "POST", "/contexts/"+c.ID+"/restart", nil); code != 200 {
			t.Fatalf("restart: %d %s", code, body)
		}
		if got := mainText(t, s.exec(t, map[string]any{"code": "import os\n('y' in globals(), os.getcwd())", "context_id": c.ID})); got != "(False, '/tmp')" {
			t.Fatalf("after restart: %q", got)
		}
		if code, body := s.do(t, "DELETE", "/contexts/"+c.ID, nil); code != 204 {
			t.Fatalf("remove: %d %s", code, body)
		}
		code, body = s.do(t, "POST", "/execute", map[string]any{"code": "1", "context_id": c.ID})
		if code != 404 || body != "Context "+c.ID+" not found" {
			t.Fatalf("run in a removed context: %d %q", code, body)
		}
	})

	t.Run("refused requests", func(t *testing.T) {
		for _, tc := range []struct {
			name, method, path string
			body               any
			code               int
			has                string
		}{
			{"context and language", "POST", "/execute", map[string]any{"code": "1", "context_id": "x", "language": "python"}, 400, "not both"},
			{"unknown language", "POST", "/execute", map[string]any{"code": "1", "language": "cobol"}, 400, "'cobol' is not supported"},
			{"language without a kernel", "POST", "/contexts", map[string]any{"language": "js"}, 400, "'js' is not supported"},
			{"unknown context", "POST", "/execute", map[string]any{"code": "1", "context_id": "nosuch"}, 404, "Context nosuch not found"},
			{"restart unknown", "POST", "/contexts/nosuch/restart", nil, 404, "Context nosuch not found"},
			{"code not a string", "POST", "/execute", map[string]any{"code": 1}, 400, "code"},
			{"relative cwd", "POST", "/contexts", map[string]any{"cwd": "tmp"}, 400, "absolute"},
		} {
			code, body := s.do(t, tc.method, tc.path, tc.body)
			if code != tc.code || !strings.Contains(body, tc.has) {
				t.Errorf("%s: %d %q, want %d with %q", tc.name, code, body, tc.code, tc.has)
			}
		}
		if got := mainText(t, s.exec(t, map[string]any{"code": "x", "language": "Python"})); got != "41" {
			t.Errorf("language Python is the default context: %q", got)
		}
	})

	t.Run("env vars per run", func(t *testing.T) {
		lines := s.exec(t, map[string]any{"code": "import os\nos.environ.get('CI_VAR')", "env_vars": map[string]string{"CI_VAR": "per-run"}})
		if got := mainText(t, lines); got != "per-run" {
			t.Fatalf("env var in its run: %q", got)
		}
		if got := mainText(t, s.exec(t, map[string]any{"code": "import os\nstr(os.environ.get('CI_VAR'))"})); got != "None" {
			t.Fatalf("env var after its run: %q", got)
		}
	})

	t.Run("matplotlib figure", func(t *testing.T) {
		lines := s.exec(t, map[string]any{"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')\nNone"})
		noError(t, lines)
		var png string
		var chart map[string]any
		for _, r := range ofType(lines, "result") {
			if r["is_main_result"] == false && r.str("png") != "" {
				png = r.str("png")
				chart, _ = r["chart"].(map[string]any)
			}
		}
		b, err := base64.StdEncoding.DecodeString(png)
		if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
			t.Fatalf("no PNG display result in %v", ofType(lines, "result"))
		}
		if chart["type"] != "line" || chart["title"] != "squares" {
			t.Errorf("chart %v", chart)
		}
	})

	t.Run("data frame", func(t *testing.T) {
		lines := s.exec(t, map[string]any{"code": "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})"})
		noError(t, lines)
		for _, r := range ofType(lines, "result") {
			if r["is_main_result"] != true {
				continue
			}
			if !strings.Contains(r.str("html"), "<table") {
				t.Errorf("html %q", r.str("html"))
			}
			data, _ := json.Marshal(r["data"])
			if string(data) != `{"a":[1,2],"b":["x","y"]}` {
				t.Errorf("data %s", data)
			}
			return
		}
		t.Fatalf("no main result: %v", lines)
	})
}

// TestInterpreterRunAfterError: a run right after an error runs.
// Defends against the kernel's abort window: sent with stop_on_error, a
// request arriving within stop_on_error_timeout of an error came back
// "aborted" with no result and no error (the E2B SDK saw a run with no
// text). The sandbox's own kernel config widens the window to a minute,
// so that without the fix this fails every time, not only on a loaded
// host. It has a sandbox of its own: with TestInterpreter's runs, its
// runs would pass the sandbox's implicit task's budget of 30 tool calls.
func TestInterpreterRunAfterError(t *testing.T) {
	need(t)
	s := newInterpreter(t)
	config := `import os, IPython.paths
d = os.path.join(IPython.paths.get_ipython_dir(), 'profile_default')
os.makedirs(d, exist_ok=True)
open(os.path.join(d, 'ipython_kernel_config.py'), 'w').write('c.Kernel.stop_on_error_timeout = 60.0\n')`
	noError(t, s.exec(t, map[string]any{"code": config}))
	code, body := s.do(t, "POST", "/contexts", map[string]any{"language": "python"})
	var c struct{ ID string }
	if code != 200 || json.Unmarshal([]byte(body), &c) != nil || c.ID == "" {
		t.Fatalf("create context: %d %s", code, body)
	}
	defer s.do(t, "DELETE", "/contexts/"+c.ID, nil)
	if got := mainText(t, s.exec(t, map[string]any{"code": "import IPython\nIPython.get_ipython().kernel.stop_on_error_timeout", "context_id": c.ID})); got != "60.0" {
		t.Fatalf("the kernel did not take the sandbox's config: stop_on_error_timeout %q", got)
	}
	for i := range 3 {
		if e := ofType(s.exec(t, map[string]any{"code": "1/0", "context_id": c.ID}), "error"); len(e) != 1 || e[0].str("name") != "ZeroDivisionError" {
			t.Fatalf("round %d: error lines %v", i, e)
		}
		lines := s.exec(t, map[string]any{"code": "'ran'", "context_id": c.ID})
		noError(t, lines)
		if got := mainText(t, lines); got != "ran" {
			t.Fatalf("round %d: the run after an error gave %q", i, got)
		}
	}
}

// TestInterpreterInterrupts defends against a run that never ends taking
// its context (and every later caller) with it: a run's timeout
// interrupts the kernel and the caller gets a TimeoutError while the
// context keeps its state; code that ignores the interrupt gets its
// kernel restarted after the grace and the context works again; and a
// client that disconnects mid-run (as the E2B SDK does when its own
// timeout fires) interrupts the run, so that the next run on the context
// is not stuck behind it.
func TestInterpreterInterrupts(t *testing.T) {
	need(t)
	s := newInterpreter(t)
	noError(t, s.exec(t, map[string]any{"code": "kept = 'yes'"}))

	t.Run("timeout interrupts", func(t *testing.T) {
		lines := s.exec(t, map[string]any{"code": "import time\nprint('started', flush=True)\ntime.sleep(600)", "timeout": 1})
		e := ofType(lines, "error")
		if len(e) != 1 || e[0].str("name") != "TimeoutError" || !strings.Contains(e[0].str("value"), "keeps its state") {
			t.Fatalf("error lines %v", e)
		}
		if got := mainText(t, s.exec(t, map[string]any{"code": "kept"})); got != "yes" {
			t.Fatalf("state after the interrupt: %q", got)
		}
	})

	// A kernel ignores SIGINT until it executes a request (ipykernel sets
	// SIG_IGN outside its handlers), and on a busy host a run can wait
	// for its kernel longer than its timeout, or than its client stays:
	// an interrupt sent then was lost, the run went on, and the kernel was
	// restarted after the grace, taking the context's state. Here the
	// kernel is made to hold the next request for 3 s (slowKernel) before
	// executing it, so that the timeout (1 s) and the hang-up fall in that
	// window every time.
	t.Run("timeout while the kernel has not started the run", func(t *testing.T) {
		noError(t, s.exec(t, map[string]any{"code": "kept = 'yes'"}))
		noError(t, s.exec(t, map[string]any{"code": slowKernel(3)}))
		lines := s.exec(t, map[string]any{"code": "import time\ntime.sleep(600)", "timeout": 1})
		e := ofType(lines, "error")
		if len(e) != 1 || e[0].str("name") != "TimeoutError" || !strings.Contains(e[0].str("value"), "keeps its state") {
			t.Fatalf("error lines %v", e)
		}
		if got := mainText(t, s.exec(t, map[string]any{"code": "kept"})); got != "yes" {
			t.Fatalf("state after the timeout: %q", got)
		}
	})

	// IPython swallows a KeyboardInterrupt raised in its event callbacks
	// (pre_run_cell runs right after the run starts; on a busy host they
	// can take a while) and runs the code on: one interrupt sent then was
	// lost and the kernel restarted after the grace. Here a callback
	// sleeps through the timeout's interrupt.
	t.Run("interrupt swallowed by a callback is sent again", func(t *testing.T) {
		noError(t, s.exec(t, map[string]any{"code": "kept = 'yes'"}))
		noError(t, s.exec(t, map[string]any{"code": `import time as __t
__ip = get_ipython()
def __slow_cb(*args):
    __ip.events.unregister("pre_run_cell", __slow_cb)
    __t.sleep(2)
__ip.events.register("pre_run_cell", __slow_cb)`}))
		lines := s.exec(t, map[string]any{"code": "import time\ntime.sleep(600)", "timeout": 1})
		e := ofType(lines, "error")
		if len(e) != 1 || e[0].str("name") != "TimeoutError" || !strings.Contains(e[0].str("value"), "keeps its state") {
			t.Fatalf("error lines %v", e)
		}
		if got := mainText(t, s.exec(t, map[string]any{"code": "kept"})); got != "yes" {
			t.Fatalf("state after the timeout: %q", got)
		}
	})

	t.Run("disconnect while the kernel has not started the run", func(t *testing.T) {
		mustSh(t, s.id, "rm -f /tmp/corral-slow-kernel")
		noError(t, s.exec(t, map[string]any{"code": "kept = 'yes'"}))
		noError(t, s.exec(t, map[string]any{"code": slowKernel(5)}))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan struct{})
		go func() {
			defer close(done)
			// The answer's first line comes once the kernel executes the
			// run, after the hang-up: this request only ends by it.
			if resp, err := s.client.Do(s.request(ctx, "POST", "/execute", map[string]any{"code": "import time\ntime.sleep(600)"})); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		waitFor(t, "the kernel to hold the run", 60*time.Second, func() bool {
			return sh(t, s.id, "test -e /tmp/corral-slow-kernel").ExitCode == 0
		})
		cancel()
		<-done
		lines := s.exec(t, map[string]any{"code": "kept"})
		noError(t, lines)
		if got := mainText(t, lines); got != "yes" {
			t.Fatalf("state after the hang-up: %q", got)
		}
	})

	// A native run's timeout counts from its start, not from the request:
	// the kernel holds the run longer than its timeout before executing
	// it (as a busy host, a kernel start or an earlier run does), and the
	// run still runs and answers.
	t.Run("native timeout counts from the run's start", func(t *testing.T) {
		noError(t, s.exec(t, map[string]any{"code": slowKernel(6)}))
		var out struct {
			Results  []map[string]any `json:"results"`
			Error    map[string]any   `json:"error"`
			TimedOut bool             `json:"timed_out"`
		}
		if st := call(t, "POST", "/v1/sandboxes/"+s.id+"/code", map[string]any{"code": "6 * 7", "timeout": 3}, &out); st != 200 {
			t.Fatalf("native run: %d", st)
		}
		if out.Error != nil || out.TimedOut || len(out.Results) != 1 || out.Results[0]["text"] != "42" {
			t.Fatalf("a run held by its kernel past its timeout before it started: %+v", out)
		}
	})

	t.Run("interrupt ignored", func(t *testing.T) {
		lines := s.exec(t, map[string]any{"code": "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(600)", "timeout": 1})
		e := ofType(lines, "error")
		if len(e) != 1 || e[0].str("name") != "TimeoutError" || !strings.Contains(e[0].str("value"), "restarted") {
			t.Fatalf("error lines %v", e)
		}
		if got := mainText(t, s.exec(t, map[string]any{"code": "'kept' in globals(), 1 + 1"})); got != "(False, 2)" {
			t.Fatalf("after the restart: %q", got)
		}
		noError(t, s.exec(t, map[string]any{"code": "kept = 'again'"}))
	})

	t.Run("disconnect interrupts", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		resp, err := s.client.Do(s.request(ctx, "POST", "/execute", map[string]any{"code": "import time\nprint('running', flush=True)\ntime.sleep(600)"}))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() && !strings.Contains(sc.Text(), `"running`) {
		}
		// The run is in its sleep: hang up.
		cancel()
		resp.Body.Close()
		lines := s.exec(t, map[string]any{"code": "kept"})
		if got := mainText(t, lines); got != "again" {
			t.Fatalf("run after the disconnect: %q", got)
		}
		// The interrupted run left no error behind for the next caller.
		noError(t, lines)
	})
}

// TestInterpreterPool: the code-interpreter template works with a warm
// pool: a create takes the pooled sandbox (a pool hit), whose server is
// started at the claim, and runs code with state kept between runs.
func TestInterpreterPool(t *testing.T) {
	need(t)
	ctx := context.Background()
	c := corral.New(env.url, env.key)
	if _, err := c.SetPool(ctx, "code-interpreter", 1, 1, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = c.SetPool(context.Background(), "code-interpreter", 0, 0, 0) })
	pool := func() corral.Pool {
		ps, err := c.Pools(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if p.Template == "code-interpreter" {
				return p
			}
		}
		t.Fatalf("no code-interpreter pool in %v", ps)
		return corral.Pool{}
	}
	waitFor(t, "the code-interpreter pool to fill", 2*time.Minute, func() bool { return pool().Idle == 1 })
	hits := pool().Hits
	s := newInterpreter(t)
	if got := pool().Hits; got != hits+1 {
		t.Fatalf("pool hits %d after the create, want %d: the create did not take the pooled sandbox", got, hits+1)
	}
	noError(t, s.exec(t, map[string]any{"code": "pooled = 'yes'"}))
	if got := mainText(t, s.exec(t, map[string]any{"code": "pooled"})); got != "yes" {
		t.Fatalf("state in the pooled sandbox: %q", got)
	}
}

// TestInterpreterMemoryBomb: a memory bomb in a real kernel is stopped
// at the sandbox's memory limit and reported as such — the run ends
// with OutOfMemoryError and oom, the code.run event says oom — and the
// context can run code again afterwards (the server replaces the dead
// kernel); the sandbox lives on.
func TestInterpreterMemoryBomb(t *testing.T) {
	need(t)
	s := newInterpreter(t)
	var out struct {
		OOM   bool `json:"oom"`
		Error *struct {
			Name string `json:"name"`
		} `json:"error"`
	}
	bomb := "a = []\nwhile True:\n    a.append(bytearray(16 << 20))"
	if st := call(t, "POST", "/v1/sandboxes/"+s.id+"/code", map[string]any{"code": bomb, "timeout": 120}, &out); st != 200 {
		t.Fatalf("run of a memory bomb: %d", st)
	}
	if !out.OOM || out.Error == nil || out.Error.Name != "OutOfMemoryError" {
		t.Fatalf("a memory bomb's run: %+v (error %+v); want oom and OutOfMemoryError", out, out.Error)
	}
	var evs struct {
		Events []struct {
			Data struct {
				Run struct {
					OOM bool `json:"oom"`
				} `json:"run"`
			} `json:"data"`
		} `json:"events"`
	}
	call(t, "GET", "/v1/audit?sandbox="+s.id+"&kind=code.run", nil, &evs)
	oomed := false
	for _, ev := range evs.Events {
		oomed = oomed || ev.Data.Run.OOM
	}
	if !oomed {
		t.Errorf("no code.run event of the sandbox says oom: %+v", evs.Events)
	}
	var again struct {
		Results []map[string]any `json:"results"`
		Error   any              `json:"error"`
	}
	waitFor(t, "the context to run code again", 60*time.Second, func() bool {
		again.Results, again.Error = nil, nil
		st := call(t, "POST", "/v1/sandboxes/"+s.id+"/code", map[string]any{"code": "6 * 7", "timeout": 60}, &again)
		return st == 200 && again.Error == nil && len(again.Results) == 1 && again.Results[0]["text"] == "42"
	})
}

// TestInterpreterCPURunaway: the CPU-runaway rule sees a spinning kernel
// like any process of the sandbox: a run of `while True: pass` with no
// timeout in a half-core code-interpreter sandbox ends the sandbox
// cpu_runaway (runaway period 20 s here: the kernel's own start is
// CPU-bound for seconds at half a core, longer on a busy host, and must
// not be what trips the rule), and the run's caller gets an answer
// instead of waiting forever.
func TestInterpreterCPURunaway(t *testing.T) {
	s := startGovServer(t, "runaway-kernel", func(c *server.Config) {
		c.Watchdog = watchdog.Config{CPURunawayFor: 20 * time.Second}
	})
	ctx := context.Background()
	sb, err := s.c.Create(ctx, corral.CreateOptions{Template: "code-interpreter", Resources: corral.Resources{CPU: 0.5}})
	if err != nil {
		t.Fatalf("create a code-interpreter sandbox on the runaway server: %v", err)
	}
	t.Cleanup(func() { _, _ = s.c.Kill(context.Background(), sb.ID) })
	run := func(code string) (int, string) {
		body, _ := json.Marshal(map[string]any{"code": code, "timeout": 600})
		req, _ := http.NewRequest("POST", s.url+"/v1/sandboxes/"+sb.ID+"/code", strings.NewReader(string(body)))
		req.Header.Set("X-API-Key", s.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, b := run("1 + 1"); st != 200 || !strings.Contains(b, `"text":"2"`) {
		t.Fatalf("first run: %d %s", st, b)
	}
	done := make(chan string, 1)
	go func() {
		st, b := run("while True:\n    pass")
		done <- fmt.Sprintf("%d %s", st, b)
	}()
	waitFor(t, "the spinning kernel's sandbox to end", 3*time.Minute, func() bool {
		got, err := s.c.Get(ctx, sb.ID)
		return err == nil && got.State == corral.StateEnded
	})
	got, _ := s.c.Get(ctx, sb.ID)
	if got.EndReason != "cpu_runaway" {
		t.Fatalf("the spinning kernel's sandbox ended %q, want cpu_runaway", got.EndReason)
	}
	select {
	case answer := <-done:
		t.Logf("the spinning run's answer: %.200s", answer)
	case <-time.After(time.Minute):
		t.Fatal("the spinning run's caller got no answer after its sandbox ended")
	}
}

// slowKernel is code that makes its kernel hold the next request it
// receives for the given seconds before handling it, as a kernel on a
// busy host does: the request is received but not executed yet, the
// window in which the kernel ignores SIGINT. The kernel touches
// /tmp/corral-slow-kernel when the window begins.
func slowKernel(seconds int) string {
	return fmt.Sprintf(`import time as __t
from functools import partial as __partial
__k = get_ipython().kernel
def __slow(msg, k=__k):
    k.shell_stream.on_recv(__partial(k.schedule_dispatch, k.dispatch_shell), copy=False)
    open("/tmp/corral-slow-kernel", "w").close()
    __t.sleep(%d)
    return k.dispatch_shell(msg)
__k.shell_stream.on_recv(__partial(__k.schedule_dispatch, __slow), copy=False)
del __k, __slow`, seconds)
}
