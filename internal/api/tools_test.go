package api_test

import (
	"strings"
	"testing"
)

// toolResult is a POST /v1/tools/call answer.
type toolResult struct {
	Name    string         `json:"name"`
	IsError bool           `json:"is_error"`
	Code    string         `json:"code"`
	Content string         `json:"content"`
	Result  map[string]any `json:"result"`
}

// TestToolCallFreshSandbox defends against a function call's sandbox
// outliving the call: run_command without a sandbox runs in one made for
// it (of the task, so it counts) and killed after it; a budget spent
// refuses the next call as a result the model reads, and leaves nothing
// running.
// (test/integration's TestToolsHTTP checks the same with real sandboxes.)
func TestToolCallFreshSandbox(t *testing.T) {
	e := newTeamEnv(t)
	var task struct{ ID string }
	if code := e.call("POST", "/v1/tasks", keyAlpha, map[string]any{"agent": "a", "max_calls": 1}, &task); code != 201 {
		t.Fatalf("create task: %d", code)
	}
	call := func() toolResult {
		t.Helper()
		var r toolResult
		if code := e.call("POST", "/v1/tools/call", keyAlpha, map[string]any{"name": "run_command", "arguments": map[string]any{"command": "echo hi"}, "task": task.ID}, &r); code != 200 {
			t.Fatalf("tools/call: %d", code)
		}
		return r
	}
	r := call()
	if r.IsError || r.Result["stdout"] != "hi\n" || r.Result["sandbox_id"] != nil {
		t.Fatalf("run_command: %+v", r)
	}
	if starts, stops := e.d.Starts(), e.d.Stops(); starts != 1 || stops != 1 {
		t.Fatalf("the call's sandbox: %d started, %d stopped; want 1 and 1", starts, stops)
	}
	r = call()
	if !r.IsError || r.Code != "budget_exhausted" || !strings.HasPrefix(r.Content, "budget_exhausted:") {
		t.Fatalf("a call past max_calls: %+v", r)
	}
	if starts, stops := e.d.Starts(), e.d.Stops(); starts != stops {
		t.Fatalf("after the refused call: %d sandboxes started, %d stopped", starts, stops)
	}
	var defs struct{ Tools []map[string]any }
	if code := e.call("GET", "/v1/tools?format=gemini", keyAlpha, nil, &defs); code != 400 {
		t.Errorf("GET /v1/tools?format=gemini: %d, want 400", code)
	}
}
