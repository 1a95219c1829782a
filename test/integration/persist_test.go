package integration

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/server"
	corral "github.com/corralhq/corral/sdk/go"
)

// TestPersistedPause: a persisted pause saves the files and stops every
// process (none is left on the host), the sandbox stays listed as paused
// with the same id, and resume restarts it from the saved files with the
// same access token: files kept, processes not. Calls in between are
// refused as for any paused sandbox.
func TestPersistedPause(t *testing.T) {
	need(t)
	ctx := context.Background()
	c := corral.New(env.url, env.key)
	sb, err := c.Create(ctx, corral.CreateOptions{Timeout: 2 * time.Minute, Env: map[string]string{"KEPT_ENV": "yes"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), sb.ID) })
	if _, err := sb.Run(ctx, "echo saved > /home/user/p.txt", corral.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Start(ctx, "sleep 600", corral.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PausePersist(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(ctx, sb.ID)
	if err != nil || got.State != "paused" {
		t.Fatalf("after a persisted pause: %+v %v", got, err)
	}
	if n := countRunc(t, sb.ID); n != 0 {
		t.Fatalf("the runtime still holds the sandbox after a persisted pause")
	}
	if _, err := sb.Run(ctx, "true", corral.RunOptions{}); err == nil {
		t.Fatal("a command ran in a persisted sandbox")
	}
	if _, err := c.Resume(ctx, sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	res, err := sb.Run(ctx, "cat /home/user/p.txt; pgrep -x sleep || echo no-sleep; echo $KEPT_ENV", corral.RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "saved\nno-sleep\nyes\n" {
		t.Fatalf("after resume: %q", res.Stdout)
	}
	// A snapshot of the resumed sandbox stacks on its persisted files.
	sn, err := c.Snapshot(ctx, sb.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	child, err := c.Create(ctx, corral.CreateOptions{Snapshot: sn.ID, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), child.ID) })
	res, err = child.Run(ctx, "cat /home/user/p.txt", corral.RunOptions{})
	if err != nil || res.Stdout != "saved\n" {
		t.Fatalf("child of the resumed sandbox: %q %v", res.Stdout, err)
	}
}

// TestAutoPauseAndSaveTemplate: a sandbox created with auto-pause is
// paused (not killed) at the end of its TTL; a sandbox's files saved as a
// template version start new sandboxes.
func TestAutoPauseAndSaveTemplate(t *testing.T) {
	need(t)
	ctx := context.Background()
	c := corral.New(env.url, env.key)
	sb, err := c.Create(ctx, corral.CreateOptions{Timeout: 2 * time.Second, AutoPause: true, PauseMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), sb.ID) })
	waitFor(t, "the auto-pause", time.Minute, func() bool {
		got, err := c.Get(ctx, sb.ID)
		return err == nil && got.State == "paused"
	})
	if _, err := c.Resume(ctx, sb.ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Run(ctx, "echo deps > /home/user/deps.txt", corral.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	name := "saved" + randHex(3)
	tv, err := c.SaveTemplate(ctx, sb.ID, name+":1")
	if err != nil {
		t.Fatal(err)
	}
	if tv.Ref != name+":1" || !tv.Current || !strings.HasPrefix(tv.Parent, "base") {
		t.Fatalf("saved template %+v", tv)
	}
	n, err := c.Create(ctx, corral.CreateOptions{Template: name, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), n.ID) })
	res, err := n.Run(ctx, "cat /home/user/deps.txt", corral.RunOptions{})
	if err != nil || res.Stdout != "deps\n" {
		t.Fatalf("sandbox from the saved template: %q %v", res.Stdout, err)
	}
}

// countRunc reports whether runc lists the sandbox (1) or not (0).
func countRunc(t *testing.T, id string) int {
	t.Helper()
	out, _ := exec.Command("runc", "--root", runcRoot(env.dataDir), "list", "-q").Output()
	for _, l := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(l) == id {
			return 1
		}
	}
	return 0
}

// TestPersistedPauseIsNotADeath: stopping a sandbox's processes for a
// persisted pause is not a death. With the death check running every
// millisecond, a check always lands while the processes stop (a process
// that ignores SIGTERM holds the stop for the whole kill grace); the
// sandbox must still end up paused, never ended with reason "error", and
// resume with its files.
func TestPersistedPauseIsNotADeath(t *testing.T) {
	s := startGovServer(t, "fast death check", func(c *server.Config) {
		c.DeathCheckInterval = time.Millisecond
		c.KillGrace = 300 * time.Millisecond
	})
	ctx := context.Background()
	for i := range 3 {
		sb, err := s.c.Create(ctx, corral.CreateOptions{Timeout: 2 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.c.Kill(context.Background(), sb.ID) })
		if _, err := sb.Run(ctx, "echo kept > /home/user/k.txt", corral.RunOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Start(ctx, "trap '' TERM; while :; do sleep 1; done", corral.RunOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.c.PausePersist(ctx, sb.ID); err != nil {
			t.Fatalf("round %d: persisted pause: %v", i, err)
		}
		got, err := s.c.Get(ctx, sb.ID)
		if err != nil || got.State != "paused" || got.EndReason != "" {
			t.Fatalf("round %d: after a persisted pause: %+v %v", i, got, err)
		}
		if _, err := s.c.Resume(ctx, sb.ID, 0); err != nil {
			t.Fatalf("round %d: resume: %v", i, err)
		}
		res, err := sb.Run(ctx, "cat /home/user/k.txt", corral.RunOptions{})
		if err != nil || res.Stdout != "kept\n" {
			t.Fatalf("round %d: after resume: %q %v", i, res.Stdout, err)
		}
	}

	// A resume sent while a persisted pause may still be stopping the
	// processes either is refused with 409 (not paused yet, or a pause in
	// progress) and leaves the sandbox paused, or comes after the pause
	// and resumes it; either way the sandbox is whole afterwards.
	sb, err := s.c.Create(ctx, corral.CreateOptions{Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.c.Kill(context.Background(), sb.ID) })
	if _, err := sb.Run(ctx, "echo kept > /home/user/k.txt", corral.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Start(ctx, "trap '' TERM; while :; do sleep 1; done", corral.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	pauseErr := make(chan error, 1)
	go func() { _, err := s.c.PausePersist(ctx, sb.ID); pauseErr <- err }()
	_, resumeErr := s.c.Resume(ctx, sb.ID, 0)
	if err := <-pauseErr; err != nil {
		t.Fatalf("persisted pause: %v", err)
	}
	var apiErr *corral.APIError
	switch {
	case resumeErr == nil:
	case errors.As(resumeErr, &apiErr) && apiErr.Status == 409:
		if got, err := s.c.Get(ctx, sb.ID); err != nil || got.State != "paused" {
			t.Fatalf("after a refused resume: %+v %v", got, err)
		}
		if _, err := s.c.Resume(ctx, sb.ID, 0); err != nil {
			t.Fatalf("resume after the pause: %v", err)
		}
	default:
		t.Fatalf("resume during a persisted pause: %v, want success or 409", resumeErr)
	}
	res, err := sb.Run(ctx, "cat /home/user/k.txt", corral.RunOptions{})
	if err != nil || res.Stdout != "kept\n" {
		t.Fatalf("after pause and resume raced: %q %v", res.Stdout, err)
	}
}
