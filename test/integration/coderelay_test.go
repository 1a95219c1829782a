package integration

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// fakeInterpreter stands in for the code-interpreter server inside a
// sandbox (the real one is tested in interpreter_test.go): it answers
// /execute with NDJSON lines chosen by the code, to drive the control
// plane's relay through its cases. It writes /tmp/gone when a write to
// the client fails (the client went away).
const fakeInterpreter = `import http.server, json, sys, time, subprocess
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def line(self, obj):
        b = (json.dumps(obj) + "\n").encode()
        self.wfile.write(b"%x\r\n" % len(b) + b + b"\r\n")
        self.wfile.flush()
    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        req = json.loads(self.rfile.read(n))
        code = req.get("code", "")
        if code == "bad-context":
            b = b"Context nope not found"
            self.send_response(404)
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            self.wfile.write(b)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self.line({"type": "number_of_executions", "execution_count": 7})
            if code == "hello":
                self.line({"type": "stdout", "text": "hello\n", "timestamp": "t"})
                self.line({"type": "result", "is_main_result": True, "text": "42", "png": "aGk="})
            elif code == "flood":
                for i in range(300):
                    self.line({"type": "stdout", "text": "x" * 10000, "timestamp": "t"})
            elif code == "sleep":
                for i in range(120):
                    self.line({"type": "keepalive"})
                    time.sleep(0.25)
            elif code == "oom":
                subprocess.run(["python3", "-c", "b = []\nwhile True: b.append(bytearray(16 << 20))"])
            elif code == "fail":
                self.line({"type": "error", "name": "ZeroDivisionError", "value": "division by zero", "traceback": "tb"})
            self.line({"type": "end_of_execution"})
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            open("/tmp/gone", "w").write("gone")
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 49999), H).serve_forever()
`

// codeLines posts a run to the E2B /execute route of sandbox id (header
// routing, as the code-interpreter SDK does with E2B_SANDBOX_URL) and
// returns the status and the answer's lines.
func codeLines(t *testing.T, id, token, code string) (int, []map[string]any, string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"code": code})
	req, _ := http.NewRequest("POST", env.url+"/execute", strings.NewReader(string(body)))
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49999")
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var lines []map[string]any
	var raw strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 32<<20)
	for sc.Scan() {
		raw.WriteString(sc.Text() + "\n")
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			lines = append(lines, m)
		}
	}
	return resp.StatusCode, lines, raw.String()
}

// TestCodeRunRelay defends the host and the task against what a code run
// does, whatever the interpreter in the sandbox answers: a run is a tool
// call (refused once the task's call budget is spent), needs the
// sandbox's access token, is relayed line by line with
// end_of_execution last, has stdout cut at the server's output limit
// with a marker, ends at its timeout with a TimeoutError (and the
// interpreter sees the client go), reports an OOM kill during the run as
// OutOfMemoryError, relays the interpreter's own refusals, and is
// audited as code.run.
func TestCodeRunRelay(t *testing.T) {
	need(t)
	var task struct {
		ID string `json:"id"`
	}
	if st := call(t, "POST", "/v1/tasks", map[string]any{"max_calls": 60, "no_loop_check": true}, &task); st != 201 {
		t.Fatalf("create task: %d", st)
	}
	id := create(t, map[string]any{"task": task.ID, "resources": map[string]any{"memory_mb": 256}})
	mustSh(t, id, "cat > /tmp/fake.py <<'EOF'\n"+fakeInterpreter+"EOF\n(setsid python3 /tmp/fake.py >/tmp/fake.log 2>&1 &)")
	token, _ := env.srv.Manager.AccessToken(id)
	waitFor(t, "the fake interpreter to listen", 30*time.Second, func() bool {
		st, _, _ := codeLines(t, id, token, "noop")
		return st == 200
	})

	t.Run("needs the access token", func(t *testing.T) {
		for _, tok := range []string{"", "wrong"} {
			if st, _, raw := codeLines(t, id, tok, "hello"); st != 401 {
				t.Errorf("token %q: %d %s; want 401", tok, st, raw)
			}
		}
	})
	t.Run("relayed in order", func(t *testing.T) {
		st, lines, raw := codeLines(t, id, token, "hello")
		if st != 200 || len(lines) != 4 || lines[1]["text"] != "hello\n" || lines[2]["type"] != "result" || lines[3]["type"] != "end_of_execution" {
			t.Fatalf("%d %s", st, raw)
		}
	})
	t.Run("output bounded", func(t *testing.T) {
		_, lines, _ := codeLines(t, id, token, "flood")
		var stdout int
		marker := false
		for _, l := range lines {
			if l["type"] == "stdout" {
				stdout += len(l["text"].(string))
			}
			if l["type"] == "stderr" && strings.Contains(l["text"].(string), "output truncated") {
				marker = true
			}
		}
		if stdout > 1<<20 || !marker || lines[len(lines)-1]["type"] != "end_of_execution" {
			t.Errorf("relayed %d bytes of stdout (limit %d), marker %v", stdout, 1<<20, marker)
		}
	})
	t.Run("interpreter refusal relayed", func(t *testing.T) {
		if st, _, raw := codeLines(t, id, token, "bad-context"); st != 404 || !strings.Contains(raw, "Context nope not found") {
			t.Errorf("%d %q; want the interpreter's 404", st, raw)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		mustSh(t, id, "rm -f /tmp/gone")
		var out struct {
			TimedOut bool `json:"timed_out"`
			Error    *struct {
				Name string `json:"name"`
			} `json:"error"`
		}
		if st := call(t, "POST", "/v1/sandboxes/"+id+"/code", map[string]any{"code": "sleep", "timeout": 1}, &out); st != 200 {
			t.Fatalf("native run: %d", st)
		}
		if !out.TimedOut || out.Error == nil || out.Error.Name != "TimeoutError" {
			t.Errorf("a run past its timeout: %+v", out)
		}
		waitFor(t, "the interpreter to see the client go", 30*time.Second, func() bool {
			return strings.TrimSpace(mustSh(t, id, "cat /tmp/gone 2>/dev/null || true")) == "gone"
		})
	})
	t.Run("oom", func(t *testing.T) {
		_, lines, raw := codeLines(t, id, token, "oom")
		found := false
		for _, l := range lines {
			if l["type"] == "error" && l["name"] == "OutOfMemoryError" {
				found = true
			}
		}
		if !found {
			t.Errorf("an OOM kill during the run is not reported: %s", raw)
		}
	})
	t.Run("audited", func(t *testing.T) {
		var evs struct {
			Events []struct {
				Data struct {
					Code string `json:"code"`
					Run  struct {
						Results   []string `json:"results"`
						Truncated bool     `json:"truncated"`
						OOM       bool     `json:"oom"`
						End       string   `json:"end"`
					} `json:"run"`
				} `json:"data"`
			} `json:"events"`
		}
		call(t, "GET", "/v1/audit?sandbox="+id+"&kind=code.run", nil, &evs)
		got := map[string]bool{}
		for _, ev := range evs.Events {
			switch d := ev.Data; d.Code {
			case "hello":
				got["hello"] = len(d.Run.Results) == 1 && d.Run.Results[0] == "png+text"
			case "flood":
				got["flood"] = d.Run.Truncated
			case "oom":
				got["oom"] = d.Run.OOM
			case "sleep":
				got["sleep"] = d.Run.End == "timeout"
			}
		}
		for _, k := range []string{"hello", "flood", "oom", "sleep"} {
			if !got[k] {
				t.Errorf("code.run of %q missing or wrong: %+v", k, evs.Events)
			}
		}
	})
	t.Run("budget", func(t *testing.T) {
		// 60 calls in all: the execs, the polls and the runs above used
		// some; the rest go until the budget refuses (and the breaker
		// kills the sandbox, the task's on_trip default).
		refused := false
		for i := 0; i < 60 && !refused; i++ {
			st, _, raw := codeLines(t, id, token, "hello")
			if st == 403 {
				refused = strings.HasPrefix(raw, "budget_exhausted")
				if !refused {
					t.Fatalf("403 without budget_exhausted: %q", raw)
				}
			}
		}
		if !refused {
			t.Error("runs past the task's call budget were not refused")
		}
	})
}
