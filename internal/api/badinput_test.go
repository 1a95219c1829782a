package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/api"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/runtime/runtimetest"
)

// stateOf is what the admin key reads of everything a request could
// change: sandboxes (any state), tasks, keys, secrets, snapshots, pools,
// teams' quotas, templates, volumes.
func (e *env) stateOf() string {
	e.t.Helper()
	var b strings.Builder
	for _, p := range []string{"/v1/sandboxes?state=all", "/v1/tasks?state=all", "/v1/keys", "/v1/secrets", "/v1/snapshots",
		"/v1/pools", "/v1/teams", "/v1/templates", "/v1/volumes"} {
		req, _ := http.NewRequest("GET", e.srv.URL+p, nil)
		req.Header.Set("X-API-Key", apiKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			e.t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Fprintf(&b, "%s %d %s\n", p, resp.StatusCode, body)
	}
	return b.String()
}

// badCase is one request TestBadInputRefused sends, with the refusal it
// must get: the status, and the code (for the E2B routes, e2bShape: the
// code is the status number, E2B's shape); msg, when set, is a part of
// the message (the parameter or field it names), or with exact the
// whole message.
type badCase struct {
	method, path, body string
	hdr                []string
	status             int
	code, msg          string
	exact              bool
	rpc                int // a JSON-RPC error of this code (MCP): code is its error.data.code
}

// e2bShape marks a badCase answered in E2B's {"code": <status>} shape.
const e2bShape = "e2b"

// do sends c with the admin key, bounded by a generous deadline (a
// request that is not refused but served, an event stream say, fails
// instead of hanging the test); it returns the status and the body.
func (e *env) do(c badCase) (int, []byte) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var rd io.Reader
	if c.body != "" {
		rd = strings.NewReader(c.body)
	}
	req, err := http.NewRequestWithContext(ctx, c.method, e.srv.URL+c.path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("X-API-Key", apiKey)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(c.hdr); i += 2 {
		req.Header.Set(c.hdr[i], c.hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// TestBadInputRefused defends against bad input answered as a server
// fault, ignored, or acted upon: per route family, ids with an encoded
// slash, a NUL, a newline or 5000 characters, JSON of the wrong type,
// numbers out of range, unknown fields, and query parameters that are
// unknown (native routes), repeated, out of range, malformed or carry
// control characters, JSON objects that name a key twice, metadata keys
// and values and agent names with control characters, and env values
// with a NUL, MCP messages naming a key twice or over the body bound get
// the refusal of the table — its status and
// stable code, a message naming the parameter — and change nothing the
// admin key can read (checked after every request). Every route that
// reads a JSON body gets the malformed bodies of the JSON rule
// (parseJSON: a syntax error, a truncated body, trailing data, a key
// given twice, an array, an empty body) and is told the exact message;
// a value of the wrong kind or out of range, an unknown field, is told
// the field's JSON path and the kind expected, never a Go type (the
// decoder's "cannot unmarshal string into Go struct field
// createRequest.timeout of type int" reached callers).
func TestBadInputRefused(t *testing.T) {
	t.Parallel()
	e := newTeamEnv(t)
	sb := e.createNative(map[string]any{})
	var task struct {
		ID string `json:"id"`
	}
	if st := e.call("POST", "/v1/tasks", apiKey, map[string]any{"agent": "a", "max_calls": 5}, &task); st != http.StatusCreated {
		t.Fatalf("task: %d", st)
	}
	var tsb sandboxView // a sandbox of the task, for tool calls
	if st := e.call("POST", "/v1/sandboxes", apiKey, map[string]any{"task": task.ID}, &tsb); st != http.StatusCreated {
		t.Fatalf("task's sandbox: %d", st)
	}
	var esb e2bSandbox // a sandbox made over E2B's API, for /execute
	if st := e.call("POST", "/sandboxes", apiKey, map[string]any{"templateID": "base"}, &esb); st != http.StatusCreated {
		t.Fatalf("E2B sandbox: %d %+v", st, esb)
	}
	long := strings.Repeat("x", 5000)
	badIDs := []string{"a%2Fb", "a%00b", "a%0Ab", long, "%2E%2E"}
	const (
		inv, js, nf = api.CodeInvalidArgument, api.CodeInvalidJSON, api.CodeNotFound
		bad         = http.StatusBadRequest
	)
	var cases []badCase
	for _, id := range badIDs {
		for _, r := range []badCase{
			{"GET", "/v1/sandboxes/{}", "", nil, 404, nf, "", false, 0}, {"DELETE", "/v1/sandboxes/{}", "", nil, 404, nf, "", false, 0},
			{"POST", "/v1/sandboxes/{}/timeout", `{"timeout":60}`, nil, 404, nf, "", false, 0},
			{"POST", "/v1/sandboxes/{}/exec", `{"command":"echo"}`, nil, 404, nf, "", false, 0}, {"POST", "/v1/sandboxes/{}/pause", "", nil, 404, nf, "", false, 0},
			{"GET", "/v1/sandboxes/{}/metrics", "", nil, 404, nf, "", false, 0}, {"PUT", "/v1/sandboxes/{}/network", `{"allow":[]}`, nil, 404, nf, "", false, 0},
			{"POST", "/v1/sandboxes/{}/snapshots", `{}`, nil, 404, nf, "", false, 0}, {"POST", "/v1/sandboxes/{}/fork", `{}`, nil, 404, nf, "", false, 0},
			{"GET", "/v1/snapshots/{}", "", nil, 404, nf, "", false, 0}, {"DELETE", "/v1/snapshots/{}", "", nil, 404, nf, "", false, 0},
			{"GET", "/v1/tasks/{}", "", nil, 404, nf, "", false, 0}, {"PATCH", "/v1/tasks/{}", `{"max_calls":9}`, nil, 404, nf, "", false, 0},
			{"DELETE", "/v1/tasks/{}", "", nil, 404, nf, "", false, 0}, {"POST", "/v1/tasks/{}/tokens", `{"tokens":1}`, nil, 404, nf, "", false, 0},
			{"PUT", "/v1/secrets/{}", `{"hosts":["api.example.com"],"value":"v"}`, nil, bad, inv, "", false, 0}, {"DELETE", "/v1/secrets/{}", "", nil, 404, nf, "", false, 0},
			{"DELETE", "/v1/keys/{}", "", nil, 404, nf, "", false, 0}, {"GET", "/v1/teams/{}/quota", "", nil, bad, inv, "", false, 0},
			{"PUT", "/v1/teams/{}/quota", `{"max_sandboxes":1}`, nil, bad, inv, "", false, 0},
			{"GET", "/v1/templates/{}", "", nil, 404, nf, "", false, 0}, {"DELETE", "/v1/templates/{}", "", nil, 404, nf, "", false, 0},
			{"POST", "/v1/templates/{}/current", `{}`, nil, 404, nf, "", false, 0},
			{"PUT", "/v1/pools/{}", `{"min":0,"max":1}`, nil, bad, inv, "", false, 0}, {"DELETE", "/v1/pools/{}", "", nil, bad, inv, "", false, 0},
			{"GET", "/sandboxes/{}", "", nil, 404, e2bShape, "", false, 0}, {"DELETE", "/sandboxes/{}", "", nil, 404, e2bShape, "", false, 0},
			{"POST", "/sandboxes/{}/timeout", `{"timeout":60}`, nil, 404, e2bShape, "", false, 0},
			{"POST", "/sandboxes/{}/pause", "", nil, 404, e2bShape, "", false, 0}, {"POST", "/sandboxes/{}/resume", `{}`, nil, 404, e2bShape, "", false, 0},
			{"POST", "/sandboxes/{}/connect", `{"timeout":60}`, nil, 404, e2bShape, "", false, 0},
		} {
			r.path = strings.ReplaceAll(r.path, "{}", id)
			cases = append(cases, r)
		}
	}
	s, tk := "/v1/sandboxes/"+sb.ID, "/v1/tasks/"+task.ID
	body := func(method, path, body string, status int, code string) badCase {
		return badCase{method: method, path: path, body: body, status: status, code: code}
	}
	withMsg := func(c badCase, msg string) badCase { c.msg = msg; return c }
	withHdr := func(c badCase, hdr ...string) badCase { c.hdr = hdr; return c }
	// js400 and e2b400: a body refused by the JSON rule, with its exact
	// message (native: invalid_json; E2B: its shape)
	js400 := func(method, path, body, msg string) badCase {
		return badCase{method: method, path: path, body: body, status: bad, code: js, msg: msg, exact: true}
	}
	e2b400 := func(method, path, body, msg string) badCase {
		return badCase{method: method, path: path, body: body, status: bad, code: e2bShape, msg: msg, exact: true}
	}
	// the code interpreter's /execute (port 49999) of an E2B sandbox
	execHdr := []string{"E2b-Sandbox-Id", esb.SandboxID, "E2b-Sandbox-Port", "49999", "X-Access-Token", esb.EnvdAccessToken}
	mcpHdr := []string{"Accept", "application/json, text/event-stream"}
	mcp400 := func(body, msg string) badCase {
		return badCase{method: "POST", path: "/mcp", body: body, hdr: mcpHdr, status: bad, code: js, rpc: -32700, msg: msg, exact: true}
	}
	// query parameters: the message names the parameter
	query := func(method, path string, status int, code, msg string, hdr ...string) badCase {
		return badCase{method: method, path: path, hdr: hdr, status: status, code: code, msg: msg}
	}
	cases = append(cases,
		// wrong JSON types, out-of-range numbers, unknown fields: the
		// message names the JSON path and the kind expected
		js400("POST", "/v1/sandboxes", `{"template":5}`, `field "template": expected a string, got a number`),
		js400("POST", "/v1/sandboxes", `{"timeout":"x"}`, `field "timeout": expected a number, got a string`),
		js400("POST", "/v1/sandboxes", `{"timeout":1e300}`, `field "timeout": 1e300 is out of range`),
		js400("POST", "/v1/sandboxes", `{"timeout":1.5}`, `field "timeout": expected an integer, got 1.5`),
		js400("POST", "/v1/sandboxes", `{"auto_pause":"yes"}`, `field "auto_pause": expected a boolean, got a string`),
		js400("POST", "/v1/sandboxes", `{"metadata":{"b":"1","a":5}}`, `field "metadata.a": expected a string, got a number`),
		js400("POST", "/v1/sandboxes", `{"metadata":[]}`, `field "metadata": expected an object, got an array`),
		js400("POST", "/v1/sandboxes", `{"allow":["a.example.com",7]}`, `field "allow[1]": expected a string, got a number`),
		js400("POST", "/v1/sandboxes", `{"resources":{"memory_mb":"x"}}`, `field "resources.memory_mb": expected a number, got a string`),
		js400("POST", "/v1/sandboxes", `{"nope":1}`, `unknown field "nope"`),
		js400("POST", "/v1/sandboxes", `{"resources":{"nope":1}}`, `unknown field "resources.nope"`),
		js400("POST", "/v1/sandboxes", `{"metadata":{"nope":"1"},"nope":1}`, `unknown field "nope"`),
		js400("POST", "/v1/sandboxes", `{"volumes":[{"volume":"v","path":"/x"},{"volume":"v","nope":1}]}`, `unknown field "volumes[1].nope"`),
		js400("POST", "/v1/sandboxes", `{"volumes":[{"volume":"v","path":"/x"},{"path":5}]}`, `field "volumes[1].path": expected a string, got a number`),
		// keys match fields regardless of case, as encoding/json does; the
		// path is the one the body spells
		js400("POST", "/v1/sandboxes", `{"Resources":{"nope":1}}`, `unknown field "Resources.nope"`),
		js400("POST", "/v1/sandboxes", `{"TIMEOUT":"x"}`, `field "TIMEOUT": expected a number, got a string`),
		body("POST", "/v1/sandboxes", `{"timeout":-1}`, bad, inv),
		body("POST", "/v1/sandboxes", `{"resources":{"memory_mb":-5}}`, bad, inv), body("POST", "/v1/sandboxes", `{"resources":{"cpu":1e308}}`, bad, inv),
		body("POST", "/v1/sandboxes", `{"template":"a\u0000b"}`, bad, inv), body("POST", "/v1/sandboxes", `{"template":"`+long+`"}`, bad, inv),
		body("POST", s+"/timeout", `{"timeout":-1}`, bad, inv),
		js400("POST", s+"/timeout", `{"timeout":1e300}`, `field "timeout": 1e300 is out of range`),
		js400("POST", s+"/timeout", `{"timeout":"x"}`, `field "timeout": expected a number, got a string`),
		js400("POST", s+"/exec", `{"command":5}`, `field "command": expected a string, got a number`),
		js400("POST", s+"/exec", `{"cmd":["echo",5]}`, `field "cmd[1]": expected a string, got a number`),
		js400("POST", s+"/exec", `{"command":"echo","env":{"A":true}}`, `field "env.A": expected a string, got a boolean`),
		body("POST", s+"/exec", `{"command":"echo","timeout":-1}`, bad, inv),
		js400("POST", s+"/exec", `{"nope":1}`, `unknown field "nope"`),
		body("PUT", s+"/network", `{"allow":[""]}`, bad, inv),
		js400("PUT", s+"/network", `{"allow":5}`, `field "allow": expected an array, got a number`),
		body("PUT", s+"/network", `{"mode":"x"}`, bad, inv),
		js400("POST", s+"/snapshots", `{"name":5}`, `field "name": expected a string, got a number`),
		body("POST", s+"/snapshots", `{"name":"`+long+`"}`, bad, inv),
		js400("POST", s+"/pause", `{"persist":"x"}`, `field "persist": expected a boolean, got a string`),
		js400("POST", s+"/code", `{"code":5}`, `field "code": expected a string, got a number`),
		// the run's options were read ignoring errors: a string timeout
		// was refused as "timeout must be more than 0"
		js400("POST", s+"/code", `{"code":"1","timeout":"x"}`, `field "timeout": expected a number, got a string`),
		body("POST", "/v1/tasks", `{"max_calls":-1}`, bad, inv),
		js400("POST", "/v1/tasks", `{"max_calls":1e30}`, `field "max_calls": 1e30 is out of range`),
		js400("POST", "/v1/tasks", `{"agent":5}`, `field "agent": expected a string, got a number`),
		body("POST", "/v1/tasks", `{"on_trip":"x"}`, bad, inv), js400("POST", "/v1/tasks", `{"nope":1}`, `unknown field "nope"`),
		body("PATCH", tk, `{"max_calls":-1}`, bad, inv),
		js400("PATCH", tk, `{"max_calls":"x"}`, `field "max_calls": expected a number, got a string`),
		body("POST", tk+"/tokens", `{"tokens":-1}`, bad, inv), body("POST", tk+"/tokens", `{"tokens":9223372036854775807}`, bad, inv),
		body("PUT", "/v1/secrets/S1", `{"hosts":["a"],"value":""}`, bad, inv),
		js400("PUT", "/v1/secrets/S1", `{"hosts":5}`, `field "hosts": expected an array, got a number`),
		body("PUT", "/v1/secrets/a%2Fb", `{}`, bad, inv),
		withMsg(body("PUT", "/v1/secrets/S1", `{"hosts":["api.example.com"],"header":"Author\u0000ization","value":"12345678"}`, bad, inv), "header"),
		withMsg(body("PUT", "/v1/secrets/S1", `{"hosts":["api.example.com"],"header":"X(y)","value":"12345678"}`, bad, inv), "header"),
		withMsg(body("PUT", "/v1/secrets/S1", `{"hosts":["api.example.com"],"header":"Authorizätion","value":"12345678"}`, bad, inv), "header"),
		body("POST", "/v1/keys", `{"role":"god"}`, bad, inv), body("POST", "/v1/keys", `{"team":"a/b"}`, bad, inv),
		js400("POST", "/v1/keys", `{"name":5}`, `field "name": expected a string, got a number`),
		js400("POST", "/v1/keys", `{"team":"a","key":"e2b_chosen"}`, `unknown field "key"`),
		body("PUT", "/v1/teams/alpha/quota", `{"max_sandboxes":-1}`, bad, inv), body("PUT", "/v1/teams/alpha/quota", `{"max_cpus":"x"}`, bad, inv),
		body("PUT", "/v1/pools/base", `{"min":-1,"max":-1}`, bad, inv), body("PUT", "/v1/pools/base", `{"min":5,"max":1}`, bad, inv),
		js400("PUT", "/v1/pools/base", `{"min":"x"}`, `field "min": expected a number, got a string`),
		js400("POST", "/v1/volumes", `{"name":"v","size_mb":"x"}`, `field "size_mb": expected a number, got a string`),
		js400("POST", "/v1/templates/builds", `{"name":5}`, `field "name": expected a string, got a number`),
		js400("POST", "/v1/templates/builds", `{"name":"t","version":"1","nope":1}`, `unknown field "nope"`),
		body("POST", "/sandboxes", `{"timeout":4294967296}`, bad, e2bShape),
		body("POST", "/sandboxes", `{"timeout":-1}`, bad, e2bShape),
		e2b400("POST", "/sandboxes", `{"templateID":5}`, `field "templateID": expected a string, got a number`),
		e2b400("POST", "/sandboxes", `{"templateID":"base","timeout":"60"}`, `field "timeout": expected a number, got a string`),
		e2b400("POST", "/sandboxes", `{"templateID":"base","timeout":1e99}`, `field "timeout": 1e99 is out of range`),
		e2b400("POST", "/sandboxes", `{"templateID":"base","metadata":{"a":5}}`, `field "metadata.a": expected a string, got a number`),
		e2b400("POST", "/sandboxes", `{"templateID":"base","network":{"allowOut":"x"}}`, `field "network.allowOut": expected an array, got a string`),
		e2b400("POST", "/sandboxes", `{"templateID":"base","network":"x"}`, `field "network": expected an object, got a string`),
		e2b400("POST", "/sandboxes", `{"templateID":"base","volumeMounts":[{"name":"v","path":5}]}`, `field "volumeMounts[0].path": expected a string, got a number`),
		e2b400("PUT", "/sandboxes/"+sb.ID+"/network", `{"allowOut":["a.example.com",5]}`, `field "allowOut[1]": expected a string, got a number`),
		e2b400("POST", "/sandboxes/"+sb.ID+"/timeout", `{"timeout":"60"}`, `field "timeout": expected a number, got a string`),
		e2b400("POST", "/sandboxes/"+sb.ID+"/connect", `{"timeout":true}`, `field "timeout": expected a number, got a boolean`),
		e2b400("POST", "/sandboxes/"+sb.ID+"/resume", `{"timeout":1.5}`, `field "timeout": expected an integer, got 1.5`),
		badCase{method: "POST", path: "/v1/sandboxes", body: `{"template":"` + strings.Repeat("x", api.MaxJSONBody) + `"}`,
			status: http.StatusRequestEntityTooLarge, code: api.CodeBodyTooLarge, msg: fmt.Sprintf("request body exceeds %d bytes", api.MaxJSONBody), exact: true},
		badCase{method: "POST", path: "/sandboxes", body: `{"templateID":"` + strings.Repeat("x", api.MaxJSONBody) + `"}`,
			status: http.StatusRequestEntityTooLarge, code: e2bShape, msg: fmt.Sprintf("request body exceeds %d bytes", api.MaxJSONBody), exact: true},
		badCase{method: "POST", path: s + "/code", body: `{"code":"` + strings.Repeat("x", api.MaxCodeRequest) + `"}`,
			status: http.StatusRequestEntityTooLarge, code: api.CodeBodyTooLarge, msg: fmt.Sprintf("request body exceeds %d bytes", api.MaxCodeRequest), exact: true},
		badCase{method: "POST", path: "/execute", body: `{"code":"` + strings.Repeat("x", api.MaxCodeRequest) + `"}`, hdr: execHdr,
			status: http.StatusRequestEntityTooLarge, code: e2bShape, msg: fmt.Sprintf("request body exceeds %d bytes", api.MaxCodeRequest), exact: true},
		withHdr(e2b400("POST", "/execute", `{"code":5}`, `field "code": expected a string, got a number`), execHdr...),
		withHdr(e2b400("POST", "/execute", `{"code":"1","env_vars":{"A":1}}`, `field "env_vars.A": expected a string, got a number`), execHdr...),

		// a key given twice (at any depth), control characters in
		// metadata and agent names, a NUL in an env value
		withMsg(body("POST", "/v1/sandboxes", `{"timeout":5,"timeout":6}`, bad, js), "timeout"),
		withMsg(body("POST", "/v1/sandboxes", `{"metadata":{"a":"1","a":"2"}}`, bad, js), "metadata.a"),
		withMsg(body("POST", "/v1/tasks", `{"max_calls":1,"max_calls":2}`, bad, js), "max_calls"),
		withMsg(body("POST", "/v1/tools/call", `{"task":"`+task.ID+`","sandbox":"`+tsb.ID+`","name":"run_command","arguments":{"command":"x","command":"y"}}`, bad, js),
			"arguments.command"),
		withMsg(body("POST", "/sandboxes", `{"templateID":"base","timeout":1,"timeout":2}`, bad, e2bShape), "timeout"),
		withMsg(body("POST", "/sandboxes", `{"templateID":"base","metadata":{"a":"1","a":"2"}}`, bad, e2bShape), "metadata.a"),
		withMsg(body("POST", "/v1/sandboxes", `{"metadata":{"a\u0000":"b"}}`, bad, inv), "metadata"),
		withMsg(body("POST", "/v1/sandboxes", `{"metadata":{"a":"b\u0000"}}`, bad, inv), "metadata"),
		withMsg(body("POST", "/v1/sandboxes", `{"metadata":{"a\n":"b"}}`, bad, inv), "metadata"),
		withMsg(body("POST", "/v1/sandboxes", `{"metadata":{"a":"\u001b[2J"}}`, bad, inv), "metadata"),
		withMsg(body("POST", "/sandboxes", `{"templateID":"base","metadata":{"a\u0000":"b"}}`, bad, e2bShape), "metadata"),
		withMsg(body("POST", "/v1/sandboxes", `{"env":{"A":"b\u0000c"}}`, bad, inv), "NUL"),
		withMsg(body("POST", "/sandboxes", `{"templateID":"base","envVars":{"A":"\u0000"}}`, bad, e2bShape), "NUL"),
		withMsg(body("POST", "/v1/sandboxes", `{"agent":"a\u0000b"}`, bad, inv), "agent"),
		withMsg(body("POST", "/v1/sandboxes", `{"agent":"a\nb"}`, bad, inv), "agent"),
		withMsg(body("POST", "/v1/tasks", `{"agent":"a\u0000b"}`, bad, inv), "agent"),

		// MCP: a message that is not JSON, names a key twice, is empty
		// or over the body bound (the SDK's, which answered in plain
		// text): JSON-RPC's parse error (-32700) or invalid request
		// (-32600), id null, with the exact message
		mcp400(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`,
			`key "params.protocolVersion" is given twice in one object`),
		mcp400(`{"jsonrpc":"2.0","id":1,"method":"tools/list"`, "syntax error at byte 45: unexpected end of JSON input"),
		mcp400(`jsonrpc=2.0`, "syntax error at byte 1: invalid character 'j' looking for beginning of value"),
		mcp400(`{"jsonrpc":"2.0","id":1,"method":"tools/list"} {}`, "unexpected data after the JSON value at byte 48"),
		mcp400(`[{"jsonrpc":"2.0","id":1,"method":"ping","id":2}]`, `key "[0].id" is given twice in one object`),
		mcp400("\n", "empty body; expected a JSON object"),
		badCase{method: "POST", path: "/mcp", hdr: mcpHdr, status: http.StatusRequestEntityTooLarge, code: api.CodeBodyTooLarge, rpc: -32600,
			msg: fmt.Sprintf("request body exceeds %d bytes", api.MaxMCPBody), exact: true,
			body: `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"` +
				strings.Repeat("x", api.MaxMCPBody) + `","version":"1"}}}`},

		// native query parameters: a value out of range or malformed
		query("GET", "/v1/sandboxes?state=x", bad, inv, "state"),
		query("GET", "/v1/tasks?state=x", bad, inv, "state"),
		query("GET", "/v1/audit?limit=-1", bad, inv, "limit"), query("GET", "/v1/audit?limit=0", bad, inv, "limit"),
		query("GET", "/v1/audit?limit=10001", bad, inv, "1 to 10000"),
		query("GET", "/v1/audit?limit=99999999999999999999", bad, inv, "limit"), query("GET", "/v1/audit?limit=+5", bad, inv, "limit"),
		query("GET", "/v1/audit?after=-1", bad, inv, "after"), query("GET", "/v1/audit?after=x", bad, inv, "after"),
		query("GET", "/v1/audit?since=x", bad, inv, "since"), query("GET", "/v1/audit?until=2026-13-01", bad, inv, "until"),
		query("GET", "/v1/audit?format=xml", bad, inv, "format"),
		query("GET", "/v1/events/stream?after=-1", bad, inv, "after"),
		query("GET", "/v1/events/stream", bad, inv, "Last-Event-ID", "Last-Event-ID", "-1"),
		query("GET", "/v1/usage?by=x", bad, inv, "by"), query("GET", "/v1/usage?since=9999-99", bad, inv, "since"),
		query("GET", "/v1/usage?since=-1h", bad, inv, "since"), query("GET", "/v1/usage?until=x", bad, inv, "until"),
		query("GET", s+"/metrics?since=x", bad, inv, "since"),
		query("GET", "/v1/templates/base/inspect?top=0", bad, inv, "top"), query("GET", "/v1/templates/base/inspect?top=x", bad, inv, "top"),
		query("GET", "/v1/tools?format=xml", bad, inv, "format"),
		query("POST", "/v1/templates/import?ref=a:1&publish=yes", bad, inv, "publish"),
		// ... repeated, unprintable, over-long, malformed
		query("GET", "/v1/audit?limit=5&limit=6", bad, inv, "more than once"),
		query("GET", "/v1/sandboxes?metadata.k=a&metadata.k=b", bad, inv, "more than once"),
		query("GET", "/v1/audit?kind=a%00b", bad, inv, "control character"),
		query("GET", "/v1/snapshots?sandbox=a%0Ab", bad, inv, "control character"),
		query("GET", "/v1/audit?sandbox="+strings.Repeat("x", 2000), bad, inv, "longer than"),
		query("GET", "/v1/audit?kind=%FF", bad, inv, "UTF-8"),
		query("GET", "/v1/audit?kind=%zz", bad, inv, "malformed"),
		query("GET", "/v1/sandboxes?team=a%00b", bad, inv, "team"),
		// ... unknown to the route (native routes refuse them)
		query("GET", s+"/commands?limit=-1", bad, inv, "limit"), query("GET", "/v1/sandboxes?status=running", bad, inv, "status"),
		query("GET", "/v1/sandboxes?metadata.=x", bad, inv, "metadata."), query("GET", "/v1/audit?Limit=5", bad, inv, "Limit"),
		query("DELETE", s+"?force=1", bad, inv, "force"), query("GET", "/v1/tools?x=1", bad, inv, "x"),
		query("GET", "/v1/events/stream?nope=1", bad, inv, "nope"), query("POST", "/mcp?x=1", bad, inv, "x"),

		// E2B query parameters: known ones with a bad value (unknown ones
		// are ignored, TestE2BIgnoresUnknownParams)
		query("GET", "/v2/sandboxes?limit=-1", bad, e2bShape, "limit"), query("GET", "/v2/sandboxes?limit=101", bad, e2bShape, "limit"),
		query("GET", "/v2/sandboxes?metadata=x", bad, e2bShape, "metadata"),
		query("GET", "/v2/sandboxes?metadata=%253Dv", bad, e2bShape, "metadata"),
		query("GET", "/v2/sandboxes?metadata=k%3Da%26k%3Db", bad, e2bShape, "metadata"),
		query("GET", "/v2/sandboxes?metadata=k%3Da%2500", bad, e2bShape, "metadata"),
		query("GET", "/v2/sandboxes?nextToken=abc", bad, e2bShape, "nextToken"),
		query("GET", "/v2/sandboxes?nextToken=KzE", bad, e2bShape, "nextToken"), // "+1"
		query("GET", "/v2/sandboxes?nextToken=LTE", bad, e2bShape, "nextToken"), // "-1"
		query("GET", "/v2/sandboxes?nextToken=MQ%3D%3D", bad, e2bShape, "nextToken"),
		query("GET", "/v2/sandboxes?state=ended", bad, e2bShape, "state"),
		query("GET", "/v2/sandboxes?startedAfter=x", bad, e2bShape, "startedAfter"),
		query("GET", "/v2/sandboxes?order=up", bad, e2bShape, "order"),
		query("GET", "/v2/sandboxes?limit=1&limit=2", bad, e2bShape, "more than once"),
		query("GET", "/sandboxes?template=a%00", bad, e2bShape, "template"),
		query("GET", "/snapshots?limit=-1", bad, e2bShape, "limit"), query("GET", "/snapshots?limit=x", bad, e2bShape, "limit"),
		query("GET", "/snapshots?limit=1001", bad, e2bShape, "limit"), query("GET", "/snapshots?nextToken=nope", bad, e2bShape, "nextToken"),
		query("GET", "/sandboxes/"+sb.ID+"/metrics?start=-1", bad, e2bShape, "start"),
		query("GET", "/sandboxes/"+sb.ID+"/metrics?end=x", bad, e2bShape, "end"),
		query("GET", "/sandboxes/"+sb.ID+"/metrics?start=5&end=1", bad, e2bShape, "start"),
		// a template spec that cannot be built: refused before the stream
		withMsg(body("POST", "/v1/templates/builds", `{"name":"a\u0000","version":"1"}`, bad, inv), "template name"),
	)
	// the JSON rule of every route that reads a body (parseJSON), with
	// exact messages; emptyOK: an empty body is the route's defaults
	// (E2B's routes, and native ones whose body is optional)
	for _, r := range []struct {
		method, path string
		e2b, emptyOK bool
		hdr          []string
	}{
		{method: "POST", path: "/v1/sandboxes"}, {method: "POST", path: s + "/timeout"}, {method: "POST", path: s + "/exec"},
		{method: "PUT", path: s + "/network"}, {method: "POST", path: s + "/snapshots", emptyOK: true},
		{method: "POST", path: s + "/fork", emptyOK: true}, {method: "POST", path: s + "/pause", emptyOK: true},
		{method: "POST", path: s + "/resume", emptyOK: true}, {method: "POST", path: s + "/template"},
		{method: "POST", path: s + "/code"}, {method: "POST", path: s + "/code/contexts", emptyOK: true},
		{method: "POST", path: "/v1/tasks"}, {method: "PATCH", path: tk},
		{method: "POST", path: tk + "/tokens"}, {method: "PUT", path: "/v1/secrets/S1"}, {method: "POST", path: "/v1/keys"},
		{method: "PUT", path: "/v1/teams/alpha/quota"}, {method: "PUT", path: "/v1/pools/base"}, {method: "POST", path: "/v1/volumes"},
		{method: "POST", path: "/v1/templates/builds"}, {method: "POST", path: "/v1/templates/import"},
		{method: "POST", path: "/v1/tools/call"},
		{method: "POST", path: "/sandboxes", e2b: true}, {method: "POST", path: "/sandboxes/" + sb.ID + "/timeout", e2b: true},
		{method: "POST", path: "/sandboxes/" + sb.ID + "/connect", e2b: true}, {method: "POST", path: "/sandboxes/" + sb.ID + "/resume", e2b: true},
		{method: "PUT", path: "/sandboxes/" + sb.ID + "/network", e2b: true}, {method: "POST", path: "/sandboxes/" + sb.ID + "/snapshots", e2b: true},
		{method: "POST", path: "/sandboxes/" + sb.ID + "/fork", e2b: true}, {method: "POST", path: "/volumes", e2b: true},
		{method: "POST", path: "/execute", e2b: true, hdr: execHdr},
	} {
		for _, b := range []struct{ body, msg string }{
			{`{"a":`, "syntax error at byte 5: unexpected end of JSON input"},
			{`{"a" 1}`, "syntax error at byte 6: invalid character '1' after object key"},
			{"{\n  \"a\": nul }", "syntax error at byte 13: invalid character ' ' in literal null (expecting 'l')"},
			{`not json`, "syntax error at byte 2: invalid character 'o' in literal null (expecting 'u')"},
			{`{} []`, "unexpected data after the JSON value at byte 4"},
			{"{}\n\n{}", "unexpected data after the JSON value at byte 5"},
			{`{"a":1,"a":2}`, `key "a" is given twice in one object`},
			{`{"x":{"k":[{"a":1,"a":2}]}}`, `key "x.k[0].a" is given twice in one object`},
			{`[]`, "expected an object, got an array"},
			{`"x"`, "expected an object, got a string"},
			{" \n", "empty body; expected a JSON object"},
		} {
			if strings.TrimSpace(b.body) == "" && (r.e2b || r.emptyOK) {
				continue
			}
			c := badCase{method: r.method, path: r.path, body: b.body, hdr: r.hdr, status: bad, code: js, msg: b.msg, exact: true}
			if r.e2b {
				c.code = e2bShape
			}
			cases = append(cases, c)
		}
	}
	before := e.stateOf()
	for _, c := range cases {
		name := c.method + " " + c.path[:min(len(c.path), 70)] + " " + c.body[:min(len(c.body), 60)]
		st, raw := e.do(c)
		var ae struct {
			Code    any    `json:"code"`
			Message string `json:"message"`
		}
		want := any(c.code)
		if c.rpc != 0 {
			// JSON-RPC 2.0: {"jsonrpc":"2.0","id":null,"error":{"code","message","data"}}
			var re struct {
				JSONRPC string           `json:"jsonrpc"`
				ID      *json.RawMessage `json:"id"`
				Error   struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
					Data    struct {
						Code string `json:"code"`
					} `json:"data"`
				} `json:"error"`
			}
			if err := json.Unmarshal(raw, &re); err != nil || re.JSONRPC != "2.0" || !bytes.Contains(raw, []byte(`"id":null`)) || re.Error.Code != c.rpc {
				t.Errorf("%s: %d %q: not a JSON-RPC error of code %d with id null", name, st, raw, c.rpc)
				continue
			}
			ae.Code, ae.Message = re.Error.Data.Code, re.Error.Message
		} else if err := json.Unmarshal(raw, &ae); err != nil {
			t.Errorf("%s: %d %q: not a JSON error", name, st, raw)
			continue
		}
		if c.code == e2bShape {
			want = float64(c.status)
		}
		if st != c.status || ae.Code != want {
			t.Errorf("%s: %d %v %q, want %d %v", name, st, ae.Code, ae.Message, c.status, want)
		}
		if c.exact && ae.Message != c.msg {
			t.Errorf("%s: message %q, want %q", name, ae.Message, c.msg)
		} else if ae.Message == "" || !strings.Contains(ae.Message, c.msg) {
			t.Errorf("%s: message %q, want one naming %q", name, ae.Message, c.msg)
		}
		if goName.MatchString(ae.Message) {
			t.Errorf("%s: message %q names a Go type", name, ae.Message)
		}
		if after := e.stateOf(); after != before {
			t.Fatalf("%s changed state:\nbefore %s\nafter  %s", name, before, after)
		}
	}
}

// goName matches the Go type and struct names encoding/json's errors
// carry ("Go struct field createRequest.timeout of type int64").
var goName = regexp.MustCompile(`Go (struct|value)|json: |of type|\bu?int(8|16|32|64)?\b|float(32|64)|map\[|\[\]|struct \{`)

// TestE2BIgnoresUnknownParams pins the E2B routes' rule for query
// parameters they do not read: ignored, as E2B's API ignores them (an
// SDK newer than corral may send one), while the same on a native route
// is refused (TestBadInputRefused).
func TestE2BIgnoresUnknownParams(t *testing.T) {
	t.Parallel()
	e := newTeamEnv(t)
	sb := e.createNative(map[string]any{})
	for _, p := range []string{"/v2/sandboxes?newFilter=1", "/sandboxes?x=y", "/snapshots?sort=asc", "/sandboxes/" + sb.ID + "?x=1",
		"/sandboxes/" + sb.ID + "/metrics?step=5"} {
		if st, body := e.do(badCase{method: "GET", path: p}); st != http.StatusOK {
			t.Errorf("GET %s: %d %s, want 200", p, st, body)
		}
	}
}

// unsupportedDriver is the fake driver without pause, resume and
// snapshots, as the Kubernetes driver is (runtime.ErrUnsupported).
type unsupportedDriver struct{ *runtimetest.Driver }

func (d unsupportedDriver) Pause(ctx context.Context, id string) error {
	return fmt.Errorf("kube: pause sandbox %s: %w", id, runtime.ErrUnsupported)
}

func (d unsupportedDriver) Snapshot(ctx context.Context, id, dst string) (int64, error) {
	return 0, fmt.Errorf("kube: snapshot sandbox %s: %w", id, runtime.ErrUnsupported)
}

// TestE2BUnsupportedNot500 defends against a known condition answered as
// a server fault: E2B's pause and snapshot of a sandbox whose driver
// cannot (Kubernetes) answered 500 "pause failed" (a fork: 201 with an
// error entry of code 500 carrying the internal error's text) while the
// native API answers 501 not_supported; both APIs now answer 501 and the
// sandbox stays running.
func TestE2BUnsupportedNot500(t *testing.T) {
	t.Parallel()
	e := newEnvDriver(t, 4, func(d *runtimetest.Driver) runtime.Driver { return unsupportedDriver{d} })
	sb := e.createNative(map[string]any{})
	for _, c := range []struct{ method, path string }{
		{"POST", "/sandboxes/" + sb.ID + "/pause"},
		{"POST", "/sandboxes/" + sb.ID + "/snapshots"},
		{"POST", "/sandboxes/" + sb.ID + "/fork"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/pause"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/snapshots"},
	} {
		var ae struct {
			Message string `json:"message"`
		}
		if st := e.call(c.method, c.path, apiKey, "{}", &ae); st != http.StatusNotImplemented || !strings.Contains(ae.Message, "does not support") {
			t.Errorf("%s %s: %d %q, want 501 not_supported", c.method, c.path, st, ae.Message)
		}
	}
	var got sandboxView
	if st := e.call("GET", "/v1/sandboxes/"+sb.ID, apiKey, nil, &got); st != 200 || got.State != "running" {
		t.Fatalf("after refused pauses: %d %+v", st, got)
	}
}

// TestKeyQuotaRefusalIsCapacity defends against a known capacity
// condition answered as a server fault: with the kernel's per-user key
// quota lowered after the server started (below what TestKeyQuotaNotRaised
// capped admission at), runc fails the create with "unable to create
// session key: disk quota exceeded", which reached both APIs as 500
// internal. The fake driver fails Start as the runc driver reports it
// (runtime.ErrKeyQuota around runc's text; TestRuncKeyQuotaFull checks
// the recognition), through the real Manager and error mapping: the native create is 429
// capacity_exceeded naming kernel.keys.maxkeys with Retry-After, E2B's
// create the same in E2B's shape, and no sandbox is left.
func TestKeyQuotaRefusalIsCapacity(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10)
	e.d.OnStart(func(runtime.Config) error {
		return fmt.Errorf("%w: %s", runtime.ErrKeyQuota, `runc run: exit status 1: time="2026-12-02T07:00:00Z" level=error msg="runc run failed: unable to start container process: `+
			`error during container init: unable to join session keyring: unable to create session key: disk quota exceeded"`)
	})
	for _, c := range []struct {
		path string
		code any
	}{{"/v1/sandboxes", api.CodeCapacityExceeded}, {"/sandboxes", float64(http.StatusTooManyRequests)}} {
		body := map[string]any{}
		if c.path == "/sandboxes" {
			body = map[string]any{"templateID": "base"}
		}
		req, _ := json.Marshal(body)
		hreq, _ := http.NewRequest("POST", e.srv.URL+c.path, strings.NewReader(string(req)))
		hreq.Header.Set("X-API-Key", apiKey)
		hreq.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(hreq)
		if err != nil {
			t.Fatal(err)
		}
		var ae struct {
			Code    any    `json:"code"`
			Message string `json:"message"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&ae)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || ae.Code != c.code || !strings.Contains(ae.Message, "kernel.keys.maxkeys") ||
			resp.Header.Get("Retry-After") == "" {
			t.Errorf("POST %s: %d %v %q Retry-After %q, want 429 %v naming kernel.keys.maxkeys", c.path, resp.StatusCode, ae.Code, ae.Message,
				resp.Header.Get("Retry-After"), c.code)
		}
	}
	var list struct {
		Sandboxes []sandboxView `json:"sandboxes"`
	}
	if st := e.call("GET", "/v1/sandboxes", apiKey, nil, &list); st != 200 || len(list.Sandboxes) != 0 || e.d.Starts() != 0 {
		t.Fatalf("after refused creates: %d %+v, driver holds %d", st, list.Sandboxes, e.d.Starts())
	}
}
