package api_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/api"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/runtime/runtimetest"
)

// stateOf is what the admin key reads of everything a request could
// change: sandboxes (any state), tasks, keys, secrets, snapshots, pools,
// teams' quotas, templates.
func (e *env) stateOf() string {
	e.t.Helper()
	var b strings.Builder
	for _, p := range []string{"/v1/sandboxes?state=all", "/v1/tasks?state=all", "/v1/keys", "/v1/secrets", "/v1/snapshots",
		"/v1/pools", "/v1/teams", "/v1/templates"} {
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

// TestBadInputRefused defends against bad input answered as a server
// fault or acted upon: per route family, ids with an encoded slash, a
// NUL, a newline or 5000 characters, JSON of the wrong type, numbers out
// of range and unknown fields get a 4xx with a stable code (never 500
// internal) and change nothing the admin key can read.
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
	long := strings.Repeat("x", 5000)
	badIDs := []string{"a%2Fb", "a%00b", "a%0Ab", long, "%2E%2E"}
	stable := map[string]bool{api.CodeInvalidJSON: true, api.CodeInvalidArgument: true, api.CodeNotFound: true,
		api.CodeConflict: true, api.CodeBodyTooLarge: true, api.CodeForbidden: true}
	type req struct{ method, path, body string }
	var cases []req
	for _, id := range badIDs {
		for _, r := range []req{
			{"GET", "/v1/sandboxes/{}", ""}, {"DELETE", "/v1/sandboxes/{}", ""}, {"POST", "/v1/sandboxes/{}/timeout", `{"timeout":60}`},
			{"POST", "/v1/sandboxes/{}/exec", `{"command":"echo"}`}, {"POST", "/v1/sandboxes/{}/pause", ""},
			{"GET", "/v1/sandboxes/{}/metrics", ""}, {"PUT", "/v1/sandboxes/{}/network", `{"allow":[]}`},
			{"POST", "/v1/sandboxes/{}/snapshots", `{}`}, {"POST", "/v1/sandboxes/{}/fork", `{}`},
			{"GET", "/v1/snapshots/{}", ""}, {"DELETE", "/v1/snapshots/{}", ""},
			{"GET", "/v1/tasks/{}", ""}, {"PATCH", "/v1/tasks/{}", `{"max_calls":9}`}, {"DELETE", "/v1/tasks/{}", ""},
			{"POST", "/v1/tasks/{}/tokens", `{"tokens":1}`},
			{"PUT", "/v1/secrets/{}", `{"hosts":["api.example.com"],"value":"v"}`}, {"DELETE", "/v1/secrets/{}", ""},
			{"DELETE", "/v1/keys/{}", ""}, {"GET", "/v1/teams/{}/quota", ""}, {"PUT", "/v1/teams/{}/quota", `{"max_sandboxes":1}`},
			{"GET", "/v1/templates/{}", ""}, {"DELETE", "/v1/templates/{}", ""}, {"POST", "/v1/templates/{}/current", `{}`},
			{"PUT", "/v1/pools/{}", `{"min":0,"max":1}`}, {"DELETE", "/v1/pools/{}", ""},
			{"GET", "/sandboxes/{}", ""}, {"DELETE", "/sandboxes/{}", ""}, {"POST", "/sandboxes/{}/timeout", `{"timeout":60}`},
			{"POST", "/sandboxes/{}/pause", ""}, {"POST", "/sandboxes/{}/resume", `{}`}, {"POST", "/sandboxes/{}/connect", `{"timeout":60}`},
		} {
			cases = append(cases, req{r.method, strings.ReplaceAll(r.path, "{}", id), r.body})
		}
	}
	s, tk := "/v1/sandboxes/"+sb.ID, "/v1/tasks/"+task.ID
	cases = append(cases,
		// wrong JSON types, out-of-range numbers, unknown fields
		req{"POST", "/v1/sandboxes", `{"template":5}`}, req{"POST", "/v1/sandboxes", `{"timeout":"x"}`},
		req{"POST", "/v1/sandboxes", `{"timeout":1e300}`}, req{"POST", "/v1/sandboxes", `{"timeout":-1}`},
		req{"POST", "/v1/sandboxes", `{"resources":{"memory_mb":-5}}`}, req{"POST", "/v1/sandboxes", `{"resources":{"cpu":1e308}}`},
		req{"POST", "/v1/sandboxes", `{"metadata":{"a":5}}`}, req{"POST", "/v1/sandboxes", `{"nope":1}`}, req{"POST", "/v1/sandboxes", `[]`},
		req{"POST", "/v1/sandboxes", `{"template":"a\u0000b"}`}, req{"POST", "/v1/sandboxes", `{"template":"` + long + `"}`},
		req{"POST", s + "/timeout", `{"timeout":-1}`}, req{"POST", s + "/timeout", `{"timeout":1e300}`}, req{"POST", s + "/timeout", `{"timeout":"x"}`},
		req{"POST", s + "/exec", `{"command":5}`}, req{"POST", s + "/exec", `{"command":"echo","timeout":-1}`}, req{"POST", s + "/exec", `{"nope":1}`},
		req{"PUT", s + "/network", `{"allow":[""]}`}, req{"PUT", s + "/network", `{"allow":5}`}, req{"PUT", s + "/network", `{"mode":"x"}`},
		req{"POST", s + "/snapshots", `{"name":5}`}, req{"POST", s + "/snapshots", `{"name":"` + long + `"}`},
		req{"GET", "/v1/sandboxes?state=x", ""},
		req{"POST", "/v1/tasks", `{"max_calls":-1}`}, req{"POST", "/v1/tasks", `{"max_calls":1e30}`}, req{"POST", "/v1/tasks", `{"agent":5}`},
		req{"POST", "/v1/tasks", `{"on_trip":"x"}`}, req{"POST", "/v1/tasks", `{"nope":1}`},
		req{"PATCH", tk, `{"max_calls":-1}`}, req{"PATCH", tk, `{"max_calls":"x"}`}, req{"POST", tk + "/tokens", `{"tokens":-1}`},
		req{"POST", tk + "/tokens", `{"tokens":9223372036854775807}`},
		req{"GET", "/v1/tasks?state=x", ""},
		req{"PUT", "/v1/secrets/S1", `{"hosts":["a"],"value":""}`}, req{"PUT", "/v1/secrets/S1", `{"hosts":5}`}, req{"PUT", "/v1/secrets/a%2Fb", `{}`},
		req{"POST", "/v1/keys", `{"role":"god"}`}, req{"POST", "/v1/keys", `{"team":"a/b"}`}, req{"POST", "/v1/keys", `{"name":5}`},
		req{"PUT", "/v1/teams/alpha/quota", `{"max_sandboxes":-1}`}, req{"PUT", "/v1/teams/alpha/quota", `{"max_cpus":"x"}`},
		req{"PUT", "/v1/pools/base", `{"min":-1,"max":-1}`}, req{"PUT", "/v1/pools/base", `{"min":5,"max":1}`}, req{"PUT", "/v1/pools/base", `{"min":"x"}`},
		req{"GET", "/v1/audit?limit=-1", ""}, req{"GET", "/v1/audit?limit=99999999999999999999", ""}, req{"GET", "/v1/audit?since=x", ""},
		req{"GET", "/v1/usage?by=x", ""}, req{"GET", "/v1/usage?since=9999-99", ""},
		req{"GET", s + "/metrics?since=x", ""},
		req{"POST", "/sandboxes", `{"templateID":5}`}, req{"POST", "/sandboxes", `{"timeout":4294967296}`}, req{"POST", "/sandboxes", `{"timeout":-1}`},
		req{"GET", "/v2/sandboxes?limit=-1", ""},
	)
	before := e.stateOf()
	for _, c := range cases {
		name := c.method + " " + c.path[:min(len(c.path), 70)] + " " + c.body[:min(len(c.body), 60)]
		var ae struct {
			Code    any    `json:"code"`
			Message string `json:"message"`
		}
		var body any
		if c.body != "" {
			body = c.body
		}
		st := e.call(c.method, c.path, apiKey, body, &ae)
		if st < 400 || st >= 500 {
			t.Errorf("%s: %d %+v, want a 4xx refusal", name, st, ae)
			continue
		}
		if code, ok := ae.Code.(string); ok && !stable[code] {
			t.Errorf("%s: %d with code %q, not a stable refusal code", name, st, code)
		}
		if ae.Message == "" {
			t.Errorf("%s: %d without a message", name, st)
		}
	}
	if after := e.stateOf(); after != before {
		t.Errorf("refused requests changed state:\nbefore %s\nafter  %s", before, after)
	}
	_ = context.Background
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
