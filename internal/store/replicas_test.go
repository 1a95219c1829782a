package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/store/pgtest"
)

// openReplicas opens n store handles on one new PostgreSQL database at
// once, as n control planes starting together would.
func openReplicas(t *testing.T, n int) []*Store {
	t.Helper()
	url := pgtest.Shared(t).NewDatabase(t)
	stores := make([]*Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range stores {
		wg.Go(func() { stores[i], errs[i] = Open(url) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: open: %v", i, err)
		}
		t.Cleanup(func() { stores[i].Close() })
	}
	return stores
}

// TestReplicasMigrateAtOnce defends against two control planes that
// start at once on a new PostgreSQL store breaking each other's
// migration (concurrent CREATE TABLE IF NOT EXISTS races in PostgreSQL's
// catalog): every one opens, and the schema is made once.
func TestReplicasMigrateAtOnce(t *testing.T) {
	for round := range 3 {
		stores := openReplicas(t, 4)
		if _, err := stores[0].AppendEvent(context.Background(), &Event{Kind: "test"}); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if n, err := stores[3].CountEvents(context.Background()); err != nil || n != 1 {
			t.Fatalf("round %d: replica 3 sees %d events (%v), want replica 0's one", round, n, err)
		}
	}
}

// TestReplicasShareOneStore: two control planes on one PostgreSQL store,
// writing at once, keep every guarantee the store makes to one:
//   - ids are unique: command record ids never repeat across replicas,
//     and of two creates of one sandbox id exactly one succeeds;
//   - audit events are never lost: every event either replica appends is
//     stored once, and a reader following the log by id (as `corral
//     audit --follow` does) sees each exactly once, in id order — events
//     are committed in id order, so it never skips one that a slower
//     transaction commits later with a smaller id;
//   - a key revoked on one replica authenticates nothing on the other
//     from its next request (nothing is cached);
//   - of two revocations of the last two admin keys at once, on two
//     replicas, exactly one succeeds (the server keeps an admin);
//   - of two template versions made current at once, exactly one is.
func TestReplicasShareOneStore(t *testing.T) {
	rs := openReplicas(t, 2)
	a, b := rs[0], rs[1]
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)

	t.Run("ids", func(t *testing.T) {
		const perWriter, writers = 100, 4
		ids := make(chan int64, 2*writers*perWriter)
		errs := make(chan error, 2*writers)
		var wg sync.WaitGroup
		for _, s := range rs {
			for range writers {
				wg.Go(func() {
					for range perWriter {
						id, err := s.StartCommand(ctx, &Command{SandboxID: "sb", StartedAt: now, Command: "true"}, nil)
						if err != nil {
							errs <- err
							return
						}
						ids <- id
					}
				})
			}
		}
		wg.Wait()
		close(ids)
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		seen := map[int64]bool{}
		for id := range ids {
			if seen[id] {
				t.Fatalf("command id %d given twice", id)
			}
			seen[id] = true
		}
		if len(seen) != 2*writers*perWriter {
			t.Fatalf("%d ids, want %d", len(seen), 2*writers*perWriter)
		}
		for i := range 20 {
			id := fmt.Sprintf("dup-%d", i)
			sb := &Sandbox{ID: id, Template: "base", Runtime: "runc", Tier: "light", State: StateRunning, CreatedAt: now, ExpiresAt: now}
			var okCount int
			var mu sync.Mutex
			var wg sync.WaitGroup
			for _, s := range rs {
				wg.Go(func() {
					if s.InsertSandbox(ctx, sb) == nil {
						mu.Lock()
						okCount++
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if okCount != 1 {
				t.Fatalf("sandbox %s created %d times at once, want exactly once", id, okCount)
			}
		}
	})

	t.Run("events", func(t *testing.T) {
		const batches, perBatch, writers = 50, 5, 3
		const total = 2 * writers * batches * perBatch
		start, err := a.ListEvents(ctx, EventFilter{})
		if err != nil {
			t.Fatal(err)
		}
		var after int64
		if len(start) > 0 {
			after = start[len(start)-1].ID
		}
		done := make(chan struct{})
		followed := make(chan []*Event, 1)
		go func() { // the follower, on replica b
			var got []*Event
			last := after
			defer func() { followed <- got }()
			for len(got) < total {
				writersDone := false
				select {
				case <-done:
					writersDone = true
				default:
				}
				evs, err := b.ListEvents(ctx, EventFilter{AfterID: last, Kind: "replica"})
				if err != nil {
					t.Error(err)
					return
				}
				if len(evs) == 0 && writersDone {
					return // everything committed was read
				}
				if len(evs) > 0 {
					got = append(got, evs...)
					last = evs[len(evs)-1].ID
				}
			}
		}()
		var wg sync.WaitGroup
		for r, s := range rs {
			for w := range writers {
				wg.Go(func() {
					for i := range batches {
						evs := make([]*Event, perBatch)
						for j := range evs {
							evs[j] = &Event{Kind: "replica.write", Data: fmt.Appendf(nil, `{"r":%d,"w":%d,"i":%d,"j":%d}`, r, w, i, j)}
						}
						if err := s.AppendEvents(ctx, evs); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
		}
		wg.Wait()
		close(done)
		var got []*Event
		select {
		case got = <-followed:
		case <-time.After(2 * time.Minute):
			t.Fatal("the follower did not finish")
		}
		stored, err := a.ListEvents(ctx, EventFilter{AfterID: after, Kind: "replica"})
		if err != nil {
			t.Fatal(err)
		}
		if len(stored) != total {
			t.Fatalf("%d events stored, want %d", len(stored), total)
		}
		seen := map[string]bool{}
		for i, ev := range got {
			if i > 0 && ev.ID <= got[i-1].ID {
				t.Fatalf("follower saw id %d after %d", ev.ID, got[i-1].ID)
			}
			seen[string(ev.Data)] = true
		}
		if len(got) != total || len(seen) != total {
			t.Fatalf("the follower saw %d events (%d distinct), want each of the %d exactly once (one skipped an event committed late)", len(got), len(seen), total)
		}
	})

	t.Run("revocation", func(t *testing.T) {
		key, k, err := a.CreateAPIKey(ctx, "ci", "team-r", RoleMember)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.LookupAPIKey(ctx, key); err != nil {
			t.Fatalf("replica b does not know replica a's new key: %v", err)
		}
		if _, _, err := a.RevokeAPIKey(ctx, k.ID, time.Now()); err != nil {
			t.Fatal(err)
		}
		if _, err := b.LookupAPIKey(ctx, key); !errors.Is(err, ErrNotFound) {
			t.Fatalf("a key revoked on replica a authenticates on replica b: %v", err)
		}
	})

	t.Run("last admin", func(t *testing.T) {
		for round := range 20 {
			for _, k := range mustKeys(t, a) { // start each round with exactly two admin keys
				if k.Role == RoleAdmin && k.RevokedAt == nil {
					if _, _, err := a.RevokeAPIKey(ctx, k.ID, now); err != nil && !errors.Is(err, ErrLastAdminKey) {
						t.Fatal(err)
					}
				}
			}
			var ids [2]string
			for i := range ids {
				_, k, err := a.CreateAPIKey(ctx, fmt.Sprint("admin-", round, i), "ops", RoleAdmin)
				if err != nil {
					t.Fatal(err)
				}
				ids[i] = k.ID
			}
			for _, k := range mustKeys(t, a) {
				if k.Role == RoleAdmin && k.RevokedAt == nil && k.ID != ids[0] && k.ID != ids[1] {
					if _, _, err := a.RevokeAPIKey(ctx, k.ID, now); err != nil {
						t.Fatal(err)
					}
				}
			}
			var errs [2]error
			var wg sync.WaitGroup
			for i, s := range rs {
				wg.Go(func() { _, _, errs[i] = s.RevokeAPIKey(ctx, ids[i], now) })
			}
			wg.Wait()
			left := 0
			for _, k := range mustKeys(t, b) {
				if k.Role == RoleAdmin && k.RevokedAt == nil {
					left++
				}
			}
			refused := 0
			for _, err := range errs {
				if errors.Is(err, ErrLastAdminKey) {
					refused++
				} else if err != nil {
					t.Fatal(err)
				}
			}
			if left != 1 || refused != 1 {
				t.Fatalf("round %d: two replicas revoking the last two admin keys at once: %d admin keys left, %d refused (%v); want 1 and 1", round, left, refused, errs)
			}
		}
	})

	t.Run("current template", func(t *testing.T) {
		for round := range 20 {
			name := fmt.Sprint("tpl-", round)
			var wg sync.WaitGroup
			for i, s := range rs {
				wg.Go(func() {
					tv := &TemplateVersion{Name: name, Version: fmt.Sprint("v", i), Digest: "sha256:x", Source: "build", RootFS: "/r", CreatedAt: now}
					if err := s.InsertTemplateVersion(ctx, tv, true); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			vs, err := b.ListTemplateVersions(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			current := 0
			for _, v := range vs {
				if v.Current {
					current++
				}
			}
			if len(vs) != 2 || current != 1 {
				t.Fatalf("round %d: %d versions, %d current; want 2 and exactly 1", round, len(vs), current)
			}
		}
	})
}

func mustKeys(t *testing.T, s *Store) []*APIKey {
	t.Helper()
	ks, err := s.ListAPIKeys(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

// TestStoreSurvivesPostgresRestart: when the PostgreSQL server restarts
// (an operator's restart, a failover) under an open store, the store
// recovers by itself — its pool drops the dead connections — without
// being reopened: what was committed before is there, and writes work
// again. At most the first operation on each dead connection fails (the
// server closed it); none is retried behind the caller's back.
func TestStoreSurvivesPostgresRestart(t *testing.T) {
	if why := pgtest.Unavailable(); why != "" {
		pgtest.Shared(t) // skips or fails, as for every PostgreSQL test
	}
	pg, err := pgtest.Start(pgtest.Options{Durable: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	ctx := context.Background()
	if err := pg.CreateDatabase(ctx, "corral"); err != nil {
		t.Fatal(err)
	}
	s, err := Open(pg.URL("corral"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now().UTC().Truncate(time.Millisecond)
	if err := s.InsertSandbox(ctx, &Sandbox{ID: "before", Template: "base", Runtime: "runc", Tier: "light", State: StateRunning, CreatedAt: now, ExpiresAt: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendEvent(ctx, &Event{SandboxID: "before", Kind: "sandbox.created"}); err != nil {
		t.Fatal(err)
	}
	if err := pg.Restart(); err != nil {
		t.Fatal(err)
	}
	failures := 0
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := s.GetSandbox(ctx, "before")
		if err == nil {
			break
		}
		if errors.Is(err, ErrNotFound) || time.Now().After(deadline) {
			t.Fatalf("after the restart: %v (after %d failures)", err, failures)
		}
		failures++
		time.Sleep(100 * time.Millisecond)
	}
	if failures > PostgresMaxIdleConns {
		t.Errorf("%d operations failed after the restart, want at most one per pooled connection (%d)", failures, PostgresMaxIdleConns)
	}
	if _, err := s.AppendEvent(ctx, &Event{SandboxID: "before", Kind: "sandbox.ended"}); err != nil {
		t.Fatalf("append after the restart: %v", err)
	}
	evs, err := s.ListEvents(ctx, EventFilter{SandboxID: "before"})
	if err != nil || len(evs) != 2 || evs[0].Kind != "sandbox.created" || evs[1].Kind != "sandbox.ended" {
		t.Fatalf("events across the restart: %v %v", evs, err)
	}
	t.Logf("%d operation(s) failed after the restart", failures)
}
