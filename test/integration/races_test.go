package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/corralhq/corral/internal/server"
	corral "github.com/corralhq/corral/sdk/go"
)

// TestKillDuringPersistedResume: a kill that races the resume of a
// persisted sandbox (which starts its container and network again) ends
// it for good, whichever call gets in first: the kill succeeds, the
// record says killed, and no container, mount, cgroup, state dir or veth
// pair is left for the ended record. Three rounds, a networked sandbox.
func TestKillDuringPersistedResume(t *testing.T) {
	need(t)
	ctx := context.Background()
	c := corral.New(env.url, env.key)
	for round := range 3 {
		sb, err := c.Create(ctx, corral.CreateOptions{Timeout: 2 * time.Minute, Network: "allow", Allow: []string{"example.test"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Kill(context.Background(), sb.ID) })
		if _, err := c.PausePersist(ctx, sb.ID); err != nil {
			t.Fatalf("round %d: persisted pause: %v", round, err)
		}
		resumed := make(chan error, 1)
		go func() { _, err := c.Resume(ctx, sb.ID, 0); resumed <- err }()
		if round > 0 {
			// Later rounds let the resume get further before the kill.
			time.Sleep(time.Duration(round) * 100 * time.Millisecond)
		}
		if _, err := c.Kill(ctx, sb.ID); err != nil {
			t.Fatalf("round %d: kill during a resume: %v", round, err)
		}
		var apiErr *corral.APIError
		if err := <-resumed; err != nil && !(errors.As(err, &apiErr) && (apiErr.Status == 404 || apiErr.Status == 409)) {
			t.Fatalf("round %d: resume racing a kill: %v, want success, 404 or 409", round, err)
		}
		got, err := c.Get(ctx, sb.ID)
		if err != nil || got.State != "ended" || got.EndReason != "killed" {
			t.Fatalf("round %d: after the kill: %+v %v", round, got, err)
		}
		assertNoTrace(t, sb.ID)
		links, err := netlink.LinkList()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range links {
			if l.Attrs().Alias == sb.ID {
				t.Fatalf("round %d: host interface %s of the killed sandbox is still there", round, l.Attrs().Name)
			}
		}
	}
}

// TestIdleTimeout: with an idle limit, a sandbox with no command for that
// long is ended with reason "idle" and the reaper records why; a sandbox
// running a command is not idle however long it runs, and time spent
// paused does not count (a sandbox resumed after a pause longer than the
// limit is not reaped at once).
func TestIdleTimeout(t *testing.T) {
	const limit = 3 * time.Second
	s := startGovServer(t, "idle limit", func(c *server.Config) { c.IdleTimeout = limit })
	ctx := context.Background()
	mk := func() *corral.Sandbox {
		sb, err := s.c.Create(ctx, corral.CreateOptions{Timeout: 2 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.c.Kill(context.Background(), sb.ID) })
		return sb
	}
	// Each sandbox gets its command or its pause right after its create:
	// the server's own reaper pass (every 30 s) may come at any moment,
	// and a create on a loaded host can take longer than the limit, so
	// creating all three first could leave busy or paused idle past it.
	idle, busy := mk(), mk()
	if _, err := busy.Start(ctx, "sleep 600", corral.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	paused := mk()
	if _, err := s.c.Pause(ctx, paused.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(limit + time.Second) // past the limit for all three
	if _, err := s.c.Resume(ctx, paused.ID, 0); err != nil {
		t.Fatal(err)
	}
	s.ts.Srv.Manager.Reap(ctx)

	got, err := s.c.Get(ctx, idle.ID)
	if err != nil || got.State != "ended" || got.EndReason != "idle" {
		t.Fatalf("idle sandbox after a reaper pass: %+v %v, want ended idle", got, err)
	}
	evs, err := s.c.Audit(ctx, corral.AuditQuery{Sandbox: idle.ID, Kind: "reaper.reclaimed"})
	if err != nil || len(evs) != 1 || !strings.Contains(string(evs[0].Data), `"reason":"idle"`) {
		t.Fatalf("reaper events of the idle sandbox: %+v %v", evs, err)
	}
	for name, sb := range map[string]*corral.Sandbox{"busy": busy, "resumed": paused} {
		if got, err := s.c.Get(ctx, sb.ID); err != nil || got.State != "running" {
			t.Fatalf("%s sandbox after a reaper pass: %+v %v, want running", name, got, err)
		}
		if res, err := sb.Run(ctx, "echo ok", corral.RunOptions{}); err != nil || res.Stdout != "ok\n" {
			t.Fatalf("%s sandbox: %q %v", name, res.Stdout, err)
		}
	}
}
