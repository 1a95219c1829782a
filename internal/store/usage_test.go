package store

import (
	"context"
	"testing"
	"time"
)

// TestUsageReportLivesAndPrune checks the store's half of usage reports:
// sandbox-seconds are each sandbox's life clipped to [since, min(until,
// now)) (an ended one to its end, a running one to now), a sandbox
// outside the window is not counted, rows of a sandbox without a record
// are in no report, amounts added to one sandbox and minute accumulate,
// and PruneUsage deletes only the minutes before its bound.
func TestUsageReportLivesAndPrune(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		t0 := time.Date(2026, 5, 6, 7, 0, 0, 0, time.UTC)
		for _, sb := range []struct {
			id         string
			start, end time.Duration // from t0; end 0: running
		}{{"early", 0, 90 * time.Second}, {"late", 2 * time.Minute, 0}, {"gone", -time.Hour, -50 * time.Minute}} {
			rec := &Sandbox{ID: sb.id, Team: "t", Template: "base", Runtime: "runc", Tier: "light", Network: "none",
				State: StateRunning, CreatedAt: t0.Add(sb.start), ExpiresAt: t0.Add(time.Hour)}
			if err := s.InsertSandbox(ctx, rec); err != nil {
				t.Fatal(err)
			}
			if sb.end != 0 {
				if err := s.EndSandbox(ctx, sb.id, "killed", "", t0.Add(sb.end)); err != nil {
					t.Fatal(err)
				}
			}
		}
		recs := []UsageRecord{
			{SandboxID: "early", Bucket: t0, UsageAmounts: UsageAmounts{CPUSeconds: 1, Commands: 1}},
			{SandboxID: "early", Bucket: t0, UsageAmounts: UsageAmounts{CPUSeconds: 0.5, EgressBytesDown: 7}},
			{SandboxID: "late", Bucket: t0.Add(2 * time.Minute), UsageAmounts: UsageAmounts{Commands: 2}},
			{SandboxID: "norecord", Bucket: t0, UsageAmounts: UsageAmounts{Commands: 100}},
		}
		if err := s.WriteUsage(ctx, recs, nil, nil); err != nil {
			t.Fatal(err)
		}
		now := t0.Add(3 * time.Minute)
		rows, err := s.UsageReport(ctx, UsageQuery{Team: "t", Since: t0, By: UsageBySandbox, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]*UsageRow{}
		for _, r := range rows {
			got[r.Sandbox] = r
		}
		if len(rows) != 2 || got["early"] == nil || got["late"] == nil {
			t.Fatalf("rows %+v, want early and late only (gone ended before the window, norecord has no record)", rows)
		}
		if e := got["early"]; e.CPUSeconds != 1.5 || e.Commands != 1 || e.EgressBytesDown != 7 || e.SandboxSeconds != 90 {
			t.Errorf("early %+v: want the two records added and its 90 s life", e)
		}
		if l := got["late"]; l.Commands != 2 || l.SandboxSeconds != 60 {
			t.Errorf("late %+v: want 2 commands and 60 s (2 min to now)", l)
		}
		// Window [t0+1m, t0+2m): early's last 30 s, none of late.
		rows, err = s.UsageReport(ctx, UsageQuery{Team: "t", Since: t0.Add(time.Minute), Until: t0.Add(2 * time.Minute), By: UsageByTeam, Now: now})
		if err != nil || len(rows) != 1 || rows[0].SandboxSeconds != 30 || rows[0].Sandboxes != 1 || rows[0].Commands != 0 {
			t.Fatalf("second-minute window: %+v, %v; want 30 sandbox-seconds of one sandbox and no rows' amounts", rows, err)
		}
		if rows, err = s.UsageReport(ctx, UsageQuery{Team: "other", By: UsageByTeam, Now: now}); err != nil || len(rows) != 0 {
			t.Fatalf("another team's report: %+v, %v", rows, err)
		}
		n, err := s.PruneUsage(ctx, t0.Add(time.Minute))
		if err != nil || n != 2 {
			t.Fatalf("pruned %d, %v; want the two rows of minute t0", n, err)
		}
		rows, err = s.UsageReport(ctx, UsageQuery{Team: "t", By: UsageBySandbox, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.Sandbox == "early" && (r.CPUSeconds != 0 || r.Commands != 0) {
				t.Errorf("early's pruned amounts are still reported: %+v", r)
			}
			if r.Sandbox == "late" && r.Commands != 2 {
				t.Errorf("late's row was pruned: %+v", r)
			}
		}
	})
}
