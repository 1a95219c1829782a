package api_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/store"
	corral "github.com/corralhq/corral/sdk/go"
)

type teamQuotaView struct {
	Team     string         `json:"team"`
	Quota    map[string]any `json:"quota"`
	Override map[string]any `json:"override"`
	Usage    struct {
		Running  int     `json:"running"`
		CPUs     float64 `json:"cpus"`
		MemoryMB int64   `json:"memory_mb"`
	} `json:"usage"`
}

type errView struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// TestTeamQuotaAPI defends against a member key raising its own team's
// quota (every /v1/teams route is admin only: 403 forbidden), against a
// bad quota value being stored (400 invalid_argument naming the field,
// nothing stored), and checks that an admin's override applies to the
// team's next create without a restart: over it, the create is refused
// with capacity_exceeded naming the team and the quota, while another
// team still creates.
func TestTeamQuotaAPI(t *testing.T) {
	e := newEnv(t, 10)
	ctx := context.Background()
	const member = "e2b_member_key_of_team_x_0123"
	if err := e.st.AddAPIKey(ctx, "member", member, "x", "member"); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ method, path string }{
		{"GET", "/v1/teams"}, {"GET", "/v1/teams/x/quota"}, {"PUT", "/v1/teams/x/quota"},
	} {
		var ev errView
		if st := e.call(r.method, r.path, member, map[string]any{"max_sandboxes": 100}, &ev); st != 403 || ev.Code != corral.CodeForbidden {
			t.Errorf("member %s %s: %d %+v, want 403 forbidden", r.method, r.path, st, ev)
		}
	}

	for _, tc := range []struct {
		path  string
		body  string
		field string
	}{
		{"/v1/teams/x/quota", `{"max_sandboxes": -1}`, "max_sandboxes"},
		{"/v1/teams/x/quota", `{"max_sandboxes": 1.5}`, "max_sandboxes"},
		{"/v1/teams/x/quota", `{"max_per_agent": 2, "max_cpus": "2"}`, "max_cpus"},
		{"/v1/teams/x/quota", `{"max_memory_mb": 1e300}`, "max_memory_mb"},
		{"/v1/teams/x/quota", `{"create_rate": 1e9}`, "create_rate"},
		{"/v1/teams/x/quota", `{"create_burst": -2}`, "create_burst"},
		{"/v1/teams/x/quota", `{"max_sandboxez": 2}`, "max_sandboxez"},
		{"/v1/teams/x%20y/quota", `{"max_sandboxes": 2}`, "team"},
		{"/v1/teams/all/quota", `{"max_sandboxes": 2}`, "team"},
	} {
		var ev errView
		st := e.call("PUT", tc.path, apiKey, tc.body, &ev)
		if st != 400 || ev.Code != corral.CodeInvalidArgument || !strings.Contains(ev.Message, tc.field) {
			t.Errorf("PUT %s %s: %d %+v, want 400 invalid_argument naming %s", tc.path, tc.body, st, ev, tc.field)
		}
	}
	if _, err := e.st.GetTeamQuota(ctx, "x"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused override was stored: %v", err)
	}

	var v teamQuotaView
	if st := e.call("PUT", "/v1/teams/x/quota", apiKey, map[string]any{"max_sandboxes": 1, "max_cpus": 4}, &v); st != 200 ||
		v.Quota["max_sandboxes"] != 1.0 || v.Override["max_sandboxes"] != 1.0 || v.Override["max_cpus"] != 4.0 || len(v.Override) != 2 {
		t.Fatalf("PUT quota: %d %+v", st, v)
	}
	var sb sandboxView
	if st := e.call("POST", "/v1/sandboxes", member, map[string]any{}, &sb); st != 201 {
		t.Fatalf("member's first create: %d", st)
	}
	var ev errView
	if st := e.call("POST", "/v1/sandboxes", member, map[string]any{}, &ev); st != 429 || ev.Code != corral.CodeCapacityExceeded ||
		!strings.Contains(ev.Message, `team "x" runs 1 sandboxes (quota team_sandboxes 1)`) {
		t.Fatalf("member's create over the quota: %d %+v, want 429 capacity_exceeded naming the quota", st, ev)
	}
	if st := e.call("POST", "/v1/sandboxes", apiKey, map[string]any{}, &sb); st != 201 {
		t.Fatalf("another team's create: %d", st)
	}
	if st := e.call("GET", "/v1/teams/x/quota", apiKey, nil, &v); st != 200 || v.Usage.Running != 1 || v.Usage.CPUs == 0 || v.Usage.MemoryMB == 0 {
		t.Fatalf("GET quota: %d %+v", st, v)
	}
	var list struct {
		Teams []teamQuotaView `json:"teams"`
	}
	if st := e.call("GET", "/v1/teams", apiKey, nil, &list); st != 200 || len(list.Teams) != 2 ||
		list.Teams[0].Team != "default" || list.Teams[1].Team != "x" || list.Teams[1].Quota["max_sandboxes"] != 1.0 {
		t.Fatalf("GET /v1/teams: %d %+v", st, list)
	}
	// {} drops the override: the defaults (no team limit) apply at once.
	var dropped teamQuotaView
	if st := e.call("PUT", "/v1/teams/x/quota", apiKey, map[string]any{}, &dropped); st != 200 || len(dropped.Override) != 0 || dropped.Quota["max_sandboxes"] != 0.0 {
		t.Fatalf("PUT {}: %d %+v", st, dropped)
	}
	if st := e.call("POST", "/v1/sandboxes", member, map[string]any{}, &sb); st != 201 {
		t.Fatalf("member's create after the override was dropped: %d", st)
	}
}
