package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpKeyTransport adds an API key (and a task) to every request.
type mcpKeyTransport struct {
	key, task string
}

func (t mcpKeyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-API-Key", t.key)
	if t.task != "" {
		r.Header.Set("Corral-Task", t.task)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// mcpConnect opens an MCP session on the shared server's /mcp with the
// official Go SDK's client.
func mcpConnect(t *testing.T, key, task string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "corral-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: env.url + "/mcp",
		HTTPClient: &http.Client{Transport: mcpKeyTransport{key: key, task: task}}}, nil)
	if err != nil {
		t.Fatalf("connect to /mcp: %v", err)
	}
	return s
}

// mcpCall calls a tool and returns the result's text and its structured
// content decoded into a map.
func mcpCall(t *testing.T, s *mcp.ClientSession, name string, args map[string]any) (*mcp.CallToolResult, string, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: %v", name, err)
	}
	var text string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text += tc.Text
		}
	}
	var st map[string]any
	if res.StructuredContent != nil {
		b, _ := json.Marshal(res.StructuredContent)
		_ = json.Unmarshal(b, &st)
	}
	return res, text, st
}

// mcpOK is mcpCall for a call that must succeed.
func mcpOK(t *testing.T, s *mcp.ClientSession, name string, args map[string]any) map[string]any {
	t.Helper()
	res, text, st := mcpCall(t, s, name, args)
	if res.IsError {
		t.Fatalf("%s %v: tool error %s", name, args, text)
	}
	return st
}

// sandboxState returns the state of sandbox id through the REST API.
func sandboxState(t *testing.T, id string) string {
	t.Helper()
	var sb struct{ State string }
	if code, _, body := rest(t, env.url, env.key, "GET", "/v1/sandboxes/"+id, nil, &sb); code != 200 {
		t.Fatalf("GET sandbox %s: %d %s", id, code, body)
	}
	return sb.State
}

// waitSandboxEnded polls until sandbox id has ended.
func waitSandboxEnded(t *testing.T, id string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for sandboxState(t, id) != "ended" {
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s still %s long after its MCP session ended", id, sandboxState(t, id))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestMCPGoClient drives the /mcp endpoint with the official Go SDK's
// client against real sandboxes: the tools are listed with their
// schemas; run_code, run_command, write_file, read_file and list_files
// work in the session's one sandbox (files persist between calls); a
// flood of output comes back bounded with truncated set; a bad argument
// is a tool error naming it; and closing the session kills the sandbox
// and ends the session's task (a sandbox must not outlive its session).
func TestMCPGoClient(t *testing.T) {
	need(t)
	s := mcpConnect(t, env.key, "")
	defer s.Close()
	ctx := context.Background()
	var names []string
	for tool, err := range s.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, tool.Name)
		if b, _ := json.Marshal(tool.InputSchema); !strings.Contains(string(b), `"type":"object"`) {
			t.Errorf("tool %s: input schema %s is no object schema", tool.Name, b)
		}
	}
	slices.Sort(names)
	want := []string{"create_sandbox", "kill_sandbox", "list_files", "read_file", "run_code", "run_command", "snapshot_sandbox", "write_file"}
	if !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}

	began := time.Now()
	st := mcpOK(t, s, "run_code", map[string]any{"code": "import sys\nprint(6*7)\nprint('err', file=sys.stderr)"})
	t.Logf("first run_code (makes the session's sandbox): %v", time.Since(began))
	id, _ := st["sandbox_id"].(string)
	if st["stdout"] != "42\n" || st["stderr"] != "err\n" || st["exit_code"] != 0.0 || id == "" || st["truncated"] != false {
		t.Fatalf("run_code: %v", st)
	}
	if _, ok := st["duration_ms"].(float64); !ok {
		t.Fatalf("run_code without duration_ms: %v", st)
	}
	began = time.Now()
	st = mcpOK(t, s, "run_command", map[string]any{"command": "echo made > made.txt; pwd; exit 3"})
	t.Logf("run_command in the session's sandbox: %v", time.Since(began))
	if st["sandbox_id"] != id || st["stdout"] != "/home/user\n" || st["exit_code"] != 3.0 {
		t.Fatalf("run_command (same sandbox %s, exit 3): %v", id, st)
	}
	mcpOK(t, s, "write_file", map[string]any{"path": "/home/user/dir/note.txt", "content": "héllo\n"})
	st = mcpOK(t, s, "read_file", map[string]any{"path": "/home/user/dir/note.txt"})
	if st["content"] != "héllo\n" || st["encoding"] != "utf-8" || st["truncated"] != false {
		t.Fatalf("read_file: %v", st)
	}
	st = mcpOK(t, s, "list_files", map[string]any{})
	b, _ := json.Marshal(st["entries"])
	var entries []struct{ Name, Path, Type string }
	_ = json.Unmarshal(b, &entries)
	seen := map[string]string{}
	for _, e := range entries {
		seen[e.Path] = e.Type
	}
	if seen["/home/user/made.txt"] != "file" || seen["/home/user/dir"] != "dir" {
		t.Fatalf("list_files of /home/user: %s", b)
	}
	st = mcpOK(t, s, "run_code", map[string]any{"code": "print('x' * 100000)"})
	if out, _ := st["stdout"].(string); st["truncated"] != true || len(out) > 8192 || st["stdout_bytes"] != 100001.0 {
		t.Fatalf("flood: truncated %v, %d bytes kept of %v", st["truncated"], len(out), st["stdout_bytes"])
	}
	res, text, st := mcpCall(t, s, "run_code", map[string]any{"code": "print(1)", "bogus": 1})
	if !res.IsError || st["code"] != "invalid_argument" || !strings.Contains(text, `unknown argument "bogus"`) {
		t.Fatalf("unknown argument: error %v %q %v", res.IsError, text, st)
	}
	res, text, _ = mcpCall(t, s, "read_file", map[string]any{"path": "/nonexistent"})
	if !res.IsError || !strings.HasPrefix(text, "not_found:") {
		t.Fatalf("read of a missing file: error %v %q", res.IsError, text)
	}
	var sb struct {
		TaskID string `json:"task"`
	}
	rest(t, env.url, env.key, "GET", "/v1/sandboxes/"+id, nil, &sb)
	if err := s.Close(); err != nil {
		t.Fatalf("close the session: %v", err)
	}
	waitSandboxEnded(t, id)
	var task struct{ State string }
	if code, _, body := rest(t, env.url, env.key, "GET", "/v1/tasks/"+sb.TaskID, nil, &task); code != 200 || task.State != "ended" {
		t.Fatalf("the session's task %s after the session: %d %s", sb.TaskID, code, body)
	}
}

// TestMCPBudget defends against an MCP client running past its task's
// budget: with a task of max_calls 3 named in Corral-Task, the fourth
// call is refused as a tool error whose text is the breaker's message
// (budget_exhausted, telling the model to stop and summarise), not run;
// the session's calls counted against that task.
func TestMCPBudget(t *testing.T) {
	need(t)
	var task struct{ ID string }
	if code, _, body := rest(t, env.url, env.key, "POST", "/v1/tasks", map[string]any{"agent": agentName("mcp"), "max_calls": 3}, &task); code != 201 {
		t.Fatalf("create task: %d %s", code, body)
	}
	s := mcpConnect(t, env.key, task.ID)
	defer s.Close()
	for i := range 3 {
		mcpOK(t, s, "run_command", map[string]any{"command": "echo call " + string(rune('0'+i))})
	}
	res, text, st := mcpCall(t, s, "run_code", map[string]any{"code": "open('/tmp/ran','w').write('yes')"})
	if !res.IsError || st["code"] != "budget_exhausted" || !strings.HasPrefix(text, "budget_exhausted:") || !strings.Contains(text, "summarise") {
		t.Fatalf("call past max_calls: error %v %q %v", res.IsError, text, st)
	}
	var got struct {
		Usage struct{ Calls int }
	}
	rest(t, env.url, env.key, "GET", "/v1/tasks/"+task.ID, nil, &got)
	if got.Usage.Calls != 3 {
		t.Fatalf("task counted %d calls, want 3", got.Usage.Calls)
	}
}

// TestMCPSessionOwner defends against one team acting in another team's
// MCP session: a request of team alpha's session made with team beta's
// key is refused (the session belongs to the key that opened it), and a
// sandbox_id of another task is not found; a request without a key is
// 401.
func TestMCPSessionOwner(t *testing.T) {
	need(t)
	alpha, beta := teamKey(t, "mcp-alpha"), teamKey(t, "mcp-beta")
	s := mcpConnect(t, alpha, "")
	defer s.Close()
	st := mcpOK(t, s, "run_command", map[string]any{"command": "echo alpha"})
	alphaBox, _ := st["sandbox_id"].(string)

	body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"run_command","arguments":{"command":"echo hijacked"}}}`
	for _, tc := range []struct {
		name, key string
		want      int
	}{{"beta's key", beta, http.StatusForbidden}, {"no key", "", http.StatusUnauthorized}} {
		req, _ := http.NewRequest("POST", env.url+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", s.ID())
		req.Header.Set("Mcp-Protocol-Version", s.InitializeResult().ProtocolVersion)
		if tc.key != "" {
			req.Header.Set("X-API-Key", tc.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s in alpha's session: %d, want %d", tc.name, resp.StatusCode, tc.want)
		}
	}
	// Beta's own session cannot name alpha's sandbox.
	sb := mcpConnect(t, beta, "")
	defer sb.Close()
	res, text, _ := mcpCall(t, sb, "run_command", map[string]any{"command": "echo in alpha", "sandbox_id": alphaBox})
	if !res.IsError || !strings.HasPrefix(text, "not_found:") {
		t.Fatalf("beta naming alpha's sandbox: error %v %q", res.IsError, text)
	}
}

// TestMCPStdio drives `corral mcp` (stdio, as a desktop client spawns
// it) with the Go SDK's command transport: it relays the server's tools,
// runs code in the session's sandbox, and when the client closes its
// stdin the relayed session ends and the sandbox is killed.
func TestMCPStdio(t *testing.T) {
	need(t)
	cmd := exec.Command(env.bin, "mcp")
	cmd.Env = append(os.Environ(), "CORRAL_URL="+env.url, "CORRAL_API_KEY="+env.key)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "corral-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("start corral mcp: %v (stderr %s)", err, stderr.String())
	}
	st := mcpOK(t, s, "run_code", map[string]any{"code": "print('over stdio')"})
	id, _ := st["sandbox_id"].(string)
	if st["stdout"] != "over stdio\n" || id == "" {
		t.Fatalf("run_code over stdio: %v", st)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v (stderr %s)", err, stderr.String())
	}
	waitSandboxEnded(t, id)
}

// toolResult is a POST /v1/tools/call answer.
type toolResult struct {
	Name    string         `json:"name"`
	IsError bool           `json:"is_error"`
	Code    string         `json:"code"`
	Content string         `json:"content"`
	Result  map[string]any `json:"result"`
}

// TestToolsHTTP covers the function-calling routes with real sandboxes:
// GET /v1/tools in both formats; execute_code without a sandbox runs in
// one made for the call and killed after it (the task runs no sandbox
// after the call); with a sandbox of the task, write_file then read_file
// and list_files see the file; a sandbox of another task is refused; the
// loop detector trips on a repeated failing command, and the refusal is
// a result the model reads (loop_detected, the breaker's message).
func TestToolsHTTP(t *testing.T) {
	need(t)
	for format, key := range map[string]string{"openai": "function", "anthropic": "input_schema"} {
		var defs struct{ Tools []map[string]any }
		if code, _, body := rest(t, env.url, env.key, "GET", "/v1/tools?format="+format, nil, &defs); code != 200 || len(defs.Tools) != 5 || defs.Tools[0][key] == nil {
			t.Fatalf("GET /v1/tools?format=%s: %d %s", format, code, body)
		}
	}
	var task struct{ ID string }
	rest(t, env.url, env.key, "POST", "/v1/tasks", map[string]any{"agent": agentName("tools")}, &task)
	call := func(name, sandbox string, args map[string]any) toolResult {
		t.Helper()
		var r toolResult
		code, _, body := rest(t, env.url, env.key, "POST", "/v1/tools/call", map[string]any{"name": name, "arguments": args, "task": task.ID, "sandbox": sandbox}, &r)
		if code != 200 {
			t.Fatalf("tools/call %s: %d %s", name, code, body)
		}
		return r
	}
	r := call("execute_code", "", map[string]any{"code": "print(sum(range(10)))"})
	if r.IsError || r.Result["stdout"] != "45\n" || r.Result["sandbox_id"] != nil {
		t.Fatalf("execute_code without a sandbox: %+v", r)
	}
	var live struct {
		Sandboxes []struct{ ID string } `json:"sandboxes"`
	}
	rest(t, env.url, env.key, "GET", "/v1/sandboxes?state=running", nil, &live)
	var sbs []string
	for _, sb := range live.Sandboxes {
		var rec struct {
			TaskID string `json:"task"`
		}
		rest(t, env.url, env.key, "GET", "/v1/sandboxes/"+sb.ID, nil, &rec)
		if rec.TaskID == task.ID {
			sbs = append(sbs, sb.ID)
		}
	}
	if len(sbs) != 0 {
		t.Fatalf("the call's sandbox outlived it: %v", sbs)
	}
	r = call("read_file", "", map[string]any{"path": "/etc/hostname"})
	if !r.IsError || r.Code != "invalid_argument" {
		t.Fatalf("read_file without a sandbox: %+v", r)
	}

	var sb struct{ ID string }
	if code, _, body := rest(t, env.url, env.key, "POST", "/v1/sandboxes", map[string]any{"task": task.ID}, &sb); code != 201 {
		t.Fatalf("create sandbox: %d %s", code, body)
	}
	defer rest(t, env.url, env.key, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	if r = call("write_file", sb.ID, map[string]any{"path": "notes/a.txt", "content": "abc"}); r.IsError {
		t.Fatalf("write_file: %+v", r)
	}
	if r = call("read_file", sb.ID, map[string]any{"path": "/home/user/notes/a.txt"}); r.IsError || r.Result["content"] != "abc" {
		t.Fatalf("read_file: %+v", r)
	}
	if r = call("list_files", sb.ID, map[string]any{"path": "/home/user/notes"}); r.IsError || !strings.Contains(r.Content, `"a.txt"`) {
		t.Fatalf("list_files: %+v", r)
	}
	var other struct{ ID string }
	rest(t, env.url, env.key, "POST", "/v1/tasks", map[string]any{"agent": agentName("tools-other")}, &other)
	code, _, body := rest(t, env.url, env.key, "POST", "/v1/tools/call", map[string]any{"name": "run_command", "arguments": map[string]any{"command": "true"}, "task": other.ID, "sandbox": sb.ID}, nil)
	if code != 400 || !strings.Contains(string(body), "another task") {
		t.Fatalf("a sandbox of another task: %d %s", code, body)
	}

	var tripped toolResult
	for i := 0; i < 20 && tripped.Code == ""; i++ {
		r = call("run_command", sb.ID, map[string]any{"command": "cat /missing/config.yaml"})
		if r.IsError {
			tripped = r
		}
	}
	if tripped.Code != "loop_detected" || !strings.HasPrefix(tripped.Content, "loop_detected:") || !strings.Contains(tripped.Content, "stop") {
		t.Fatalf("a repeated failing command: %+v", tripped)
	}
}

// mcpTSVersion is the MCP TypeScript SDK the suite pins
// (test/mcp/package.json).
const mcpTSVersion = "1.32.2"

// TestMCPTypeScript runs test/mcp/*.test.mjs (node:test) with the
// official MCP TypeScript SDK's client against the shared server, over
// stdio (spawning `corral mcp`) and over streamable HTTP (/mcp).
func TestMCPTypeScript(t *testing.T) {
	need(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the MCP TypeScript suite needs Node.js 20+")
	}
	data, err := os.ReadFile("../mcp/node_modules/@modelcontextprotocol/sdk/package.json")
	if err != nil {
		t.Skip("the npm package @modelcontextprotocol/sdk is not installed: run `make mcp-deps`")
	}
	var meta struct{ Version string }
	if json.Unmarshal(data, &meta) != nil || meta.Version != mcpTSVersion {
		t.Fatalf("test/mcp has @modelcontextprotocol/sdk %q, the suite pins %s: run `make mcp-deps`", meta.Version, mcpTSVersion)
	}
	files, _ := filepath.Glob("../mcp/*.test.mjs")
	if len(files) == 0 {
		t.Fatal("no test files in test/mcp")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append([]string{"--test", "--test-reporter=spec"}, files...)...)
	cmd.Env = append(os.Environ(), "CORRAL_URL="+env.url, "CORRAL_API_KEY="+env.key, "CORRAL_BIN="+env.bin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	if err != nil || testing.Verbose() {
		logLines(t, out.String())
	}
	if err != nil {
		t.Fatalf("node --test test/mcp: %v", err)
	}
}
