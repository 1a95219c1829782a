package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/server"
	corral "github.com/corralhq/corral/sdk/go"
)

// hasCode reports whether err is an *corral.APIError with code.
func hasCode(err error, code string) bool {
	var ae *corral.APIError
	return errors.As(err, &ae) && ae.Code == code
}

// memberClient makes a member key of team through the admin's SDK
// client (POST /v1/keys) and returns a client with it.
func memberClient(t *testing.T, s *govServer, team string) *corral.Client {
	t.Helper()
	k, err := s.c.CreateKey(context.Background(), corral.KeyRequest{Team: team, Name: "quota-test"})
	if err != nil {
		t.Fatalf("create a key of team %s: %v", team, err)
	}
	return corral.New(s.url, k.Key)
}

// createIn creates a sandbox with c and kills it at the end of t.
func createIn(t *testing.T, ctx context.Context, c *corral.Client) (*corral.Sandbox, error) {
	sb, err := c.Create(ctx, corral.CreateOptions{Timeout: 10 * time.Minute})
	if err == nil {
		t.Cleanup(func() { _, _ = c.Kill(context.Background(), sb.ID) })
	}
	return sb, err
}

// TestTeamQuotaRefusal defends against one team taking more than its
// quota, with real sandboxes: an admin gives team qa a quota of 2 running
// sandboxes (PUT /v1/teams/qa/quota through the Go SDK, no restart);
// qa's third create is refused with 429 capacity_exceeded, a Retry-After
// and a message naming team_sandboxes and the team, and starts nothing,
// while team qb still creates. A member key cannot raise its own quota.
func TestTeamQuotaRefusal(t *testing.T) {
	need(t)
	ctx := context.Background()
	s := startGovServer(t, "team-quota", func(c *server.Config) {
		c.Admission = govern.AdmissionConfig{MaxConcurrent: 5}
	})
	qa, qb := memberClient(t, s, "qa"), memberClient(t, s, "qb")
	two := int64(2)
	if _, err := qa.SetTeamQuota(ctx, "qa", corral.QuotaOverride{MaxSandboxes: &two}); !hasCode(err, corral.CodeForbidden) {
		t.Fatalf("a member setting its own team's quota: %v; want forbidden", err)
	}
	if _, err := s.c.SetTeamQuota(ctx, "qa", corral.QuotaOverride{MaxSandboxes: &two}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := createIn(t, ctx, qa); err != nil {
			t.Fatalf("qa's create %d: %v", i+1, err)
		}
	}
	_, err := createIn(t, ctx, qa)
	var ae *corral.APIError
	if !corral.IsCapacityExceeded(err) || !errors.As(err, &ae) || ae.Status != 429 || ae.RetryAfter < time.Second ||
		!strings.Contains(ae.Message, "team_sandboxes") || !strings.Contains(ae.Message, `team "qa" runs 2 sandboxes`) {
		t.Fatalf("qa's third create: %#v; want 429 capacity_exceeded naming team_sandboxes", err)
	}
	if _, err := createIn(t, ctx, qb); err != nil {
		t.Fatalf("qb's create beside qa's full quota: %v", err)
	}
	if list, err := qa.List(ctx, corral.ListOptions{}); err != nil || len(list) != 2 {
		t.Fatalf("qa runs %d sandboxes (%v); want its 2", len(list), err)
	}
	tm, err := s.c.TeamQuota(ctx, "qa")
	if err != nil || tm.Usage.Running != 2 || tm.Quota.MaxSandboxes != 2 {
		t.Fatalf("qa's quota and usage: %+v %v", tm, err)
	}
}

// TestTeamFairness defends against a noisy neighbour, with real
// sandboxes: every global slot (2) is held by team fa, and fa floods the
// queue with 4 more creates; team fb's create, arriving after all of
// them, gets the next freed slot, while fa's 4 creates still wait.
func TestTeamFairness(t *testing.T) {
	need(t)
	ctx := context.Background()
	s := startGovServer(t, "team-fairness", func(c *server.Config) {
		c.Admission = govern.AdmissionConfig{MaxConcurrent: 2, QueueTimeout: 5 * time.Minute}
	})
	fa, fb := memberClient(t, s, "fa"), memberClient(t, s, "fb")
	first, err := createIn(t, ctx, fa)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := createIn(t, ctx, fa); err != nil {
		t.Fatal(err)
	}
	waiting := func(team string, n int) {
		t.Helper()
		waitFor(t, fmt.Sprintf("%s to have %d creates waiting", team, n), 2*time.Minute, func() bool {
			tm, err := s.c.TeamQuota(ctx, team)
			return err == nil && tm.Usage.Waiting == n
		})
	}
	floodCtx, stopFlood := context.WithCancel(ctx)
	var flood sync.WaitGroup
	t.Cleanup(func() { stopFlood(); flood.Wait() })
	for range 4 {
		flood.Add(1)
		go func() {
			defer flood.Done()
			if sb, err := fa.Create(floodCtx, corral.CreateOptions{Timeout: 10 * time.Minute}); err == nil {
				_, _ = fa.Kill(context.Background(), sb.ID)
			}
		}()
	}
	waiting("fa", 4)

	got := make(chan error, 1)
	go func() {
		_, err := createIn(t, ctx, fb)
		got <- err
	}()
	waiting("fb", 1)
	if _, err := fa.Kill(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("fb's create after the freed slot: %v", err)
	}
	tm, err := s.c.TeamQuota(ctx, "fa")
	if err != nil || tm.Usage.Waiting != 4 || tm.Usage.Running != 1 {
		t.Fatalf("fa after fb got the slot: %+v %v; want its 4 creates still waiting", tm, err)
	}
	if list, err := fb.List(ctx, corral.ListOptions{}); err != nil || len(list) != 1 {
		t.Fatalf("fb runs %d sandboxes (%v), want 1", len(list), err)
	}
}
