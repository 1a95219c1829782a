package integration

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"sync"
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
	// Its files cannot be copied while its processes are stopped.
	var apiErr *corral.APIError
	if _, err := c.Snapshot(ctx, sb.ID, ""); !errors.As(err, &apiErr) || apiErr.Status != 409 {
		t.Fatalf("snapshot of a persisted sandbox: %v, want 409", err)
	}
	if _, err := c.SaveTemplate(ctx, sb.ID, "persisted"+randHex(3)+":1"); !errors.As(err, &apiErr) || apiErr.Status != 409 {
		t.Fatalf("save as template of a persisted sandbox: %v, want 409", err)
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
	// So does a template saved from it: the files written before the
	// persisted pause are in it.
	name := "resumed" + randHex(3)
	if _, err := c.SaveTemplate(ctx, sb.ID, name+":1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.DeleteTemplate(context.Background(), name+":1") })
	fromTmpl, err := c.Create(ctx, corral.CreateOptions{Template: name, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), fromTmpl.ID) })
	res, err = fromTmpl.Run(ctx, "cat /home/user/p.txt", corral.RunOptions{})
	if err != nil || res.Stdout != "saved\n" {
		t.Fatalf("sandbox from a template saved after a persisted pause: %q %v", res.Stdout, err)
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

// stubbornSandbox starts a sandbox with /home/user/k.txt saying "kept"
// and a background process that ignores SIGTERM, so stopping it takes
// the whole kill grace. It is killed when t ends.
func stubbornSandbox(t *testing.T, c *corral.Client) *corral.Sandbox {
	t.Helper()
	ctx := context.Background()
	sb, err := c.Create(ctx, corral.CreateOptions{Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), sb.ID) })
	if _, err := sb.Run(ctx, "echo kept > /home/user/k.txt", corral.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Start(ctx, "trap '' TERM; while :; do sleep 1; done", corral.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	return sb
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
		sb := stubbornSandbox(t, s.c)
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
	// processes waits for it and resumes the sandbox, or, if it came
	// first, is refused with 409 (not paused) and leaves the pause to
	// happen; either way the sandbox is whole afterwards.
	sb := stubbornSandbox(t, s.c)
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

// TestSnapshotsAndPauseDoNotThawEachOther: snapshots freeze the sandbox
// for the copy and thaw it after; a pause that lands during a snapshot
// must stay a pause. Three snapshots and a pause sent at once: afterwards
// the record says paused and the runtime's freezer says so too (before
// the sandbox's operations were serialised, a snapshot could thaw a
// sandbox recorded as paused), and every snapshot starts a sandbox.
func TestSnapshotsAndPauseDoNotThawEachOther(t *testing.T) {
	need(t)
	ctx := context.Background()
	c := corral.New(env.url, env.key)
	sb, err := c.Create(ctx, corral.CreateOptions{Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), sb.ID) })
	if _, err := sb.Run(ctx, "head -c 20000000 /dev/urandom > /home/user/big && echo x > /home/user/mark", corral.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	snaps := make([]string, 3)
	errs := make([]error, 4)
	for i := range snaps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sn, err := c.Snapshot(ctx, sb.ID, "")
			if err == nil {
				snaps[i] = sn.ID
				t.Cleanup(func() { c.DeleteSnapshot(context.Background(), sn.ID) })
			}
			errs[i] = err
		}()
	}
	wg.Add(1)
	go func() { defer wg.Done(); _, errs[3] = c.Pause(ctx, sb.ID) }()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if got, err := c.Get(ctx, sb.ID); err != nil || got.State != "paused" {
		t.Fatalf("after the pause: %+v %v", got, err)
	}
	out, err := exec.Command("runc", "--root", runcRoot(env.dataDir), "state", sb.ID).Output()
	if err != nil || !strings.Contains(string(out), `"status": "paused"`) {
		t.Fatalf("runtime state of a paused sandbox: %s %v", out, err)
	}
	if _, err := c.Resume(ctx, sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	for _, id := range snaps {
		child, err := c.Create(ctx, corral.CreateOptions{Snapshot: id, Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		res, err := child.Run(ctx, "cat /home/user/mark", corral.RunOptions{})
		c.Kill(ctx, child.ID)
		if err != nil || res.Stdout != "x\n" {
			t.Fatalf("sandbox from snapshot %s: %q %v", id, res.Stdout, err)
		}
	}
}
