package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/audit"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
)

// keysEnv is an API server over a real SQLite store and audit log whose
// only key is testKey (admin of team default).
type keysEnv struct {
	t     *testing.T
	st    *store.Store
	audit *audit.Log
	h     http.Handler
}

func newKeysEnv(t *testing.T) *keysEnv {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.AddAPIKey(context.Background(), "admin", testKey, "", store.RoleAdmin); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	al := audit.New(st, nil, log)
	t.Cleanup(func() { al.Close(); st.Close() })
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "corral_sandboxes 1\n") })
	s := New(Config{Audit: al, Metrics: metrics}, new(sandbox.Manager), st, log)
	return &keysEnv{t: t, st: st, audit: al, h: s}
}

// do sends a request with key and returns the status and the body.
func (e *keysEnv) do(method, path, key string, body string) (int, []byte) {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, rd)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.Bytes()
}

// create makes a key through the API and returns the answer.
func (e *keysEnv) create(team, role, name string) newKeyView {
	e.t.Helper()
	b, _ := json.Marshal(keyRequest{Team: team, Role: role, Name: name})
	code, body := e.do("POST", "/v1/keys", testKey, string(b))
	var v newKeyView
	if code != http.StatusCreated || json.Unmarshal(body, &v) != nil {
		e.t.Fatalf("create key %s/%s: %d %s", team, role, code, body)
	}
	return v
}

func errCode(body []byte) string {
	var e apiError
	_ = json.Unmarshal(body, &e)
	return e.Code
}

// TestCreateKeyRefusesBadInput defends against malformed keys being
// minted: a missing or reserved or malformed team, an unknown role, an
// over-long or control-character name are each refused with 400 and a
// stable code, and no key is stored (unknown fields and bad JSON:
// TestBadInputRefused).
func TestCreateKeyRefusesBadInput(t *testing.T) {
	e := newKeysEnv(t)
	cases := []struct {
		name, body, code, msg string
	}{
		{"no team", `{"role":"member"}`, CodeInvalidArgument, "team: required"},
		{"team all", `{"team":"all"}`, CodeInvalidArgument, "reserved"},
		{"upper-case team", `{"team":"Ops"}`, CodeInvalidArgument, "not a team name"},
		{"team with path", `{"team":"../x"}`, CodeInvalidArgument, "not a team name"},
		{"team too long", `{"team":"` + strings.Repeat("a", 64) + `"}`, CodeInvalidArgument, "not a team name"},
		{"unknown role", `{"team":"a","role":"owner"}`, CodeInvalidArgument, "role:"},
		{"name too long", `{"team":"a","name":"` + strings.Repeat("n", store.MaxKeyNameLen+1) + `"}`, CodeInvalidArgument, "name:"},
		{"name with newline", `{"team":"a","name":"a\nb"}`, CodeInvalidArgument, "name:"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body := e.do("POST", "/v1/keys", testKey, c.body)
			var ae apiError
			if code != http.StatusBadRequest || json.Unmarshal(body, &ae) != nil || ae.Code != c.code || !strings.Contains(ae.Message, c.msg) {
				t.Fatalf("POST /v1/keys %s: %d %s; want 400 %s containing %q", c.body, code, body, c.code, c.msg)
			}
		})
	}
	if list, err := e.st.ListAPIKeys(context.Background(), ""); err != nil || len(list) != 1 {
		t.Fatalf("after refused creates the store has %d keys (%v); want only the admin key", len(list), err)
	}
}

// TestKeyLifecycleAPI: an admin creates a member key (201, E2B's format,
// the value shown once); lists never carry a value or hash and follow
// the request's team scope; the key works, and after DELETE it fails its
// very next request with 401 (nothing caches keys); revoking again is
// 200 with the same record, an unknown id 404; creations and
// revocations are audited with the key id and the actor, never the
// value; the server's last admin key cannot be revoked (409).
func TestKeyLifecycleAPI(t *testing.T) {
	e := newKeysEnv(t)
	ctx := context.Background()
	m := e.create("team-b", "", "ci")
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(m.Key) || m.ID != store.KeyID(store.HashKey(m.Key)) ||
		m.Team != "team-b" || m.Role != store.RoleMember || m.Name != "ci" || m.CreatedAt == "" {
		t.Fatalf("new key %+v", m)
	}
	a2 := e.create("ops", store.RoleAdmin, "second admin")

	// Lists: never a value or a hash; scoped like every list.
	for _, c := range []struct {
		query string
		ids   []string
	}{
		{"", []string{store.KeyID(store.HashKey(testKey))}},
		{"?team=team-b", []string{m.ID}},
		{"?team=nobody", nil},
		{"?team=all", []string{store.KeyID(store.HashKey(testKey)), m.ID, a2.ID}},
	} {
		code, body := e.do("GET", "/v1/keys"+c.query, testKey, "")
		var out struct{ Keys []keyView }
		if code != 200 || json.Unmarshal(body, &out) != nil {
			t.Fatalf("GET /v1/keys%s: %d %s", c.query, code, body)
		}
		var ids []string
		for _, k := range out.Keys {
			ids = append(ids, k.ID)
		}
		if strings.Join(ids, ",") != strings.Join(c.ids, ",") {
			t.Errorf("GET /v1/keys%s lists %v; want %v", c.query, ids, c.ids)
		}
		for _, secret := range []string{m.Key[4:], a2.Key[4:], testKey[4:], store.HashKey(m.Key)[store.KeyIDLen:], store.HashKey(testKey)[store.KeyIDLen:]} {
			if bytes.Contains(body, []byte(secret)) {
				t.Fatalf("GET /v1/keys%s shows a key value or hash: %s", c.query, body)
			}
		}
	}

	// The member key authenticates (403 on an admin route, not 401),
	// then fails its next request once revoked.
	if code, body := e.do("GET", "/v1/keys", m.Key, ""); code != 403 || errCode(body) != CodeForbidden {
		t.Fatalf("member before revoke: %d %s", code, body)
	}
	if code, _ := e.do("GET", "/v1/keys", a2.Key, ""); code != 200 {
		t.Fatalf("second admin before revoke: %d", code)
	}
	for _, k := range []newKeyView{m, a2} {
		code, body := e.do("DELETE", "/v1/keys/"+k.ID, testKey, "")
		var v keyView
		if code != 200 || json.Unmarshal(body, &v) != nil || v.ID != k.ID || v.RevokedAt == nil {
			t.Fatalf("revoke %s: %d %s", k.ID, code, body)
		}
		if code, body := e.do("GET", "/v1/keys", k.Key, ""); code != 401 || errCode(body) != CodeUnauthenticated {
			t.Fatalf("the revoked key %s (%s) still authenticates: %d %s", k.ID, k.Role, code, body)
		}
	}
	// The E2B routes check the same store: E2B's 401 shape.
	if code, body := e.do("GET", "/v2/sandboxes", m.Key, ""); code != 401 || !bytes.Contains(body, []byte(`"code":401`)) {
		t.Fatalf("the revoked key on an E2B route: %d %s; want E2B's 401", code, body)
	}
	code, body := e.do("DELETE", "/v1/keys/"+m.ID, testKey, "")
	var again keyView
	if code != 200 || json.Unmarshal(body, &again) != nil || again.RevokedAt == nil {
		t.Fatalf("second revoke: %d %s", code, body)
	}
	for _, id := range []string{"0123456789abcdef", "nothex", m.ID[:8]} {
		if code, body := e.do("DELETE", "/v1/keys/"+id, testKey, ""); code != 404 || errCode(body) != CodeNotFound {
			t.Errorf("revoke unknown %q: %d %s; want 404 not_found", id, code, body)
		}
	}

	// The last admin key stays.
	adminID := store.KeyID(store.HashKey(testKey))
	if code, body := e.do("DELETE", "/v1/keys/"+adminID, testKey, ""); code != 409 || errCode(body) != CodeConflict {
		t.Fatalf("revoking the last admin key: %d %s; want 409 conflict", code, body)
	}
	if code, _ := e.do("GET", "/v1/keys", testKey, ""); code != 200 {
		t.Fatalf("the last admin key stopped working: %d", code)
	}

	// Audit: one event per change, with ids and the actor, no values.
	e.audit.Sync()
	evs, err := e.st.ListEvents(ctx, store.EventFilter{Kind: "key"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range evs {
		var d struct {
			KeyID string `json:"key_id"`
		}
		json.Unmarshal(ev.Data, &d)
		got = append(got, ev.Kind+":"+d.KeyID)
		if ev.KeyID != adminID || ev.Team != store.DefaultTeam {
			t.Errorf("event %s names actor %q of team %q; want the admin key %s of default", ev.Kind, ev.KeyID, ev.Team, adminID)
		}
		for _, secret := range []string{m.Key[4:], a2.Key[4:], testKey[4:]} {
			if bytes.Contains(ev.Data, []byte(secret)) {
				t.Errorf("event %s holds a key value: %s", ev.Kind, ev.Data)
			}
		}
	}
	want := []string{"key.created:" + m.ID, "key.created:" + a2.ID, "key.revoked:" + m.ID, "key.revoked:" + a2.ID}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("key events %v; want %v", got, want)
	}
}

// TestMemberKeyAdminRoutes defends against a member key acting for the
// whole server: the key routes, /metrics (every team's counters) and
// template import (it reads a host directory given as "layout", or makes
// the host fetch from any registry address) answer 403 forbidden to a
// member key and run nothing, while an admin key reaches them.
func TestMemberKeyAdminRoutes(t *testing.T) {
	e := newKeysEnv(t)
	m := e.create("team-b", store.RoleMember, "")
	cases := []struct{ method, path, body string }{
		{"POST", "/v1/keys", `{"team":"team-b","role":"admin"}`},
		{"GET", "/v1/keys", ""},
		{"GET", "/v1/keys?team=team-b", ""},
		{"DELETE", "/v1/keys/" + m.ID, ""},
		{"GET", "/metrics", ""},
		{"POST", "/v1/templates/import", `{"layout":"/etc"}`},
	}
	for _, c := range cases {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			code, body := e.do(c.method, c.path, m.Key, c.body)
			if code != http.StatusForbidden || errCode(body) != CodeForbidden {
				t.Fatalf("member key: %d %s; want 403 forbidden", code, body)
			}
		})
	}
	if list, _ := e.st.ListAPIKeys(context.Background(), ""); len(list) != 2 {
		t.Fatalf("the member's calls changed the keys: %d stored", len(list))
	}
	if k, err := e.st.LookupAPIKey(context.Background(), m.Key); err != nil || k.Role != store.RoleMember {
		t.Fatalf("the member's key after its calls: %+v %v", k, err)
	}
	if code, body := e.do("GET", "/metrics", testKey, ""); code != 200 || !bytes.Contains(body, []byte("corral_sandboxes")) {
		t.Fatalf("admin /metrics: %d %s", code, body)
	}
}

// TestKeyEventsStoredBeforeTheAnswer: the audit event of a key's creation
// and of its revocation is in the store when the API answers (read here
// without the log's Sync, as another replica on a shared store reads it).
// Defends against a security change whose event is still queued when it
// is answered: lost if the control plane crashes then, and missing from
// another replica's audit log (TestTwoControlPlanesOnePostgresStore saw
// none of the first replica's key events).
func TestKeyEventsStoredBeforeTheAnswer(t *testing.T) {
	e := newKeysEnv(t)
	ctx := context.Background()
	count := func(kind, id string) int {
		t.Helper()
		evs, err := e.st.ListEvents(ctx, store.EventFilter{Kind: kind})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, ev := range evs {
			if strings.Contains(string(ev.Data), id) {
				n++
			}
		}
		return n
	}
	for i := range 10 {
		v := e.create("team-x", store.RoleMember, "ci")
		if n := count("key.created", v.ID); n != 1 {
			t.Fatalf("round %d: %d key.created events for %s when the create was answered, want 1", i, n, v.ID)
		}
		if code, body := e.do("DELETE", "/v1/keys/"+v.ID, testKey, ""); code != http.StatusOK {
			t.Fatalf("revoke: %d %s", code, body)
		}
		if n := count("key.revoked", v.ID); n != 1 {
			t.Fatalf("round %d: %d key.revoked events for %s when the revoke was answered, want 1", i, n, v.ID)
		}
	}
}
