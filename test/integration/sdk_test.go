package integration

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corral "github.com/corralhq/corral/sdk/go"
)

func sdkClient(t *testing.T) *corral.Client {
	t.Helper()
	need(t)
	return corral.New(env.url, env.key)
}

func sdkSandbox(t *testing.T, opts corral.CreateOptions) *corral.Sandbox {
	t.Helper()
	c := sdkClient(t)
	sb, err := c.Create(context.Background(), opts)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { _ = sb.Kill(context.Background()) })
	return sb
}

// TestSDKLifecycle: create with metadata and env, get, list filtered by
// metadata, set timeout, kill; the record survives the sandbox.
func TestSDKLifecycle(t *testing.T) {
	c := sdkClient(t)
	ctx := context.Background()
	tag := "lifecycle-" + time.Now().Format("150405.000")
	sb, err := c.Create(ctx, corral.CreateOptions{
		Metadata: map[string]string{"test": tag}, Env: map[string]string{"GREETING": "hello"},
		Resources: corral.Resources{CPU: 0.25, MemoryMB: 128}, Timeout: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != "running" || sb.Resources.CPU != 0.25 || sb.Resources.MemoryMB != 128 || sb.Resources.DiskMB != 100 {
		t.Fatalf("created: %+v", sb)
	}
	res, err := sb.Run(ctx, "echo $GREETING; cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || echo n/a", corral.RunOptions{})
	if err != nil || !strings.HasPrefix(res.Stdout, "hello\n") {
		t.Fatalf("env var not set: %+v %v", res, err)
	}
	list, err := c.List(ctx, corral.ListOptions{Metadata: map[string]string{"test": tag}})
	if err != nil || len(list) != 1 || list[0].ID != sb.ID {
		t.Fatalf("list by metadata: %v %v", list, err)
	}
	if list, _ := c.List(ctx, corral.ListOptions{Metadata: map[string]string{"test": "nope"}}); len(list) != 0 {
		t.Fatalf("list with a non-matching filter returned %d sandboxes", len(list))
	}
	before := sb.ExpiresAt
	if err := sb.SetTimeout(ctx, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.Get(ctx, sb.ID); !got.ExpiresAt.After(before.Add(5 * time.Minute)) {
		t.Fatalf("expiry not extended: before %v after %v", before, got.ExpiresAt)
	}
	if err := sb.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(ctx, sb.ID)
	if err != nil || got.State != "ended" || got.EndReason != "killed" || got.EndedAt == nil {
		t.Fatalf("after kill: %+v %v", got, err)
	}
	if _, err := c.Kill(ctx, sb.ID); !corral.IsNotFound(err) {
		t.Fatalf("second kill: %v, want not found", err)
	}
}

// TestTTLExpiry: a sandbox is destroyed when its lifetime ends and the
// record says why.
func TestTTLExpiry(t *testing.T) {
	c := sdkClient(t)
	ctx := context.Background()
	sb, err := c.Create(ctx, corral.CreateOptions{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "TTL expiry", 30*time.Second, func() bool {
		got, err := c.Get(ctx, sb.ID)
		return err == nil && got.State == "ended"
	})
	got, _ := c.Get(ctx, sb.ID)
	if got.EndReason != "ttl" {
		t.Fatalf("end reason %q, want ttl", got.EndReason)
	}
	assertNoTrace(t, sb.ID)
}

// TestSDKStreamingAndBackground: output streams as it happens, background
// commands can be listed, fed stdin, signalled and waited for.
func TestSDKStreamingAndBackground(t *testing.T) {
	sb := sdkSandbox(t, corral.CreateOptions{})
	ctx := context.Background()

	// Foreground: the first chunk arrives while the command still runs:
	// the command waits for a file that is only created once its first
	// line has reached the client.
	var once sync.Once
	res, err := sb.Run(ctx, "echo first; while [ ! -e /tmp/go ]; do sleep 0.02; done; echo second >&2", corral.RunOptions{
		Timeout: 60 * time.Second,
		OnStdout: func(b []byte) {
			once.Do(func() {
				go sb.Run(ctx, "touch /tmp/go", corral.RunOptions{})
			})
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "first\n" || res.Stderr != "second\n" || res.ExitCode != 0 {
		t.Fatalf("result %+v", res)
	}

	// Background with stdin.
	h, err := sb.Start(ctx, "cat", corral.RunOptions{Args: []string{}, OpenStdin: true})
	if err != nil {
		t.Fatal(err)
	}
	procs, err := sb.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range procs {
		found = found || p.PID == h.PID()
	}
	if !found {
		t.Fatalf("background pid %d not in %+v", h.PID(), procs)
	}
	if err := h.SendInput([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	if err := h.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	r, err := h.Wait()
	if err != nil || r.Stdout != "ping\n" || r.ExitCode != 0 {
		t.Fatalf("cat with stdin: %+v %v", r, err)
	}

	// Background killed.
	h, err = sb.Start(ctx, "sleep 1000", corral.RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	r, _ = h.Wait()
	if r == nil || r.ExitCode != 137 {
		t.Fatalf("killed background command: %+v", r)
	}

	// Stdin from a reader, per-command env, cwd and root.
	r, err = sb.Run(ctx, "wc -c; echo $X; pwd; id -u", corral.RunOptions{
		Stdin: strings.NewReader(strings.Repeat("x", 200000)), Env: map[string]string{"X": "y"}, Cwd: "/tmp", User: "root",
	})
	if err != nil || r.Stdout != "200000\ny\n/tmp\n0\n" {
		t.Fatalf("stdin/env/cwd/user: %+v %v", r, err)
	}
	r, _ = sb.Run(ctx, "exit 7", corral.RunOptions{})
	if r.ExitCode != 7 {
		t.Fatalf("exit code %d, want 7", r.ExitCode)
	}
	r, _ = sb.Run(ctx, "sleep 100", corral.RunOptions{Timeout: 500 * time.Millisecond})
	if r.ExitCode != 124 || !r.TimedOut {
		t.Fatalf("timeout: %+v", r)
	}
}

// TestSDKFiles covers the file API and its bounds.
func TestSDKFiles(t *testing.T) {
	sb := sdkSandbox(t, corral.CreateOptions{})
	ctx := context.Background()
	fs := sb.Files()
	if err := fs.Write(ctx, "/home/user/dir/a.txt", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if b, err := fs.Read(ctx, "/home/user/dir/a.txt"); err != nil || string(b) != "hello" {
		t.Fatalf("read: %q %v", b, err)
	}
	st, err := fs.Stat(ctx, "dir/a.txt")
	if err != nil || st.Size != 5 || st.Owner != "user" {
		t.Fatalf("stat relative to home: %+v %v", st, err)
	}
	if ok, err := fs.MakeDir(ctx, "/home/user/dir/sub"); err != nil || !ok {
		t.Fatalf("mkdir: %v %v", ok, err)
	}
	if _, err := fs.Rename(ctx, "/home/user/dir/a.txt", "/home/user/dir/sub/b.txt"); err != nil {
		t.Fatal(err)
	}
	entries, err := fs.List(ctx, "/home/user/dir", 2)
	if err != nil || len(entries) != 2 || entries[0].Name != "sub" || entries[1].Name != "b.txt" {
		t.Fatalf("list: %v %v", entries, err)
	}
	if err := fs.Remove(ctx, "/home/user/dir"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := fs.Exists(ctx, "/home/user/dir"); ok {
		t.Fatal("removed dir still exists")
	}
	if _, err := fs.Read(ctx, "/nope"); !corral.IsNotFound(err) {
		t.Fatalf("read of a missing file: %v", err)
	}
	// Streaming upload and download of 20 MiB.
	big := bytes.Repeat([]byte("0123456789abcdef"), 20<<16)
	if err := fs.Upload(ctx, "/tmp/big", bytes.NewReader(big)); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if n, err := fs.Download(ctx, "/tmp/big", &buf); err != nil || n != int64(len(big)) || !bytes.Equal(buf.Bytes(), big) {
		t.Fatalf("download: %d %v", n, err)
	}
}

// TestFileAPITraversal (threat-model.md #11): paths with ../ and symlinks that
// point out of the sandbox resolve inside the sandbox, never on the host.
func TestFileAPITraversal(t *testing.T) {
	sb := sdkSandbox(t, corral.CreateOptions{})
	ctx := context.Background()
	root := sb.Files().WithUser("root")
	marker := "corral-escape-" + sb.ID
	if err := root.Write(ctx, "../../../../../../tmp/"+marker, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join("/tmp", marker)); err == nil {
		t.Fatal("a ../ upload reached the host's /tmp")
	}
	if b, err := root.Read(ctx, "/tmp/"+marker); err != nil || string(b) != "x" {
		t.Fatalf("the ../ upload is not inside the sandbox: %q %v", b, err)
	}
	// A symlink to / inside the sandbox is the sandbox's /.
	if _, err := sb.Run(ctx, "ln -s / /tmp/rootlink && ln -s /etc/hostname /tmp/hn", corral.RunOptions{User: "root"}); err != nil {
		t.Fatal(err)
	}
	if err := root.Write(ctx, "/tmp/rootlink/tmp/"+marker+"-2", []byte("y")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join("/tmp", marker+"-2")); err == nil {
		t.Fatal("an upload through a symlink reached the host")
	}
	// The file API acts with the caller's identity: user cannot read
	// root-only files or write into root-owned directories.
	if b, err := sb.Files().Read(ctx, "/etc/shadow"); err == nil {
		t.Fatalf("user read /etc/shadow through the file API: %q", b)
	}
	if err := sb.Files().Write(ctx, "/etc/planted", []byte("x")); err == nil {
		t.Fatal("user wrote into /etc through the file API")
	}
	b, err := root.Read(ctx, "/tmp/hn")
	host, _ := os.ReadFile("/etc/hostname")
	if err != nil || string(b) != "corral\n" || (len(host) > 0 && string(b) == string(host) && string(host) != "corral\n") {
		t.Fatalf("symlink read gave %q (host %q) %v", b, host, err)
	}
}

// TestFileAPIAsUser (threat-model.md #11): the file API acts with the
// caller's identity under every runtime. A file written as user belongs
// to user; user can neither read /etc/shadow nor write into /etc; root's
// identity is back for the next request. Under gVisor, which has no
// setfsuid(2) (ENOSYS), the agent switches the thread's effective ids
// instead: before that every file call as user failed with 500.
func TestFileAPIAsUser(t *testing.T) { eachRuntime(t, testFileAPIAsUser) }

func testFileAPIAsUser(t *testing.T, rt string) {
	sb := sdkSandbox(t, corral.CreateOptions{Runtime: rt})
	ctx := context.Background()
	if err := sb.Files().Write(ctx, "/tmp/mine", []byte("x")); err != nil {
		t.Fatalf("user writes /tmp/mine: %v", err)
	}
	if b, err := sb.Files().Read(ctx, "/tmp/mine"); err != nil || string(b) != "x" {
		t.Fatalf("user reads /tmp/mine back: %q, %v", b, err)
	}
	if r, err := sb.Run(ctx, "stat -c %U:%G /tmp/mine", corral.RunOptions{User: "root"}); err != nil || strings.TrimSpace(r.Stdout) != "user:user" {
		t.Fatalf("owner of a file user wrote: %+v, %v; want user:user", r, err)
	}
	if b, err := sb.Files().Read(ctx, "/etc/shadow"); err == nil {
		t.Fatalf("user read /etc/shadow through the file API: %q", b)
	}
	if err := sb.Files().Write(ctx, "/etc/planted", []byte("x")); err == nil {
		t.Fatal("user wrote into /etc through the file API")
	}
	if b, err := sb.Files().WithUser("root").Read(ctx, "/etc/shadow"); err != nil || !strings.Contains(string(b), "root:") {
		t.Fatalf("root reads /etc/shadow after user's calls: %q, %v", b, err)
	}
	if r, err := sb.Run(ctx, "test -e /etc/planted && echo planted || echo absent", corral.RunOptions{User: "root"}); err != nil || strings.TrimSpace(r.Stdout) != "absent" {
		t.Fatalf("/etc/planted: %+v, %v", r, err)
	}
}
