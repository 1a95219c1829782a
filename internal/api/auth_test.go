package api

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
)

const testKey = "e2b_0123456789abcdef0123456789abcdef01234567"

// authServer returns a Server over a real SQLite store in a temporary
// dir that knows testKey (named "admin") and, stored too, a key longer
// than MaxAPIKeyLen.
func authServer(t *testing.T) (*Server, *store.Store) {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	if err := st.AddAPIKey(ctx, "admin", testKey, "", "admin"); err != nil {
		t.Fatal(err)
	}
	if err := st.AddAPIKey(ctx, "long", strings.Repeat("k", MaxAPIKeyLen+1), "", "admin"); err != nil {
		t.Fatal(err)
	}
	return &Server{store: st, log: slog.New(slog.NewTextHandler(io.Discard, nil)), streams: newStreamLimit(0)}, st
}

// TestAuthenticate defends against use of the API without a valid key,
// through either header, on both route families: the one middleware
// admits the right key as X-API-Key or Bearer (any case of "Bearer"),
// attaches the caller's identity (key id, name, role; never the key),
// and refuses a missing, wrong, oversized or non-Bearer credential with
// 401 in the family's error shape: corral's {"code":"unauthenticated"}
// on native routes, E2B's {"code":401,"message":"Invalid API key"} on
// E2B routes (the SDK's AuthenticationError). The handler never runs on
// a refusal.
func TestAuthenticate(t *testing.T) {
	s, _ := authServer(t)
	wantID := Identity{Kind: CredAPIKey, Team: store.DefaultTeam, KeyID: store.KeyID(store.HashKey(testKey)), KeyName: "admin", Role: RoleAdmin}
	cases := []struct {
		name   string
		header map[string]string
		ok     bool
	}{
		{"missing", nil, false},
		{"right X-API-Key", map[string]string{"X-API-Key": testKey}, true},
		{"right Bearer", map[string]string{"Authorization": "Bearer " + testKey}, true},
		{"right bearer lower case", map[string]string{"Authorization": "bearer " + testKey}, true},
		{"wrong X-API-Key", map[string]string{"X-API-Key": testKey[:len(testKey)-1] + "8"}, false},
		{"wrong Bearer", map[string]string{"Authorization": "Bearer e2b_nope"}, false},
		{"key as Basic password", map[string]string{"Authorization": "Basic " + testKey}, false},
		{"empty Bearer", map[string]string{"Authorization": "Bearer "}, false},
		{"wrong X-API-Key beats right Bearer", map[string]string{"X-API-Key": "e2b_nope", "Authorization": "Bearer " + testKey}, false},
		{"stored key over the length bound", map[string]string{"X-API-Key": strings.Repeat("k", MaxAPIKeyLen+1)}, false},
	}
	families := []struct {
		name  string
		wrap  func(http.HandlerFunc) http.Handler
		check func(t *testing.T, body []byte)
	}{
		{"native", s.auth, func(t *testing.T, body []byte) {
			var e apiError
			if err := json.Unmarshal(body, &e); err != nil || e.Code != CodeUnauthenticated || e.Message == "" {
				t.Errorf("native refusal body %s: want code %q", body, CodeUnauthenticated)
			}
		}},
		{"e2b", s.e2bAuth, func(t *testing.T, body []byte) {
			var e struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if err := json.Unmarshal(body, &e); err != nil || e.Code != 401 || e.Message != "Invalid API key" {
				t.Errorf("e2b refusal body %s: want {code:401, message:Invalid API key}", body)
			}
		}},
	}
	for _, f := range families {
		for _, c := range cases {
			t.Run(f.name+"/"+c.name, func(t *testing.T) {
				ran := false
				var got Identity
				h := f.wrap(func(w http.ResponseWriter, r *http.Request) {
					ran = true
					got, _ = identityFrom(r.Context())
					w.WriteHeader(http.StatusNoContent)
				})
				req := httptest.NewRequest("GET", "/x", nil)
				for k, v := range c.header {
					req.Header.Set(k, v)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if c.ok {
					if rec.Code != http.StatusNoContent || !ran || got != wantID {
						t.Fatalf("admitted: status %d, ran %v, identity %+v; want 204 and %+v", rec.Code, ran, got, wantID)
					}
					return
				}
				if rec.Code != http.StatusUnauthorized || ran {
					t.Fatalf("refused: status %d, handler ran %v; want 401 without running", rec.Code, ran)
				}
				f.check(t, rec.Body.Bytes())
			})
		}
	}
}

// TestAuthenticateStoreDown defends against failing open: when the store
// cannot check a key, both families refuse with 500 (native through the
// usual error mapping, E2B as {"code":500}) and the handler never runs.
func TestAuthenticateStoreDown(t *testing.T) {
	s, st := authServer(t)
	st.Close()
	for _, c := range []struct {
		name string
		wrap func(http.HandlerFunc) http.Handler
		body string
	}{
		{"native", s.auth, `"code":"internal"`},
		{"e2b", s.e2bAuth, `"code":500`},
	} {
		t.Run(c.name, func(t *testing.T) {
			ran := false
			req := httptest.NewRequest("GET", "/x", nil)
			req.Header.Set("X-API-Key", testKey)
			rec := httptest.NewRecorder()
			c.wrap(func(http.ResponseWriter, *http.Request) { ran = true }).ServeHTTP(rec, req)
			if rec.Code != http.StatusInternalServerError || ran || !strings.Contains(rec.Body.String(), c.body) {
				t.Fatalf("status %d, ran %v, body %s; want 500 with %s", rec.Code, ran, rec.Body, c.body)
			}
		})
	}
}

// TestSameSecret pins the one secret comparison: equal secrets match,
// a prefix, a longer string or anything against an empty expected
// secret does not.
func TestSameSecret(t *testing.T) {
	for _, c := range []struct {
		got, want string
		ok        bool
	}{
		{"tok", "tok", true},
		{"to", "tok", false},
		{"tokk", "tok", false},
		{"", "", false},
		{"x", "", false},
		{"", "tok", false},
	} {
		if sameSecret(c.got, c.want) != c.ok {
			t.Errorf("sameSecret(%q, %q) = %v, want %v", c.got, c.want, !c.ok, c.ok)
		}
	}
}

// TestRouteFamilies checks the wiring: every route family sits behind
// the middleware with its own refusal shape, so a request without a key
// to a native route, /metrics, or an E2B route is refused before any
// handler runs (the Server here has an empty Manager: a handler that
// ran would panic).
func TestRouteFamilies(t *testing.T) {
	_, st := authServer(t)
	s := New(Config{Metrics: http.NotFoundHandler()}, new(sandbox.Manager), st, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, c := range []struct {
		method, path string
		e2b          bool
	}{
		{"GET", "/v1/sandboxes", false},
		{"POST", "/v1/sandboxes", false},
		{"GET", "/v1/templates", false},
		{"DELETE", "/v1/templates/base:1", false},
		{"POST", "/v1/sandboxes/x/exec", false},
		{"GET", "/metrics", false},
		{"GET", "/sandboxes", true},
		{"POST", "/sandboxes", true},
		{"POST", "/v2/sandboxes", true},
		{"GET", "/templates/aliases/base", true},
		{"DELETE", "/templates/snap-x", true},
	} {
		for _, key := range []string{"", "e2b_wrong"} {
			req := httptest.NewRequest(c.method, c.path, strings.NewReader("{}"))
			if key != "" {
				req.Header.Set("Authorization", "Bearer "+key)
			}
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, req)
			body := rec.Body.String()
			shape := strings.Contains(body, `"code":"unauthenticated"`)
			if c.e2b {
				shape = strings.Contains(body, `"code":401`) && strings.Contains(body, "Invalid API key")
			}
			if rec.Code != http.StatusUnauthorized || !shape {
				t.Errorf("%s %s (key %q): %d %s; want 401 in the %s shape", c.method, c.path, key, rec.Code, body, map[bool]string{false: "native", true: "E2B"}[c.e2b])
			}
		}
	}
}

// TestEveryRouteAuthenticated guards against a route registered without
// the API-key check (an open door for every caller that can reach the
// port): every s.mux.Handle registration in the API's sources goes
// through s.auth, s.admin or s.e2bAuth unless it is one of the few public routes
// named here with the reason, and each authenticated route, called
// without a key or with a wrong one, answers 401 in its family's shape
// without reaching its handler.
func TestEveryRouteAuthenticated(t *testing.T) {
	// Envd traffic (E2b-Sandbox-Id, <port>-<id> hosts, signed /files) is
	// routed before this mux (Server.route) and checks the sandbox's
	// access token or signature instead.
	public := map[string]string{
		`"GET /healthz"`:    "liveness probe, no data",
		`"/volumecontent/"`: "E2B volume content API: its own per-volume token",
		`"/"`:               "the not-found answer, no data",
		`"GET /ui/"`:        "the console's static files, no data (the page calls the API with its user's key)",
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	type route struct {
		method, path string
		e2b          bool
	}
	var routes []route
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(src), "\n") {
			line = strings.TrimSpace(line)
			if !strings.HasPrefix(line, "s.mux.Handle(") && !strings.HasPrefix(line, "s.mux.HandleFunc(") {
				continue
			}
			args := line[strings.Index(line, "(")+1:]
			pattern, rest, _ := strings.Cut(args, ",")
			rest = strings.TrimSpace(rest)
			authed, e2b := strings.HasPrefix(rest, "s.auth(") || strings.HasPrefix(rest, "s.admin("), strings.HasPrefix(rest, "s.e2bAuth(")
			if !authed && !e2b {
				if _, ok := public[pattern]; !ok {
					t.Errorf("%s: route %s is registered without s.auth, s.admin or s.e2bAuth: %s", f, pattern, line)
				}
				continue
			}
			method, path, ok := strings.Cut(strings.Trim(pattern, `"`), " ")
			if !ok { // a pattern for every method
				method, path = http.MethodGet, method
			}
			for _, p := range []string{"{id}", "{ref}", "{name}", "{template}", "{alias}"} {
				path = strings.ReplaceAll(path, p, "x")
			}
			routes = append(routes, route{method, path, e2b})
		}
	}
	if len(routes) < 60 {
		t.Fatalf("found %d authenticated routes in the sources; the parser lost some", len(routes))
	}
	_, st := authServer(t)
	s := New(Config{Metrics: http.NotFoundHandler()}, new(sandbox.Manager), st, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, c := range routes {
		for _, key := range []string{"", "e2b_wrong"} {
			req := httptest.NewRequest(c.method, c.path, strings.NewReader("{}"))
			if key != "" {
				req.Header.Set("X-API-Key", key)
			}
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, req)
			body := rec.Body.String()
			shape := strings.Contains(body, `"code":"unauthenticated"`)
			if c.e2b {
				shape = strings.Contains(body, `"code":401`)
			}
			if rec.Code != http.StatusUnauthorized || !shape {
				t.Errorf("%s %s (key %q): %d %s; want 401", c.method, c.path, key, rec.Code, body)
			}
		}
	}
	t.Logf("%d authenticated routes refuse a missing or wrong key", len(routes))
}
