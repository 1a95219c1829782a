package interpreter

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// python returns the host's python3 or skips: these tests exercise the
// server's own logic (no kernel: jupyter_client is only needed to start
// one, inside the template), on 127.0.0.1.
func python(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	return p
}

// writeServer writes the embedded server to a temporary directory.
func writeServer(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "server.py")
	if err := os.WriteFile(path, Server(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestServerRefusals starts the server on a free port of 127.0.0.1 and
// checks the answers that need no kernel: health, the refusals of bad
// requests with their status and message (both context_id and language,
// an unknown language, an unknown context, bad fields, an oversized
// body), and unknown routes; nothing is created by a refused request.
func TestServerRefusals(t *testing.T) {
	py := python(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-u", writeServer(t))
	cmd.Env = append(os.Environ(), "CORRAL_INTERPRETER_HOST=127.0.0.1", "CORRAL_INTERPRETER_PORT=0", "CORRAL_INTERPRETER_MAX_BODY=4096")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	addr := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`listening on (127\.0\.0\.1:\d+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
	}()
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case <-time.After(30 * time.Second):
		t.Fatal("the server did not start listening")
	}
	do := func(method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := do("GET", "/health?source=sdk", ""); code != 200 || body != `"OK"` {
		t.Fatalf("health: %d %q", code, body)
	}
	for _, tc := range []struct {
		name, method, path, body string
		code                     int
		want                     string
	}{
		{"context and language", "POST", "/execute", `{"code": "1", "context_id": "c", "language": "python"}`, 400, "You can provide context_id or language, but not both at the same time."},
		{"unknown language", "POST", "/execute", `{"code": "1", "language": "cobol"}`, 400, "language 'cobol' is not supported by this template; available: python"},
		{"js has no kernel", "POST", "/execute", `{"code": "1", "language": "js"}`, 400, "language 'js' is not supported by this template; available: python"},
		{"unknown context", "POST", "/execute", `{"code": "1", "context_id": "nosuch"}`, 404, "Context nosuch not found"},
		{"code missing", "POST", "/execute", `{}`, 400, "code must be a string"},
		{"env_vars not strings", "POST", "/execute", `{"code": "1", "env_vars": {"A": 1}}`, 400, "env_vars must be an object"},
		{"env var name with =", "POST", "/execute", `{"code": "1", "env_vars": {"A=B": "1"}}`, 400, "env_vars must be an object"},
		{"negative timeout", "POST", "/execute", `{"code": "1", "timeout": -1}`, 400, "timeout must be a non-negative number"},
		{"not JSON", "POST", "/execute", `{`, 400, "request body is not JSON"},
		{"not an object", "POST", "/execute", `[1]`, 400, "request body must be a JSON object"},
		{"oversized body", "POST", "/execute", `{"code": "` + strings.Repeat("x", 5000) + `"}`, 413, "request body over 4096 bytes"},
		{"context language", "POST", "/contexts", `{"language": "r"}`, 400, "language 'r' is not supported"},
		{"relative cwd", "POST", "/contexts", `{"cwd": "tmp"}`, 400, "cwd must be an absolute path"},
		{"missing cwd", "POST", "/contexts", `{"cwd": "/no/such/dir"}`, 400, "cwd /no/such/dir is not a directory"},
		{"restart unknown", "POST", "/contexts/nosuch/restart", ``, 404, "Context nosuch not found"},
		{"remove unknown", "DELETE", "/contexts/nosuch", ``, 404, "Context nosuch not found"},
		{"unknown route", "GET", "/nope", ``, 404, "no such route: GET /nope"},
	} {
		code, body := do(tc.method, tc.path, tc.body)
		if code != tc.code || body != tc.want && !strings.HasPrefix(body, tc.want) {
			t.Errorf("%s: %d %q, want %d %q", tc.name, code, body, tc.code, tc.want)
		}
	}
	// An oversized body is left unread: the answer must close the
	// connection, or the client's next request on it meets EOF (seen as
	// a flaky "POST /contexts: EOF" after the oversized case).
	req, _ := http.NewRequest("POST", base+"/execute", strings.NewReader(`{"code": "`+strings.Repeat("x", 5000)+`"}`))
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Errorf("oversized body: %v", err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != 413 || !resp.Close {
			t.Errorf("oversized body: %d, close %v; want 413 with Connection: close", resp.StatusCode, resp.Close)
		}
	}
	if code, body := do("GET", "/contexts", ""); code != 200 || body != "[]" {
		t.Errorf("contexts after refusals: %d %s", code, body)
	}
}

// TestServerResults checks the server's mapping of kernel output to
// stream lines (E2B's field names, a string's quotes stripped, unknown
// MIME types in extra) and its output bounds: an oversized result keeps
// its small formats and names the dropped ones, a run past its byte bound
// gets one truncation marker and still delivers its error line.
func TestServerResults(t *testing.T) {
	py := python(t)
	script := `
import json, sys
sys.path.insert(0, sys.argv[1])
import server
out = {}
out["result"] = server.result_line({"text/plain": "'hi'", "text/html": "<b>", "image/png": "AAA", "application/json": {"a": 1},
    "e2b/data": {"a": [1]}, "application/x-thing": "x"}, True)
server.MAX_RESULT_BYTES = 10000
out["bounded"] = server.bound_result({"type": "result", "is_main_result": False, "text": "fig", "png": "A" * 20000})
server.MAX_RUN_BYTES = 1000
r = server.Run("", {}, None)
for i in range(40):
    r.emit({"type": "stdout", "text": "x" * 50, "timestamp": "t"})
r.emit({"type": "error", "name": "E", "value": "v", "traceback": ""})
r.finish()
lines = []
while True:
    l = r.lines.get()
    if l is None:
        break
    lines.append(l)
out["types"] = [l["type"] for l in lines]
out["marker"] = [l["text"] for l in lines if "truncated" in l.get("text", "")]
out["lang"] = [server.normalize_language(x) for x in (None, "", "Python", " python3 ", "py")]
print(json.dumps(out))
`
	cmd := exec.Command(py, "-c", script, filepath.Dir(writeServer(t)))
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, b)
	}
	var got struct {
		Result  map[string]any `json:"result"`
		Bounded map[string]any `json:"bounded"`
		Types   []string       `json:"types"`
		Marker  []string       `json:"marker"`
		Lang    []string       `json:"lang"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	want := `{"data":{"a":[1]},"extra":{"application/x-thing":"x"},"html":"\u003cb\u003e","is_main_result":true,"json":{"a":1},"png":"AAA","text":"hi","type":"result"}`
	if j, _ := json.Marshal(got.Result); string(j) != want {
		t.Errorf("result line %s\nwant %s", j, want)
	}
	if _, ok := got.Bounded["png"]; ok || !strings.Contains(got.Bounded["text"].(string), "result fields png dropped") || !strings.HasPrefix(got.Bounded["text"].(string), "fig\n") {
		t.Errorf("bounded result %v", got.Bounded)
	}
	if len(got.Marker) != 1 || got.Types[len(got.Types)-1] != "error" || len(got.Types) > 20 {
		t.Errorf("run bound: types %v, markers %v", got.Types, got.Marker)
	}
	for _, l := range got.Lang {
		if l != "python" {
			t.Errorf("languages normalise to %v", got.Lang)
			break
		}
	}
}
