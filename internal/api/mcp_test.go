package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type keyTransport struct{ key, task string }

func (t keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-API-Key", t.key)
	if t.task != "" {
		r.Header.Set("Corral-Task", t.task)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestMCPSessionBelongsToKey defends against one team acting in another
// team's MCP session by its id: a request of alpha's session with beta's
// (valid) key is refused with 403 and does nothing, while alpha's own key
// goes on; a Corral-Task of another team is not found; /mcp without a key
// is 401.
func TestMCPSessionBelongsToKey(t *testing.T) {
	e := newTeamEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	s, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: e.srv.URL + "/mcp",
		HTTPClient: &http.Client{Transport: keyTransport{key: keyAlpha}}, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	post := func(key, session, task string) int {
		req, _ := http.NewRequest("POST", e.srv.URL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", s.InitializeResult().ProtocolVersion)
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
		}
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		if task != "" {
			req.Header.Set("Corral-Task", task)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(keyBeta, s.ID(), ""); code != http.StatusForbidden {
		t.Errorf("beta's key in alpha's session: %d, want 403", code)
	}
	if code := post(keyAlpha, s.ID(), ""); code != http.StatusOK {
		t.Errorf("alpha's key in its own session: %d, want 200", code)
	}
	if code := post("", s.ID(), ""); code != http.StatusUnauthorized {
		t.Errorf("no key: %d, want 401", code)
	}
	var task struct{ ID string }
	if code := e.call("POST", "/v1/tasks", keyAlpha, map[string]any{"agent": "a"}, &task); code != 201 {
		t.Fatalf("create task: %d", code)
	}
	if code := post(keyBeta, "", task.ID); code != http.StatusNotFound {
		t.Errorf("beta naming alpha's task in Corral-Task: %d, want 404", code)
	}
	if _, err := s.ListTools(ctx, nil); err != nil {
		t.Errorf("alpha's session after the refusals: %v", err)
	}
}

// TestToolCallScoped defends against one team running tool calls on
// another team's task or sandbox through POST /v1/tools/call: both are
// answered exactly as ids that do not exist (404 not_found), and nothing
// counts against alpha's task.
func TestToolCallScoped(t *testing.T) {
	e := newTeamEnv(t)
	var alphaTask, betaTask struct{ ID string }
	e.call("POST", "/v1/tasks", keyAlpha, map[string]any{"agent": "a"}, &alphaTask)
	e.call("POST", "/v1/tasks", keyBeta, map[string]any{"agent": "b"}, &betaTask)
	var sb struct{ ID string }
	if code := e.call("POST", "/v1/sandboxes", keyAlpha, map[string]any{"task": alphaTask.ID}, &sb); code != 201 {
		t.Fatalf("create alpha's sandbox: %d", code)
	}
	args := map[string]any{"command": "echo hi"}
	for _, tc := range []struct {
		name, task, sandbox, want string
	}{
		{"alpha's task", alphaTask.ID, "", "task not found"},
		{"a task that does not exist", "t_nope", "", "task not found"},
		{"alpha's sandbox", betaTask.ID, sb.ID, "sandbox not found"},
		{"a sandbox that does not exist", betaTask.ID, "nope", "sandbox not found"},
	} {
		var out struct{ Code, Message string }
		code := e.call("POST", "/v1/tools/call", keyBeta, map[string]any{"name": "run_command", "arguments": args, "task": tc.task, "sandbox": tc.sandbox}, &out)
		if code != 404 || out.Code != "not_found" || out.Message != tc.want {
			t.Errorf("%s: %d %+v, want 404 %q", tc.name, code, out, tc.want)
		}
	}
	var task struct{ Usage struct{ Calls int } }
	e.call("GET", "/v1/tasks/"+alphaTask.ID, keyAlpha, nil, &task)
	if task.Usage.Calls != 0 {
		t.Errorf("alpha's task counted %d calls of beta's", task.Usage.Calls)
	}
}

// TestMCPSessionEndKillsSandbox defends against an MCP session's sandbox
// outliving the session (a client that goes away must not leave
// sandboxes running until their TTL): the session's sandbox, made by its
// first call, has ended once the client closes the session, and the task
// the session made has ended with it. (test/integration's TestMCPGoClient
// checks the same with real sandboxes.)
func TestMCPSessionEndKillsSandbox(t *testing.T) {
	e := newTeamEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	s, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: e.srv.URL + "/mcp",
		HTTPClient: &http.Client{Transport: keyTransport{key: keyAlpha}}, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "run_command", Arguments: map[string]any{"command": "echo hi"}})
	if err != nil || res.IsError {
		t.Fatalf("run_command: %v %+v", err, res)
	}
	out := res.StructuredContent.(map[string]any)
	id, _ := out["sandbox_id"].(string)
	if out["stdout"] != "hi\n" || id == "" {
		t.Fatalf("run_command: %v", out)
	}
	var sb struct{ State, Task string }
	if e.call("GET", "/v1/sandboxes/"+id, keyAlpha, nil, &sb); sb.State != "running" {
		t.Fatalf("the session's sandbox is %q", sb.State)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for e.call("GET", "/v1/sandboxes/"+id, keyAlpha, nil, &sb); sb.State != "ended"; e.call("GET", "/v1/sandboxes/"+id, keyAlpha, nil, &sb) {
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox is %q after its session ended", sb.State)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The task ends after the sandboxes are killed: wait for it too.
	var task struct{ State string }
	for e.call("GET", "/v1/tasks/"+sb.Task, keyAlpha, nil, &task); task.State != "ended"; e.call("GET", "/v1/tasks/"+sb.Task, keyAlpha, nil, &task) {
		if time.Now().After(deadline) {
			t.Fatalf("the session's task is %q after the session", task.State)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
