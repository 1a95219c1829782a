package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/api"
	"github.com/corralhq/corral/internal/sandbox"
)

// portCall sends GET / to port 8080 of sandbox id (host form
// 8080-<id>.<domain>) with the traffic token tok ("" = no header) and
// returns the status and the answer's code.
func (e *env) portCall(id, tok string) (int, string) {
	e.t.Helper()
	req, err := http.NewRequest("GET", e.srv.URL+"/", nil)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Host = "8080-" + id + ".corral.test"
	if tok != "" {
		req.Header.Set("e2b-traffic-access-token", tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var a apiErr
	_ = json.Unmarshal(data, &a)
	return resp.StatusCode, a.Code
}

// TestPrivatePortsToken defends against anyone who can reach corral's
// listener reaching an app served by a sandbox whose creator asked for
// private ports (E2B's network.allowPublicTraffic false, native
// public_traffic false, or the server's --ports-default private): such a
// port refuses a request without the sandbox's traffic token, or with
// another sandbox's, with 403 traffic_token_required; the right token
// passes the check (the fake driver has no port tunnel, so what follows
// is not 403), and a public sandbox needs none. Each sandbox, the
// restored one too, has its own token. The token survives in the store.
func TestPrivatePortsToken(t *testing.T) {
	t.Parallel()
	type created struct{ id, token string }
	native := func(e *env, body any) created {
		var v struct {
			ID            string `json:"id"`
			PublicTraffic bool   `json:"public_traffic"`
			TrafficToken  string `json:"traffic_token"`
		}
		if st := e.call("POST", "/v1/sandboxes", apiKey, body, &v); st != http.StatusCreated {
			t.Fatalf("native create: %d", st)
		}
		if v.PublicTraffic != (v.TrafficToken == "") {
			t.Fatalf("native view: public_traffic %v with token %q", v.PublicTraffic, v.TrafficToken)
		}
		return created{v.ID, v.TrafficToken}
	}
	e2b := func(e *env, body any) created {
		var v struct {
			SandboxID          string  `json:"sandboxID"`
			TrafficAccessToken *string `json:"trafficAccessToken"`
		}
		if st := e.call("POST", "/sandboxes", apiKey, body, &v); st != http.StatusCreated {
			t.Fatalf("e2b create: %d", st)
		}
		c := created{id: v.SandboxID}
		if v.TrafficAccessToken != nil {
			if *v.TrafficAccessToken == "" {
				t.Fatal("e2b create: trafficAccessToken is an empty string, want null or a token")
			}
			c.token = *v.TrafficAccessToken
		}
		return c
	}
	private := func(c *sandbox.Config) { c.PrivatePorts = true }
	for _, tc := range []struct {
		name        string
		opts        []func(*sandbox.Config)
		create      func(*env, any) created
		body        any
		wantPrivate bool
	}{
		{"e2b private", nil, e2b, map[string]any{"network": map[string]any{"allowPublicTraffic": false}}, true},
		{"e2b public explicit", nil, e2b, map[string]any{"network": map[string]any{"allowPublicTraffic": true}}, false},
		{"e2b default public", nil, e2b, map[string]any{}, false},
		{"e2b server default private", []func(*sandbox.Config){private}, e2b, map[string]any{}, true},
		{"e2b public over private default", []func(*sandbox.Config){private}, e2b, map[string]any{"network": map[string]any{"allowPublicTraffic": true}}, false},
		{"native private", nil, native, map[string]any{"public_traffic": false}, true},
		{"native default public", nil, native, map[string]any{}, false},
		{"native server default private", []func(*sandbox.Config){private}, native, map[string]any{}, true},
		{"native public over private default", []func(*sandbox.Config){private}, native, map[string]any{"public_traffic": true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 10, tc.opts...)
			sb := tc.create(e, tc.body)
			other := tc.create(e, tc.body)
			if (sb.token != "") != tc.wantPrivate {
				t.Fatalf("token %q, want private=%v", sb.token, tc.wantPrivate)
			}
			rec, err := e.st.GetSandbox(context.Background(), sb.id)
			if err != nil || rec.TrafficToken != sb.token {
				t.Fatalf("stored token %q, %v; want the returned one", rec.TrafficToken, err)
			}
			if !tc.wantPrivate {
				if st, code := e.portCall(sb.id, ""); st == http.StatusForbidden || code == api.CodeTrafficToken {
					t.Fatalf("public sandbox without token: %d %s", st, code)
				}
				return
			}
			if other.token == sb.token {
				t.Fatal("two sandboxes share a traffic token")
			}
			for _, bad := range []string{"", "wrong", other.token, strings.ToUpper(sb.token)} {
				if st, code := e.portCall(sb.id, bad); st != http.StatusForbidden || code != api.CodeTrafficToken {
					t.Fatalf("token %q: %d %q, want 403 %s", bad, st, code, api.CodeTrafficToken)
				}
			}
			if st, code := e.portCall(sb.id, sb.token); st == http.StatusForbidden || code == api.CodeTrafficToken {
				t.Fatalf("right token: %d %s", st, code)
			}
		})
	}
}

// TestPrivatePortsLifecycle defends against a private sandbox's ports
// turning public, or its token changing hands, across its life: pause
// and resume (memory kept, and files persisted) keep its token and its
// refusal; a fork of it is private too, with its own token (a fork took
// the server's default, public, so forking exposed the parent's app).
func TestPrivatePortsLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10)
	type sbv struct {
		ID            string `json:"id"`
		PublicTraffic bool   `json:"public_traffic"`
		TrafficToken  string `json:"traffic_token"`
	}
	var sb sbv
	if st := e.call("POST", "/v1/sandboxes", apiKey, map[string]any{"public_traffic": false}, &sb); st != http.StatusCreated || sb.TrafficToken == "" {
		t.Fatalf("create: %d %+v", st, sb)
	}
	for _, persist := range []bool{false, true} {
		if st := e.call("POST", "/v1/sandboxes/"+sb.ID+"/pause", apiKey, map[string]any{"persist": persist}, nil); st != http.StatusOK {
			t.Fatalf("pause (persist %v): %d", persist, st)
		}
		var got sbv
		if st := e.call("POST", "/v1/sandboxes/"+sb.ID+"/resume", apiKey, map[string]any{}, &got); st != http.StatusOK {
			t.Fatalf("resume (persist %v): %d", persist, st)
		}
		if got.TrafficToken != sb.TrafficToken || got.PublicTraffic {
			t.Fatalf("after pause/resume (persist %v): %+v, want token %q", persist, got, sb.TrafficToken)
		}
		if st, code := e.portCall(sb.ID, ""); st != http.StatusForbidden || code != api.CodeTrafficToken {
			t.Fatalf("after resume (persist %v) without token: %d %s", persist, st, code)
		}
		if st, _ := e.portCall(sb.ID, sb.TrafficToken); st == http.StatusForbidden {
			t.Fatalf("after resume (persist %v) with token: 403", persist)
		}
	}
	var fork struct {
		Sandboxes []sbv `json:"sandboxes"`
	}
	if st := e.call("POST", "/v1/sandboxes/"+sb.ID+"/fork", apiKey, map[string]any{"count": 2}, &fork); st != http.StatusCreated || len(fork.Sandboxes) != 2 {
		t.Fatalf("fork: %d %+v", st, fork)
	}
	seen := map[string]bool{sb.TrafficToken: true}
	for _, f := range fork.Sandboxes {
		if f.PublicTraffic || f.TrafficToken == "" || seen[f.TrafficToken] {
			t.Fatalf("fork %+v: want private with its own token", f)
		}
		seen[f.TrafficToken] = true
		if st, code := e.portCall(f.ID, sb.TrafficToken); st != http.StatusForbidden || code != api.CodeTrafficToken {
			t.Fatalf("fork %s with the parent's token: %d %s", f.ID, st, code)
		}
	}
}
