package store

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// TestTeamQuotas: an override is stored field by field (unset fields stay
// unset, a zero stays a zero), replaced whole by the next put, deleted by
// one that sets nothing, and survives reopening the database; ListTeams
// names the teams of keys and of overrides.
func TestTeamQuotas(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		path := bk.addr(t)
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		two, zero, cpus := int64(2), int64(0), 1.5
		if err := s.PutTeamQuota(ctx, &TeamQuota{Team: "a", MaxSandboxes: &two, MaxMemoryMB: &zero}); err != nil {
			t.Fatal(err)
		}
		if err := s.PutTeamQuota(ctx, &TeamQuota{Team: "b", MaxCPUs: &cpus}); err != nil {
			t.Fatal(err)
		}
		if err := s.PutTeamQuota(ctx, &TeamQuota{Team: "b", MaxPerAgent: &two}); err != nil {
			t.Fatal(err)
		}
		if err := s.AddAPIKey(ctx, "k", "key-of-team-c", "c", RoleMember); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if s, err = Open(path); err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		a, err := s.GetTeamQuota(ctx, "a")
		if err != nil || a.MaxSandboxes == nil || *a.MaxSandboxes != 2 || a.MaxMemoryMB == nil || *a.MaxMemoryMB != 0 ||
			a.MaxCPUs != nil || a.MaxPerAgent != nil || a.CreateRate != nil || a.CreateBurst != nil || a.UpdatedAt.IsZero() {
			t.Fatalf("a = %+v %v", a, err)
		}
		if b, err := s.GetTeamQuota(ctx, "b"); err != nil || b.MaxCPUs != nil || b.MaxPerAgent == nil || *b.MaxPerAgent != 2 {
			t.Fatalf("b after a second put = %+v %v, want only max_per_agent", b, err)
		}
		teams, err := s.ListTeams(ctx)
		if err != nil || !slices.Equal(teams, []string{"a", "b", "c"}) {
			t.Fatalf("ListTeams = %v %v", teams, err)
		}
		if err := s.PutTeamQuota(ctx, &TeamQuota{Team: "a"}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetTeamQuota(ctx, "a"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("an empty override was kept: %v", err)
		}
		if qs, err := s.ListTeamQuotas(ctx); err != nil || len(qs) != 1 || qs[0].Team != "b" {
			t.Fatalf("ListTeamQuotas = %v %v", qs, err)
		}
	})
}
