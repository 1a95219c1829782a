package store

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/store/pgtest"
)

// BenchmarkStoreOps measures the store's hot operations on each backend,
// both crash-safe (SQLite synchronous=FULL; PostgreSQL with fsync and
// synchronous commit, on a server of its own on this machine): a
// sandbox record insert, an audit event append, an API key lookup (every
// request pays one) and a list of a sandbox's events; Parallel appends
// from 8 goroutines at once; AppendEvents256 is one batch of the audit
// writer's largest size.
func BenchmarkStoreOps(b *testing.B) {
	for _, name := range []string{"sqlite", "postgres"} {
		b.Run(name, func(b *testing.B) {
			var addr string
			if name == "sqlite" {
				addr = filepath.Join(b.TempDir(), "corral.db")
			} else {
				if why := pgtest.Unavailable(); why != "" {
					b.Skip(why)
				}
				pg, err := pgtest.Start(pgtest.Options{Durable: true})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { pg.Stop() })
				if err := pg.CreateDatabase(context.Background(), "bench"); err != nil {
					b.Fatal(err)
				}
				addr = pg.URL("bench")
			}
			s, err := Open(addr)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			benchOps(b, s)
		})
	}
}

func benchOps(b *testing.B, s *Store) {
	ctx := context.Background()
	now := time.Now()
	var key string
	for range 1000 {
		var err error
		if key, _, err = s.CreateAPIKey(ctx, "k", "team", RoleMember); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.InsertSandbox(ctx, &Sandbox{ID: "sb", Template: "base", Runtime: "runc", Tier: "light", State: StateRunning, CreatedAt: now, ExpiresAt: now}); err != nil {
		b.Fatal(err)
	}
	b.Run("InsertSandbox", func(b *testing.B) {
		for i := range b.N {
			if err := s.InsertSandbox(ctx, &Sandbox{ID: fmt.Sprint("sb-", b.N, "-", i), Template: "base", Runtime: "runc", Tier: "light",
				State: StateRunning, CreatedAt: now, ExpiresAt: now}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("AppendEvent", func(b *testing.B) {
		for range b.N {
			if _, err := s.AppendEvent(ctx, &Event{SandboxID: "sb", Kind: "bench", Data: []byte(`{"n":1}`)}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("AppendEventParallel", func(b *testing.B) {
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := s.AppendEvent(ctx, &Event{SandboxID: "sb", Kind: "bench", Data: []byte(`{"n":1}`)}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("AppendEvents256", func(b *testing.B) { // the audit writer's largest batch
		for range b.N {
			evs := make([]*Event, 256)
			for i := range evs {
				evs[i] = &Event{SandboxID: "sb", Kind: "bench", Data: []byte(`{"n":1}`)}
			}
			if err := s.AppendEvents(ctx, evs); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("LookupAPIKey", func(b *testing.B) {
		for range b.N {
			if _, err := s.LookupAPIKey(ctx, key); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ListEvents100", func(b *testing.B) {
		for range b.N {
			if evs, err := s.ListEvents(ctx, EventFilter{SandboxID: "sb", Limit: 100}); err != nil || len(evs) != 100 {
				b.Fatal(len(evs), err)
			}
		}
	})
}
