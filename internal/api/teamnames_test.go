package api_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/api"
	"github.com/corralhq/corral/internal/audit"
	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/runtime/runtimetest"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template/registry/registrytest"
	"github.com/corralhq/corral/internal/volume"
)

// Keys of the two-team harness: two member keys of teams A and B, and the
// admin key of team default (apiKey).
const (
	keyA = "e2b_team_a_key_0123456789"
	keyB = "e2b_team_b_key_0123456789"
)

// teamsEnv is newEnv with two teams' member keys, an audit log, a
// redactor and a volume service without file systems: volume records are
// made in the store (making a file system needs root; the real thing runs
// in test/integration), and a call that would need one answers
// volumes_unavailable after the team's lookups.
type teamsEnv struct {
	*env
	audit *audit.Log
	red   *egress.Redactor
}

func newTeamsEnv(t *testing.T) *teamsEnv {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []struct{ name, key, team, role string }{
		{"admin", apiKey, "", "admin"}, {"a", keyA, "team-a", "member"}, {"b", keyB, "team-b", "member"},
	} {
		if err := st.AddAPIKey(ctx, k.name, k.key, k.team, k.role); err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	red := &egress.Redactor{}
	al := audit.New(st, red, log)
	d := runtimetest.New()
	reg, _ := registrytest.New(t, st)
	vols := volume.NewService(nil, st, al, log)
	m := sandbox.New(sandbox.Config{
		WatchInterval: 20 * time.Millisecond, KillGrace: time.Millisecond, Audit: al, Volumes: vols,
		SnapshotDir: filepath.Join(t.TempDir(), "snapshots"), MemoryPressure: func() bool { return false },
		Admission: govern.NewAdmission(govern.AdmissionConfig{MaxConcurrent: 10, MaxPerAgent: 10, AgentRate: 1000, AgentBurst: 1000}),
	}, st, d, reg, log)
	if err := m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.Config{Templates: reg, Audit: al, Redactor: red, Volumes: vols}, m, st, log))
	t.Cleanup(func() {
		srv.Close()
		m.Shutdown(context.Background(), true)
		al.Close()
		st.Close()
	})
	return &teamsEnv{env: &env{t: t, st: st, d: d, m: m, srv: srv}, audit: al, red: red}
}

// raw sends a request and returns its status and body.
func (e *teamsEnv) raw(method, path, key string, body any) (int, string) {
	e.t.Helper()
	var out any
	st := e.call(method, path, key, body, &out)
	b, _ := json.Marshal(out)
	return st, string(b)
}

// addVolume records a volume of team (no file system: see teamsEnv).
func (e *teamsEnv) addVolume(id, team, name string) {
	e.t.Helper()
	if err := e.st.InsertVolume(context.Background(), &store.Volume{ID: id, Team: team, Name: name, SizeMB: 16, Token: "tok-" + id, CreatedAt: time.Now()}); err != nil {
		e.t.Fatal(err)
	}
}

// TestTeamObjectsAbsentForOtherTeams: volumes, secrets and pools belong
// to the team of the key that made them. For every route that looks one
// up, team B naming team A's object gets exactly the answer of an object
// that does not exist (same status, same body, native and E2B shapes):
// never 403, never "exists", so B can neither use nor delete A's object,
// nor learn that its name or id exists (existence probing). Each row
// names A's object and a missing one; the two answers must be equal, and
// A's object must be intact afterwards.
func TestTeamObjectsAbsentForOtherTeams(t *testing.T) {
	e := newTeamsEnv(t)
	e.addVolume("volaaaaaaaaaaaaaaaaa", "team-a", "data-a")
	if st, body := e.raw("PUT", "/v1/secrets/github_a", keyA, map[string]any{"hosts": []string{"api.github.com"}, "header": "Authorization", "value": "Bearer team-a-value-0123"}); st != http.StatusOK {
		t.Fatalf("team A puts its secret: %d %s", st, body)
	}
	if st, body := e.raw("PUT", "/v1/pools/base", keyA, map[string]any{"min": 0, "max": 1}); st != http.StatusOK {
		t.Fatalf("team A sets its pool: %d %s", st, body)
	}
	swap := func(s, a, b string) string { return strings.ReplaceAll(s, a, b) }
	for _, tc := range []struct {
		name, method, path, missing string // missing: path with a missing object instead of A's
		body                        any
	}{
		{"get volume by name", "GET", "/v1/volumes/data-a", "/v1/volumes/nope", nil},
		{"get volume by id", "GET", "/v1/volumes/volaaaaaaaaaaaaaaaaa", "/v1/volumes/volzzzzzzzzzzzzzzzzz", nil},
		{"delete volume by name", "DELETE", "/v1/volumes/data-a", "/v1/volumes/nope", nil},
		{"delete volume by id", "DELETE", "/v1/volumes/volaaaaaaaaaaaaaaaaa", "/v1/volumes/volzzzzzzzzzzzzzzzzz", nil},
		{"e2b get volume", "GET", "/volumes/volaaaaaaaaaaaaaaaaa", "/volumes/volzzzzzzzzzzzzzzzzz", nil},
		{"e2b get volume by name", "GET", "/volumes/data-a", "/volumes/nope", nil},
		{"e2b delete volume", "DELETE", "/volumes/volaaaaaaaaaaaaaaaaa", "/volumes/volzzzzzzzzzzzzzzzzz", nil},
		{"delete secret", "DELETE", "/v1/secrets/github_a", "/v1/secrets/nope", nil},
		{"delete pool", "DELETE", "/v1/pools/base", "/v1/pools/base", nil}, // B has no pool of base: as if A had none
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, gotBody := e.raw(tc.method, tc.path, keyB, tc.body)
			want, wantBody := e.raw(tc.method, tc.missing, keyB, tc.body)
			gotBody = swap(swap(gotBody, "data-a", "nope"), "volaaaaaaaaaaaaaaaaa", "volzzzzzzzzzzzzzzzzz")
			if got != want || gotBody != wantBody || got == http.StatusForbidden {
				t.Fatalf("team B on team A's object: %d %s; on a missing one: %d %s; want the same answer", got, gotBody, want, wantBody)
			}
			if tc.path != tc.missing && got != http.StatusNotFound {
				t.Fatalf("team B on team A's object: %d %s, want 404", got, gotBody)
			}
		})
	}
	// A's objects are intact.
	if v, err := e.st.GetVolume(context.Background(), "team-a", "data-a"); err != nil || v.ID != "volaaaaaaaaaaaaaaaaa" {
		t.Fatalf("team A's volume after team B's calls: %+v, %v", v, err)
	}
	if sec, err := e.st.GetSecret(context.Background(), "team-a", "github_a"); err != nil || sec.Value != "Bearer team-a-value-0123" {
		t.Fatalf("team A's secret after team B's calls: %+v, %v", sec, err)
	}
	var pools struct {
		Pools []struct{ Team, Template string } `json:"pools"`
	}
	if e.call("GET", "/v1/pools", keyA, nil, &pools); len(pools.Pools) != 1 || pools.Pools[0].Team != "team-a" {
		t.Fatalf("team A's pools after team B's delete: %+v", pools)
	}
}

// TestTeamNamesAreIndependent: names are per team. Team B may create a
// volume, a secret and a pool named like team A's (never "name taken",
// which would tell B that A has one, and would let A squat names to
// deny them to B); B's replace of its secret leaves A's value alone, and
// the redactor still redacts A's value after B registered its own secret
// of that name. Lists show each team only its own; a member asking for
// another team is refused (403); an admin's ?team=all shows both, each
// with its team.
func TestTeamNamesAreIndependent(t *testing.T) {
	e := newTeamsEnv(t)
	e.addVolume("volaaaaaaaaaaaaaaaaa", "team-a", "data")
	secret := func(v string) map[string]any {
		return map[string]any{"hosts": []string{"api.github.com"}, "header": "Authorization", "value": v}
	}
	for _, k := range []string{keyA, keyB} {
		if st, body := e.raw("PUT", "/v1/secrets/github", k, secret("Bearer value-of-"+k)); st != http.StatusOK {
			t.Fatalf("put secret github: %d %s", st, body)
		}
		if st, body := e.raw("PUT", "/v1/pools/base", k, map[string]any{"min": 0, "max": 1}); st != http.StatusOK {
			t.Fatalf("set pool base: %d %s", st, body)
		}
	}
	// B's volume named like A's: the create fails only for want of a
	// file system here (503), never for the name, which A's own second
	// volume of that name is refused for.
	for _, p := range []string{"/v1/volumes", "/volumes"} {
		if st, body := e.raw("POST", p, keyB, map[string]any{"name": "data"}); st != http.StatusServiceUnavailable {
			t.Fatalf("team B creates a volume named like team A's (%s): %d %s, want 503 (no file system here), not a name conflict", p, st, body)
		}
		if st, body := e.raw("POST", p, keyA, map[string]any{"name": "data"}); st != http.StatusConflict {
			t.Fatalf("team A creates a second volume named data (%s): %d %s, want 409", p, st, body)
		}
	}
	e.addVolume("volbbbbbbbbbbbbbbbbb", "team-b", "data")
	if st, body := e.raw("PUT", "/v1/secrets/github", keyB, secret("Bearer rotated-by-b-01")); st != http.StatusOK {
		t.Fatalf("team B replaces its secret: %d %s", st, body)
	}
	if sec, _ := e.st.GetSecret(context.Background(), "team-a", "github"); sec == nil || sec.Value != "Bearer value-of-"+keyA {
		t.Fatalf("team A's secret after team B replaced its own: %+v", sec)
	}
	if got := e.red.Redact("Bearer value-of-" + keyA); strings.Contains(got, keyA) {
		t.Fatalf("team A's secret value is no longer redacted after team B's put: %q", got)
	}

	type lists struct {
		Volumes []struct{ ID, Team, Name string } `json:"volumes"`
		Secrets []struct{ Team, Name string }     `json:"secrets"`
		Pools   []struct{ Team, Template string } `json:"pools"`
	}
	list := func(key, q string) (l lists) {
		for _, p := range []string{"/v1/volumes", "/v1/secrets", "/v1/pools"} {
			if st := e.call("GET", p+q, key, nil, &l); st != http.StatusOK {
				t.Fatalf("GET %s%s: %d", p, q, st)
			}
		}
		return l
	}
	for _, tc := range []struct {
		key, team string
	}{{keyA, "team-a"}, {keyB, "team-b"}} {
		l := list(tc.key, "")
		if len(l.Volumes) != 1 || l.Volumes[0].Team != tc.team || len(l.Secrets) != 1 || l.Secrets[0].Team != tc.team || len(l.Pools) != 1 || l.Pools[0].Team != tc.team {
			t.Errorf("%s's lists: %+v, want its own volume, secret and pool only", tc.team, l)
		}
		var v struct{ ID, Team string }
		if st := e.call("GET", "/v1/volumes/data", tc.key, nil, &v); st != http.StatusOK || v.Team != tc.team {
			t.Errorf("%s gets volume data: %d %+v, want its own", tc.team, st, v)
		}
		var ev []struct {
			VolumeID string `json:"volumeID"`
		}
		if st := e.call("GET", "/volumes", tc.key, nil, &ev); st != http.StatusOK || len(ev) != 1 {
			t.Errorf("%s's E2B volume list: %d %+v, want its own volume only", tc.team, st, ev)
		}
	}
	if st, body := e.raw("GET", "/v1/secrets?team=team-a", keyB, nil); st != http.StatusForbidden {
		t.Errorf("member B lists team A's secrets: %d %s, want 403", st, body)
	}
	all := list(apiKey, "?team=all")
	teams := func(n int, f func(i int) string) map[string]bool {
		m := map[string]bool{}
		for i := range n {
			m[f(i)] = true
		}
		return m
	}
	if vt := teams(len(all.Volumes), func(i int) string { return all.Volumes[i].Team }); len(all.Volumes) != 2 || !vt["team-a"] || !vt["team-b"] {
		t.Errorf("admin ?team=all volumes: %+v", all.Volumes)
	}
	if st := teams(len(all.Secrets), func(i int) string { return all.Secrets[i].Team }); len(all.Secrets) != 2 || !st["team-a"] || !st["team-b"] {
		t.Errorf("admin ?team=all secrets: %+v", all.Secrets)
	}
	if pt := teams(len(all.Pools), func(i int) string { return all.Pools[i].Team }); len(all.Pools) != 2 || !pt["team-a"] || !pt["team-b"] {
		t.Errorf("admin ?team=all pools: %+v", all.Pools)
	}
	if own := list(apiKey, ""); len(own.Volumes)+len(own.Secrets)+len(own.Pools) != 0 {
		t.Errorf("admin's own team's lists: %+v, want empty (other teams' objects only with ?team=)", own)
	}
	// An admin names one of two teams' volumes called data by its id or
	// the team; the bare name in every team is refused, never guessed.
	var v struct{ ID, Team string }
	if st := e.call("GET", "/v1/volumes/data?team=team-b", apiKey, nil, &v); st != http.StatusOK || v.ID != "volbbbbbbbbbbbbbbbbb" {
		t.Errorf("admin gets team B's data: %d %+v", st, v)
	}
	if st, body := e.raw("GET", "/v1/volumes/data?team=all", apiKey, nil); st != http.StatusBadRequest {
		t.Errorf("admin gets data in every team: %d %s, want 400 (ambiguous)", st, body)
	}
	if st, body := e.raw("DELETE", "/v1/secrets/github?team=all", apiKey, nil); st != http.StatusBadRequest {
		t.Errorf("admin deletes github in every team: %d %s, want 400", st, body)
	}
	if st, body := e.raw("DELETE", "/v1/secrets/github?team=team-b", apiKey, nil); st != http.StatusNoContent {
		t.Errorf("admin deletes team B's github: %d %s", st, body)
	}
	if _, err := e.st.GetSecret(context.Background(), "team-a", "github"); err != nil {
		t.Errorf("team A's github after the admin deleted team B's: %v", err)
	}
}

// TestCreateUsesOnlyOwnTeamsSecretsAndVolumes: a sandbox create may name
// only its own team's secrets and volumes. Team B naming team A's secret
// would have the egress proxy inject A's credential into B's sandbox;
// naming A's volume would mount A's data. Both are refused exactly as a
// name that does not exist (same status and message), and nothing is
// started.
func TestCreateUsesOnlyOwnTeamsSecretsAndVolumes(t *testing.T) {
	e := newTeamsEnv(t)
	e.addVolume("volaaaaaaaaaaaaaaaaa", "team-a", "data-a")
	if st, body := e.raw("PUT", "/v1/secrets/github_a", keyA, map[string]any{"hosts": []string{"api.github.com"}, "header": "Authorization", "value": "Bearer team-a-value-0123"}); st != http.StatusOK {
		t.Fatalf("team A puts its secret: %d %s", st, body)
	}
	for _, tc := range []struct {
		name          string
		body, missing map[string]any
		ref, missRef  string
	}{
		{"secret",
			map[string]any{"network": "allow", "allow": []string{"api.github.com"}, "secrets": []string{"github_a"}},
			map[string]any{"network": "allow", "allow": []string{"api.github.com"}, "secrets": []string{"nope"}}, "github_a", "nope"},
		{"volume by name",
			map[string]any{"volumes": []map[string]string{{"volume": "data-a", "path": "/data"}}},
			map[string]any{"volumes": []map[string]string{{"volume": "nope", "path": "/data"}}}, "data-a", "nope"},
		{"volume by id",
			map[string]any{"volumes": []map[string]string{{"volume": "volaaaaaaaaaaaaaaaaa", "path": "/data"}}},
			map[string]any{"volumes": []map[string]string{{"volume": "volzzzzzzzzzzzzzzzzz", "path": "/data"}}}, "volaaaaaaaaaaaaaaaaa", "volzzzzzzzzzzzzzzzzz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, gotBody := e.raw("POST", "/v1/sandboxes", keyB, tc.body)
			want, wantBody := e.raw("POST", "/v1/sandboxes", keyB, tc.missing)
			if got != http.StatusBadRequest || got != want || strings.ReplaceAll(gotBody, tc.ref, tc.missRef) != wantBody {
				t.Fatalf("team B's create naming team A's %s: %d %s; naming a missing one: %d %s; want the same 400", tc.name, got, gotBody, want, wantBody)
			}
		})
	}
	if ids, _ := e.d.List(context.Background()); len(ids) != 0 {
		t.Fatalf("sandboxes %v started by refused creates", ids)
	}
}

// TestTeamObjectEventsRecordTheKey: the audit events that secret, volume
// and pool routes cause record the id of the key that caused them and
// its team (never the key), so that `corral audit --team` finds them.
func TestTeamObjectEventsRecordTheKey(t *testing.T) {
	e := newTeamsEnv(t)
	if st, body := e.raw("PUT", "/v1/secrets/github", keyA, map[string]any{"hosts": []string{"api.github.com"}, "header": "Authorization", "value": "Bearer team-a-value-0123"}); st != http.StatusOK {
		t.Fatalf("put secret: %d %s", st, body)
	}
	if st, body := e.raw("DELETE", "/v1/secrets/github", keyA, nil); st != http.StatusNoContent {
		t.Fatalf("delete secret: %d %s", st, body)
	}
	if st, body := e.raw("PUT", "/v1/pools/base", keyA, map[string]any{"min": 0, "max": 1}); st != http.StatusOK {
		t.Fatalf("set pool: %d %s", st, body)
	}
	e.audit.Sync()
	keyID := store.HashKey(keyA)[:16]
	for _, kind := range []string{"secret.set", "secret.deleted", "pool.set"} {
		evs, err := e.st.ListEvents(context.Background(), store.EventFilter{Kind: kind})
		if err != nil || len(evs) != 1 {
			t.Fatalf("%s events: %+v, %v", kind, evs, err)
		}
		if evs[0].Team != "team-a" || evs[0].KeyID != keyID {
			t.Errorf("%s: team %q key %q, want team-a and %s", kind, evs[0].Team, evs[0].KeyID, keyID)
		}
		if strings.Contains(string(evs[0].Data), keyA) {
			t.Errorf("%s holds the key itself: %s", kind, evs[0].Data)
		}
	}
}

// TestPoolServesOnlyItsTeam: a warm pool is (team, template). Team A's
// create must not be handed an idle sandbox of team B's pool of the same
// template (it would be a sandbox B's pool started, counted to B): A's
// create misses, B's hits, and each sandbox's record carries its
// creator's team.
func TestPoolServesOnlyItsTeam(t *testing.T) {
	e := newTeamsEnv(t)
	if st, body := e.raw("PUT", "/v1/pools/base", keyB, map[string]any{"min": 1, "max": 1}); st != http.StatusOK {
		t.Fatalf("team B sets its pool: %d %s", st, body)
	}
	type poolList struct {
		Pools []struct {
			Team       string
			Idle, Hits int
		} `json:"pools"`
	}
	idleB := func() (idle, hits int) {
		var l poolList
		e.call("GET", "/v1/pools", keyB, nil, &l)
		if len(l.Pools) != 1 {
			t.Fatalf("team B's pools: %+v", l)
		}
		return l.Pools[0].Idle, l.Pools[0].Hits
	}
	deadline := time.Now().Add(15 * time.Second)
	for idle, _ := idleB(); idle != 1; idle, _ = idleB() {
		if time.Now().After(deadline) {
			t.Fatal("team B's pool did not fill")
		}
		e.m.RefillPools()
		time.Sleep(10 * time.Millisecond)
	}
	for _, tc := range []struct {
		key, team string
		hits      int
	}{{keyA, "team-a", 0}, {keyB, "team-b", 1}} {
		var sb struct{ ID, Team string }
		if st := e.call("POST", "/v1/sandboxes", tc.key, map[string]any{}, &sb); st != http.StatusCreated {
			t.Fatalf("%s creates: %d", tc.team, st)
		}
		if rec, err := e.st.GetSandbox(context.Background(), sb.ID); err != nil || rec.Team != tc.team || sb.Team != tc.team {
			t.Fatalf("%s's sandbox: record %+v, view team %q, %v", tc.team, rec, sb.Team, err)
		}
		if _, hits := idleB(); hits != tc.hits {
			t.Fatalf("after %s's create team B's pool has %d hits, want %d", tc.team, hits, tc.hits)
		}
	}
}
