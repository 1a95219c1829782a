package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/server"
	corral "github.com/corralhq/corral/sdk/go"
)

// TestWarmPool: a template's pool keeps idle sandboxes ready; a create with
// the template's defaults takes one (recorded as from_pool) and a create
// with other settings does not; a pooled sandbox serves exactly one create
// (after its kill the pool refills with new sandboxes, never the used
// one); removing the pool stops its idle sandboxes and leaves nothing.
func TestWarmPool(t *testing.T) {
	need(t)
	ctx := context.Background()
	c := corral.New(env.url, env.key)
	if _, err := c.SetPool(ctx, "base", 2, 3, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = c.SetPool(context.Background(), "base", 0, 0, 0) })
	idle := func() corral.Pool {
		ps, err := c.Pools(ctx)
		if err != nil || len(ps) != 1 {
			t.Fatalf("pools: %v %v", ps, err)
		}
		return ps[0]
	}
	waitFor(t, "the pool to fill", time.Minute, func() bool { return idle().Idle == 2 })
	// The pool's sandboxes are the state dirs no record owns.
	var owned struct{ Sandboxes []sandboxJSON }
	call(t, "GET", "/v1/sandboxes?team=all", nil, &owned)
	pooledIDs := map[string]bool{}
	for _, e := range mustDirs(t, filepath.Join(env.dataDir, "sandboxes")) {
		pooledIDs[e] = true
	}
	for _, sb := range owned.Sandboxes {
		delete(pooledIDs, sb.ID)
	}
	if len(pooledIDs) != 2 {
		t.Fatalf("%d pooled sandboxes on the host, want 2", len(pooledIDs))
	}

	before := idle().Hits
	sb, err := c.Create(ctx, corral.CreateOptions{Metadata: map[string]string{"pool": "hit"}, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if !pooledIDs[sb.ID] {
		t.Fatalf("create did not take a pooled sandbox: %s not among %v", sb.ID, pooledIDs)
	}
	if got := idle().Hits; got != before+1 {
		t.Fatalf("hits %d, want %d", got, before+1)
	}
	res, err := sb.Run(ctx, "echo $E2B_SANDBOX; id -un", corral.RunOptions{})
	if err != nil || res.Stdout != "true\nuser\n" {
		t.Fatalf("pooled sandbox runs %q %v", res.Stdout, err)
	}
	if sb.Metadata["pool"] != "hit" || sb.ExpiresAt.Sub(sb.CreatedAt) > 2*time.Minute {
		t.Fatalf("the create's metadata and TTL were not applied: %+v", sb)
	}
	evs, _ := c.Audit(ctx, corral.AuditQuery{Sandbox: sb.ID, Kind: "sandbox.created"})
	if len(evs) != 1 {
		t.Fatalf("sandbox.created events: %d", len(evs))
	}
	var d map[string]any
	_ = json.Unmarshal(evs[0].Data, &d)
	if d["from_pool"] != true {
		t.Fatalf("sandbox.created does not say from_pool: %s", evs[0].Data)
	}

	// Other settings never come from the pool.
	other, err := c.Create(ctx, corral.CreateOptions{Env: map[string]string{"X": "1"}, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), other.ID) })
	if pooledIDs[other.ID] {
		t.Fatal("a create with env vars took a pooled sandbox")
	}

	// Used once: after the kill, that sandbox is gone and never reused.
	if _, err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(env.dataDir, "sandboxes", sb.ID)); !os.IsNotExist(err) {
		t.Fatalf("the used pooled sandbox is still on the host: %v", err)
	}
	waitFor(t, "the pool to refill", time.Minute, func() bool { return idle().Idle == 2 })
	now := mustDirs(t, filepath.Join(env.dataDir, "sandboxes"))
	for _, id := range now {
		if id == sb.ID {
			t.Fatal("the used sandbox came back into the pool")
		}
	}
	// The reaper leaves pooled sandboxes alone.
	env.srv.Manager.Reap(ctx)
	if got := idle().Idle; got != 2 {
		t.Fatalf("idle after a reaper pass: %d", got)
	}

	// Removing the pool stops its idle sandboxes.
	if _, err := c.SetPool(ctx, "base", 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pooled sandboxes to stop", time.Minute, func() bool {
		left := 0
		for _, id := range mustDirs(t, filepath.Join(env.dataDir, "sandboxes")) {
			if id != other.ID {
				left++
			}
		}
		return left == 0
	})
	var e apiErr
	if code := call(t, "PUT", "/v1/pools/base", map[string]any{"min": 5, "max": 2}, &e); code != 400 {
		t.Fatalf("min > max accepted: %d", code)
	}
	if code := call(t, "PUT", "/v1/pools/nosuchtemplate", map[string]any{"min": 1}, &e); code != 400 {
		t.Fatalf("unknown template accepted: %d", code)
	}
}

func mustDirs(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestWarmPoolMemoryPressure: under host memory pressure the pools give
// their idle sandboxes back (stopped, gone from the host, recorded as
// pool.emptied) and do not refill; when the pressure ends they refill.
// The pressure signal is injected (server.Config.MemoryPressure): filling
// this machine's memory for real would endanger everything else on it.
// /proc/meminfo parsing is tested in internal/sandbox.
func TestWarmPoolMemoryPressure(t *testing.T) {
	var pressure atomic.Bool
	s := startGovServer(t, "pressure", func(c *server.Config) { c.MemoryPressure = pressure.Load })
	ctx := context.Background()
	if _, err := s.c.SetPool(ctx, "base", 2, 2, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = s.c.SetPool(context.Background(), "base", 0, 0, 0) })
	idle := func() int {
		ps, err := s.c.Pools(ctx)
		if err != nil || len(ps) != 1 {
			t.Fatalf("pools: %v %v", ps, err)
		}
		return ps[0].Idle
	}
	sandboxDirs := func() int { return len(mustDirs(t, filepath.Join(s.ts.DataDir, "sandboxes"))) }
	waitFor(t, "the pool to fill", time.Minute, func() bool { return idle() == 2 && sandboxDirs() == 2 })

	pressure.Store(true)
	waitFor(t, "the pool to empty under pressure", time.Minute, func() bool { return idle() == 0 && sandboxDirs() == 0 })
	evs, err := s.c.Audit(ctx, corral.AuditQuery{Kind: "pool.emptied"})
	if err != nil || len(evs) == 0 || !strings.Contains(string(evs[0].Data), `"reason":"memory_pressure"`) {
		t.Fatalf("pool.emptied events: %+v %v", evs, err)
	}
	// While the pressure lasts, refill passes start nothing.
	for i := 0; i < 3; i++ {
		s.ts.Srv.Manager.RefillPools()
		if n, d := idle(), sandboxDirs(); n != 0 || d != 0 {
			t.Fatalf("under memory pressure a refill pass left %d idle, %d sandboxes on the host", n, d)
		}
	}

	pressure.Store(false)
	waitFor(t, "the pool to refill after the pressure", time.Minute, func() bool { return idle() == 2 })
}
