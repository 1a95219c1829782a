package api_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/api"
	"github.com/corralhq/corral/internal/audit"
	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/runtime/runtimetest"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template/registry/registrytest"
)

// Keys of the two teams of the scoping tests (members), beside apiKey
// (admin of team default).
const (
	keyAlpha = "e2b_alpha_member_key_0123456789"
	keyBeta  = "e2b_beta_member_key_01234567890"
)

// newTeamEnv is newEnv with tasks, the audit log and three keys: apiKey
// (admin, team default), keyAlpha (member of alpha), keyBeta (member of
// beta).
func newTeamEnv(t *testing.T) *env {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, k := range []struct{ key, team, role string }{
		{apiKey, store.DefaultTeam, "admin"}, {keyAlpha, "alpha", "member"}, {keyBeta, "beta", "member"},
	} {
		if err := st.AddAPIKey(ctx, k.team, k.key, k.team, k.role); err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	al := audit.New(st, nil, log)
	gov := govern.New(govern.Config{Audit: al, Log: log}, st)
	d := runtimetest.New()
	reg, _ := registrytest.New(t, st)
	mc := sandbox.Config{
		WatchInterval: 20 * time.Millisecond, KillGrace: time.Millisecond,
		SnapshotDir: filepath.Join(t.TempDir(), "snapshots"), MemoryPressure: func() bool { return false },
		Admission: govern.NewAdmission(govern.AdmissionConfig{MaxConcurrent: 20, MaxPerAgent: 20, AgentRate: 1000, AgentBurst: 1000}),
		Governor:  gov, Audit: al,
	}
	m := sandbox.New(mc, st, d, reg, log)
	if err := m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.Config{Templates: reg, Governor: gov, Audit: al}, m, st, log))
	t.Cleanup(func() {
		srv.Close()
		m.Shutdown(context.Background(), true)
		al.Close()
		st.Close()
	})
	return &env{t: t, st: st, d: d, m: m, srv: srv}
}

// raw sends a request with key and returns the status and the body.
func (e *env) raw(method, path, key string) (int, string) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader("{}"))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// alphaObjects creates one object of each kind as team alpha: a
// sandbox, a task, a snapshot and a private template.
type alphaObjects struct{ sandbox, task, snapshot, template string }

func makeAlphaObjects(e *env) alphaObjects {
	e.t.Helper()
	var o alphaObjects
	var task struct {
		ID string `json:"id"`
	}
	if st := e.call("POST", "/v1/tasks", keyAlpha, map[string]any{"agent": "a1"}, &task); st != 201 {
		e.t.Fatalf("create task: %d", st)
	}
	o.task = task.ID
	var sb struct {
		ID   string `json:"id"`
		Team string `json:"team"`
	}
	if st := e.call("POST", "/v1/sandboxes", keyAlpha, map[string]any{"task": o.task}, &sb); st != 201 || sb.Team != "alpha" {
		e.t.Fatalf("create sandbox: %d, team %q", st, sb.Team)
	}
	o.sandbox = sb.ID
	var sn struct {
		ID string `json:"id"`
	}
	if st := e.call("POST", "/v1/sandboxes/"+o.sandbox+"/snapshots", keyAlpha, map[string]any{"name": "s"}, &sn); st != 201 {
		e.t.Fatalf("snapshot: %d", st)
	}
	o.snapshot = sn.ID
	var tv struct {
		Ref  string `json:"ref"`
		Team string `json:"team"`
	}
	if st := e.call("POST", "/v1/sandboxes/"+o.sandbox+"/template", keyAlpha, map[string]any{"ref": "alpha-tpl:1"}, &tv); st != 201 || tv.Team != "alpha" {
		e.t.Fatalf("save template: %d, team %q", st, tv.Team)
	}
	o.template = "alpha-tpl"
	return o
}

// scopedRoute is a registered route whose path names one object by id.
type scopedRoute struct{ method, path, kind string }

// scopedRoutes parses the API's route registrations (like
// TestEveryRouteAuthenticated) for every route with an {id} or {ref} of
// a sandbox, snapshot, task or template. Volumes, secrets and pools have
// their own tests.
func scopedRoutes(t *testing.T) []scopedRoute {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`s\.mux\.Handle(?:Func)?\("([^"]+)"`)
	var out []scopedRoute
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(src), -1) {
			method, path, ok := strings.Cut(m[1], " ")
			if !ok {
				method, path = http.MethodGet, method
			}
			var kind string
			switch {
			case strings.Contains(path, "sandboxes/{id}"):
				kind = "sandbox"
			case strings.HasPrefix(path, "/v1/snapshots/{id}"), strings.HasPrefix(path, "/templates/{id}"):
				kind = "snapshot"
			case strings.HasPrefix(path, "/v1/tasks/{id}"):
				kind = "task"
			case strings.HasPrefix(path, "/v1/templates/{ref}"), strings.HasPrefix(path, "/templates/aliases/{alias}"):
				kind = "template"
			default:
				continue
			}
			if strings.HasSuffix(path, "/") {
				path += "x"
			}
			out = append(out, scopedRoute{method, path, kind})
		}
	}
	return out
}

// TestEveryRouteScoped guards against one team reading, changing or
// probing another team's objects by id: every route that names a
// sandbox, snapshot, task or template, called with team beta's key on
// team alpha's object, answers exactly what it answers for an id that
// does not exist (404, same body), and alpha's objects are unchanged
// afterwards.
func TestEveryRouteScoped(t *testing.T) {
	e := newTeamEnv(t)
	o := makeAlphaObjects(e)
	ids := map[string][2]string{ // kind -> alpha's id, a missing id of the same shape
		"sandbox":  {o.sandbox, "zzzzzzzzzzzzzzzzzzzz"},
		"snapshot": {o.snapshot, "snap-zzzzzzzzzzzzzzzzzzzz"},
		"task":     {o.task, "tzzzzzzzzzzzzzzzzzzz"},
		"template": {o.template, "missing-tpl"},
	}
	routes := scopedRoutes(t)
	if len(routes) < 30 {
		t.Fatalf("found %d scoped routes; the parser lost some", len(routes))
	}
	for _, r := range routes {
		id := ids[r.kind]
		subst := func(v string) string {
			p := r.path
			for _, ph := range []string{"{id}", "{ref}", "{alias}"} {
				p = strings.ReplaceAll(p, ph, v)
			}
			return p
		}
		// Beta's member key, and the admin key without ?team= (an admin
		// sees other teams only when it asks).
		for _, key := range []string{keyBeta, apiKey} {
			st, body := e.raw(r.method, subst(id[0]), key)
			wantSt, wantBody := e.raw(r.method, subst(id[1]), key)
			body = strings.ReplaceAll(body, id[0], "ID")
			wantBody = strings.ReplaceAll(wantBody, id[1], "ID")
			adminOnly := key == keyBeta && st == http.StatusForbidden && strings.Contains(body, "needs an admin key")
			if (st != http.StatusNotFound && !adminOnly) || st != wantSt || body != wantBody {
				t.Errorf("%s %s with key %.8s on alpha's %s: %d %s; a missing id: %d %s (want the same 404)",
					r.method, r.path, key, r.kind, st, body, wantSt, wantBody)
			}
		}
	}
	t.Logf("%d routes answer another team's ids as missing ones", len(routes))

	// Alpha's objects are untouched.
	var sb struct {
		State string `json:"state"`
	}
	if st := e.call("GET", "/v1/sandboxes/"+o.sandbox, keyAlpha, nil, &sb); st != 200 || sb.State != store.StateRunning {
		t.Errorf("alpha's sandbox after beta's calls: %d %q", st, sb.State)
	}
	var task struct {
		State string `json:"state"`
	}
	if st := e.call("GET", "/v1/tasks/"+o.task, keyAlpha, nil, &task); st != 200 || task.State != store.TaskOpen {
		t.Errorf("alpha's task after beta's calls: %d %q", st, task.State)
	}
	for _, p := range []string{"/v1/snapshots/" + o.snapshot, "/v1/templates/" + o.template} {
		if st := e.call("GET", p, keyAlpha, nil, nil); st != 200 {
			t.Errorf("GET %s with alpha's key after beta's calls: %d", p, st)
		}
	}
}

// TestCreateUsesOnlyOwnTeam guards against a create reaching another
// team's objects: beta naming alpha's snapshot, task or private template
// is refused exactly as a name that does not exist, and nothing starts.
func TestCreateUsesOnlyOwnTeam(t *testing.T) {
	e := newTeamEnv(t)
	o := makeAlphaObjects(e)
	starts := e.d.Starts()
	for _, c := range []struct {
		name           string
		theirs, absent map[string]any
	}{
		{"snapshot", map[string]any{"snapshot": o.snapshot}, map[string]any{"snapshot": "snap-zzzzzzzzzzzzzzzzzzzz"}},
		{"task", map[string]any{"task": o.task}, map[string]any{"task": "tzzzzzzzzzzzzzzzzzzz"}},
		{"template", map[string]any{"template": o.template}, map[string]any{"template": "missing-tpl"}},
	} {
		var got, want struct{ Code, Message string }
		st := e.call("POST", "/v1/sandboxes", keyBeta, c.theirs, &got)
		wantSt := e.call("POST", "/v1/sandboxes", keyBeta, c.absent, &want)
		norm := func(s string) string {
			for _, v := range []string{o.snapshot, o.task, o.template, "snap-zzzzzzzzzzzzzzzzzzzz", "tzzzzzzzzzzzzzzzzzzz", "missing-tpl"} {
				s = strings.ReplaceAll(s, v, "X")
			}
			return s
		}
		if st != 400 || st != wantSt || got.Code != want.Code || norm(got.Message) != norm(want.Message) {
			t.Errorf("%s: beta with alpha's: %d %+v; with a missing one: %d %+v", c.name, st, got, wantSt, want)
		}
	}
	if n := e.d.Starts(); n != starts {
		t.Errorf("%d sandboxes started from refused creates", n-starts)
	}
}

// TestListsShowOwnTeam guards against lists leaking other teams'
// objects: beta's lists (native and E2B) hold none of alpha's; an admin
// sees its own team's by default and every team's only with ?team=all;
// a member asking for another team is refused with 403 forbidden.
func TestListsShowOwnTeam(t *testing.T) {
	e := newTeamEnv(t)
	o := makeAlphaObjects(e)
	lists := []string{"/v1/sandboxes", "/sandboxes", "/v2/sandboxes", "/v1/tasks", "/v1/snapshots", "/snapshots", "/v1/templates", "/v1/audit"}
	for _, p := range lists {
		_, body := e.raw("GET", p, keyBeta)
		_, admin := e.raw("GET", p, apiKey)
		for _, id := range []string{o.sandbox, o.task, o.snapshot, "alpha-tpl:1"} {
			if strings.Contains(body, id) {
				t.Errorf("GET %s with beta's key lists alpha's %s", p, id)
			}
			if strings.Contains(admin, id) {
				t.Errorf("GET %s with the admin key (no ?team=) lists alpha's %s", p, id)
			}
		}
	}
	for _, p := range []string{"/v1/sandboxes", "/v1/tasks", "/v1/snapshots", "/v1/templates"} {
		for _, q := range []string{"?team=all", "?team=alpha"} {
			if _, body := e.raw("GET", p+q, apiKey); !strings.Contains(body, "alpha") {
				t.Errorf("GET %s%s with the admin key does not list alpha's objects: %s", p, q, body)
			}
		}
		st, body := e.raw("GET", p+"?team=alpha", keyBeta)
		if st != http.StatusForbidden || !strings.Contains(body, `"code":"forbidden"`) {
			t.Errorf("GET %s?team=alpha with beta's key: %d %s; want 403 forbidden", p, st, body)
		}
	}
	// Alpha sees its own, and its audit events carry its key id.
	var evs struct {
		Events []store.Event `json:"events"`
	}
	if st := e.call("GET", "/v1/audit?sandbox="+o.sandbox+"&kind=sandbox.created", keyAlpha, nil, &evs); st != 200 || len(evs.Events) != 1 {
		t.Fatalf("alpha's sandbox.created events: %d %d", st, len(evs.Events))
	}
	if ev := evs.Events[0]; ev.Team != "alpha" || ev.KeyID != store.KeyID(store.HashKey(keyAlpha)) {
		t.Errorf("sandbox.created recorded team %q key %q; want alpha and alpha's key id", ev.Team, ev.KeyID)
	}
}

// TestEventsRecordTheCallersKey guards against an audit log that cannot
// say who did it: the events a request causes (create, command, kill)
// carry the id of the caller's key and its team.
func TestEventsRecordTheCallersKey(t *testing.T) {
	e := newTeamEnv(t)
	var sb struct {
		ID string `json:"id"`
	}
	if st := e.call("POST", "/v1/sandboxes", keyAlpha, map[string]any{}, &sb); st != 201 {
		t.Fatalf("create: %d", st)
	}
	if st := e.call("POST", "/v1/sandboxes/"+sb.ID+"/exec", keyAlpha, map[string]any{"command": "true"}, nil); st != 200 {
		t.Fatalf("exec: %d", st)
	}
	if st := e.call("DELETE", "/v1/sandboxes/"+sb.ID, keyAlpha, nil, nil); st != 200 {
		t.Fatalf("kill: %d", st)
	}
	var evs struct {
		Events []store.Event `json:"events"`
	}
	if st := e.call("GET", "/v1/audit?sandbox="+sb.ID, keyAlpha, nil, &evs); st != 200 {
		t.Fatalf("audit: %d", st)
	}
	want := store.HashKey(keyAlpha)[:16]
	seen := map[string]bool{}
	for _, ev := range evs.Events {
		seen[ev.Kind] = true
		if ev.Team != "alpha" || ev.KeyID != want {
			t.Errorf("%s event: team %q key %q; want alpha and %s", ev.Kind, ev.Team, ev.KeyID, want)
		}
	}
	for _, k := range []string{"sandbox.created", "command", "sandbox.ended"} {
		if !seen[k] {
			t.Errorf("no %s event among %v", k, seen)
		}
	}
}
