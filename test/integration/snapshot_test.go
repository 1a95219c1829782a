package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corral "github.com/corralhq/corral/sdk/go"
)

type snapshotJSON struct {
	ID, Name, Sandbox, Template, Parent string
	Layers                              int
	SizeBytes                           int64 `json:"size_bytes"`
}

// TestSnapshotChain: a snapshot keeps a sandbox's files, including
// deletions (overlay whiteouts) and ownership; snapshots of sandboxes
// started from snapshots stack; a sandbox's own layer is unchanged by the
// snapshot (it keeps running and writing).
func TestSnapshotChain(t *testing.T) {
	need(t)
	a := create(t, nil)
	mustSh(t, a, "echo one > /home/user/a.txt; echo two > /home/user/b.txt; mkdir -p /home/user/d && echo x > /home/user/d/x")
	mustSh(t, a, "rm /etc/hostname; echo root-file > /root/r.txt", map[string]any{"user": "root"})
	var s1 snapshotJSON
	if code := call(t, "POST", "/v1/sandboxes/"+a+"/snapshots", map[string]any{"name": "first"}, &s1); code != 201 {
		t.Fatalf("snapshot: status %d", code)
	}
	if !strings.HasPrefix(s1.ID, "snap-") || s1.Layers != 1 || !strings.HasPrefix(s1.Template, "base:") || s1.Sandbox != a {
		t.Fatalf("snapshot %+v", s1)
	}
	// The source keeps running and its later writes are not in the snapshot.
	mustSh(t, a, "echo later > /home/user/later.txt")

	b := create(t, map[string]any{"snapshot": s1.ID})
	out := mustSh(t, b, "cat /home/user/a.txt /home/user/d/x; stat -c %U /home/user/a.txt; test -e /etc/hostname && echo hostname-back || echo hostname-gone; test -e /home/user/later.txt && echo later-leaked || echo no-later")
	if out != "one\nx\nuser\nhostname-gone\nno-later\n" {
		t.Fatalf("child of the snapshot sees %q", out)
	}
	if got := mustSh(t, b, "cat /root/r.txt", map[string]any{"user": "root"}); got != "root-file\n" {
		t.Fatalf("root's file: %q", got)
	}
	mustSh(t, b, "rm /home/user/b.txt; rm -r /home/user/d; echo three > /home/user/c.txt")
	// Isolation the other way: the child's changes never reach the source.
	if got := mustSh(t, a, "ls /home/user; cat /home/user/b.txt"); got != "a.txt\nb.txt\nd\nlater.txt\ntwo\n" {
		t.Fatalf("the source sees %q after the child's changes", got)
	}
	var s2 snapshotJSON
	if code := call(t, "POST", "/v1/sandboxes/"+b+"/snapshots", nil, &s2); code != 201 {
		t.Fatalf("second snapshot: status %d", code)
	}
	if s2.Parent != s1.ID || s2.Layers != 2 {
		t.Fatalf("second snapshot %+v, want parent %s and 2 layers", s2, s1.ID)
	}
	c := create(t, map[string]any{"template": s2.ID}) // E2B style: a snapshot id as the template
	if got := mustSh(t, c, "ls /home/user; cat /home/user/c.txt"); got != "a.txt\nc.txt\nthree\n" {
		t.Fatalf("grandchild sees %q", got)
	}
}

// TestSnapshotOfPausedSandbox: snapshotting a paused sandbox leaves it
// paused; snapshotting a running one leaves it running.
func TestSnapshotOfPausedSandbox(t *testing.T) {
	need(t)
	id := create(t, nil)
	mustSh(t, id, "echo p > /home/user/p.txt")
	if code := call(t, "POST", "/v1/sandboxes/"+id+"/pause", nil, nil); code != 200 {
		t.Fatalf("pause: %d", code)
	}
	var sn snapshotJSON
	if code := call(t, "POST", "/v1/sandboxes/"+id+"/snapshots", nil, &sn); code != 201 {
		t.Fatalf("snapshot of a paused sandbox: %d", code)
	}
	var sb sandboxJSON
	call(t, "GET", "/v1/sandboxes/"+id, nil, &sb)
	if sb.State != "paused" {
		t.Fatalf("state after snapshot: %s, want paused", sb.State)
	}
	if code := call(t, "POST", "/v1/sandboxes/"+id+"/resume", nil, nil); code != 200 {
		t.Fatalf("resume: %d", code)
	}
	child := create(t, map[string]any{"snapshot": sn.ID})
	if got := mustSh(t, child, "cat /home/user/p.txt"); got != "p\n" {
		t.Fatalf("child: %q", got)
	}
}

// TestSnapshotDeleteWhileUsed: deleting a snapshot that a running sandbox
// uses hides it at once (no new sandbox from it) and keeps the sandbox
// working; its layer is removed once the sandbox is gone (reaper pass).
func TestSnapshotDeleteWhileUsed(t *testing.T) {
	need(t)
	src := create(t, nil)
	mustSh(t, src, "echo kept > /home/user/k.txt")
	var sn snapshotJSON
	call(t, "POST", "/v1/sandboxes/"+src+"/snapshots", nil, &sn)
	layerDir := filepath.Join(env.dataDir, "snapshots", sn.ID)
	if _, err := os.Stat(layerDir); err != nil {
		t.Fatalf("layer dir: %v", err)
	}
	child := create(t, map[string]any{"snapshot": sn.ID})
	if code := call(t, "DELETE", "/v1/snapshots/"+sn.ID, nil, nil); code != 204 {
		t.Fatalf("delete: %d", code)
	}
	if code := call(t, "GET", "/v1/snapshots/"+sn.ID, nil, nil); code != 404 {
		t.Fatalf("get after delete: %d, want 404", code)
	}
	var e apiErr
	if code := call(t, "POST", "/v1/sandboxes", map[string]any{"snapshot": sn.ID}, &e); code != 400 {
		t.Fatalf("create from a deleted snapshot: %d", code)
	}
	if got := mustSh(t, child, "cat /home/user/k.txt"); got != "kept\n" {
		t.Fatalf("child after the delete: %q", got)
	}
	if _, err := os.Stat(layerDir); err != nil {
		t.Fatalf("layer removed while in use: %v", err)
	}
	call(t, "DELETE", "/v1/sandboxes/"+child, nil, nil)
	env.srv.Manager.Reap(context.Background())
	if _, err := os.Stat(layerDir); !os.IsNotExist(err) {
		t.Fatalf("layer of the deleted snapshot still on disk after its last user ended: %v", err)
	}
}

// TestForkAndCLI: fork through the SDK copies files, limits and metadata;
// the CLI prints a snapshot id and starts a sandbox from it.
func TestForkAndCLI(t *testing.T) {
	need(t)
	ctx := context.Background()
	c := corral.New(env.url, env.key)
	sb, err := c.Create(ctx, corral.CreateOptions{Tier: "light", Resources: corral.Resources{MemoryMB: 192}, Metadata: map[string]string{"who": "fork-test"}, Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), sb.ID) })
	if _, err := sb.Run(ctx, "echo forked > /home/user/f.txt", corral.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	forks, err := c.Fork(ctx, sb.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(forks) != 2 {
		t.Fatalf("%d forks", len(forks))
	}
	for _, f := range forks {
		t.Cleanup(func() { c.Kill(context.Background(), f.ID) })
		if f.ID == sb.ID || f.Resources.MemoryMB != 192 || f.Metadata["who"] != "fork-test" {
			t.Fatalf("fork %+v", f)
		}
		res, err := f.Run(ctx, "cat /home/user/f.txt", corral.RunOptions{})
		if err != nil || res.Stdout != "forked\n" {
			t.Fatalf("fork sees %q, %v", res.Stdout, err)
		}
	}
	out, stderr, code := corralCLI(t, "", "sandbox", "snapshot", "--server", env.url, "--api-key", env.key, sb.ID)
	snap := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(snap, "snap-") {
		t.Fatalf("corral sandbox snapshot: exit %d %q %q", code, out, stderr)
	}
	out, stderr, code = corralCLI(t, "", "sandbox", "create", "--server", env.url, "--api-key", env.key, "--snapshot", snap)
	id := strings.TrimSpace(out)
	if code != 0 || id == "" {
		t.Fatalf("create --snapshot: exit %d %q %q", code, out, stderr)
	}
	t.Cleanup(func() { c.Kill(context.Background(), id) })
	if got := mustSh(t, id, "cat /home/user/f.txt"); got != "forked\n" {
		t.Fatalf("sandbox from the CLI snapshot sees %q", got)
	}
	out, _, code = corralCLI(t, "", "snapshot", "ls", "--server", env.url, "--api-key", env.key, "--json")
	if code != 0 || !strings.Contains(out, snap) {
		t.Fatalf("snapshot ls: exit %d %q", code, out)
	}
}
