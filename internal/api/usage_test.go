package api_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/store"
)

type usageAmounts struct {
	CPUSeconds     float64 `json:"cpu_seconds"`
	SandboxSeconds float64 `json:"sandbox_seconds"`
	EgressBytes    int64   `json:"egress_bytes"`
	Commands       int64   `json:"commands"`
	Sandboxes      int64   `json:"sandboxes"`
}

type usageReport struct {
	Team   string       `json:"team"`
	Since  *time.Time   `json:"since"`
	By     string       `json:"by"`
	Totals usageAmounts `json:"totals"`
	Rows   []struct {
		Team    string `json:"team"`
		Sandbox string `json:"sandbox"`
		usageAmounts
	} `json:"rows"`
}

// TestUsageScope checks who sees whose usage on GET /v1/usage: a member
// key its own team's only (asking for another team or for all is 403
// forbidden, whether or not that team exists), an admin key its own team
// by default and another team or every team only when it asks. It
// defends against one team reading another's usage (what it runs, how
// much, which sandbox ids), and checks the stable invalid_argument
// refusals of bad since, until and by values.
func TestUsageScope(t *testing.T) {
	e := newEnv(t, 4)
	ctx := context.Background()
	const redKey, blueKey = "e2b_member_red_0123456789", "e2b_member_blue_012345678"
	for key, team := range map[string]string{redKey: "red", blueKey: "blue"} {
		if err := e.st.AddAPIKey(ctx, team, key, team, "member"); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	for id, team := range map[string]string{"sbred": "red", "sbblue": "blue"} {
		if err := e.st.InsertSandbox(ctx, &store.Sandbox{ID: id, Team: team, Template: "base", Runtime: "runc", Tier: "light",
			Network: "none", State: store.StateRunning, CreatedAt: now.Add(-time.Minute), ExpiresAt: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.st.WriteUsage(ctx, []store.UsageRecord{
		{SandboxID: "sbred", Bucket: now.Truncate(time.Minute), UsageAmounts: store.UsageAmounts{CPUSeconds: 1.5, Commands: 2}},
		{SandboxID: "sbblue", Bucket: now.Truncate(time.Minute), UsageAmounts: store.UsageAmounts{CPUSeconds: 4, EgressBytesUp: 9, EgressBytesDown: 1}},
	}, nil, nil); err != nil {
		t.Fatal(err)
	}

	var red usageReport
	if st := e.call("GET", "/v1/usage?by=sandbox", redKey, nil, &red); st != http.StatusOK {
		t.Fatalf("member usage: %d", st)
	}
	if red.Team != "red" || len(red.Rows) != 1 || red.Rows[0].Sandbox != "sbred" || red.Totals.CPUSeconds != 1.5 || red.Totals.Commands != 2 ||
		red.Totals.Sandboxes != 1 || red.Totals.SandboxSeconds < 59 {
		t.Fatalf("red member's report %+v: want its own sandbox only", red)
	}
	for _, q := range []string{"?team=blue", "?team=all", "?team=nosuchteam"} {
		var ae apiErr
		if st := e.call("GET", "/v1/usage"+q, redKey, nil, &ae); st != http.StatusForbidden || ae.Code != "forbidden" {
			t.Errorf("member asking %s: %d %+v, want 403 forbidden", q, st, ae)
		}
	}
	var own, blue, all usageReport
	if st := e.call("GET", "/v1/usage", apiKey, nil, &own); st != http.StatusOK || own.Team != store.DefaultTeam || own.Totals.CPUSeconds != 0 {
		t.Errorf("admin's own team: %d %+v, want the default team's (empty) usage", st, own)
	}
	if st := e.call("GET", "/v1/usage?team=blue", apiKey, nil, &blue); st != http.StatusOK || blue.Team != "blue" || blue.Totals.CPUSeconds != 4 || blue.Totals.EgressBytes != 10 {
		t.Errorf("admin ?team=blue: %d %+v", st, blue)
	}
	if st := e.call("GET", "/v1/usage?team=all&by=team&since=1h", apiKey, nil, &all); st != http.StatusOK || all.Team != "all" || len(all.Rows) != 2 ||
		all.Totals.CPUSeconds != 5.5 || all.Since == nil {
		t.Errorf("admin ?team=all&by=team&since=1h: %d %+v", st, all)
	}
	for _, q := range []string{"?since=yesterday", "?until=12:00", "?since=-1h", "?by=day", "?since=10m&until=20m", "?since=2026-01-01T00:00:00Z&until=2026-01-01T00:00:00Z"} {
		var ae apiErr
		if st := e.call("GET", "/v1/usage"+q, apiKey, nil, &ae); st != http.StatusBadRequest || ae.Code != "invalid_argument" {
			t.Errorf("GET /v1/usage%s: %d %+v, want 400 invalid_argument", q, st, ae)
		}
	}
}
