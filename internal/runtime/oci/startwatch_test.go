package oci

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/containerd/go-runc"
	"github.com/corralhq/corral/internal/cgroups"
	"github.com/corralhq/corral/internal/runtime"
)

// TestStartWatchesOwnInit: after `runc run --detach` the sandbox's init
// runs at once and may already have exited, been reaped and had its pid
// reused by the time the driver reads the pid file. The driver keeps a
// pidfd watch of that pid only while the pid is a process of the
// sandbox's own cgroup (or the runtime reports it as its running init):
// a pid file naming a host process outside the sandbox is refused, so
// that the sandbox is never reported alive by a host process's pidfd (and
// a dead sandbox never looks running); a process of the sandbox's cgroup
// is watched, and its exit is seen.
func TestStartWatchesOwnInit(t *testing.T) {
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("needs runc")
	}
	d := &Driver{opts: Options{StateDir: t.TempDir()}, runc: &runc.Runc{Command: "runc", Root: t.TempDir()}}
	id := "latency-startwatch-" + strconv.Itoa(os.Getpid())
	if err := os.Mkdir(d.dir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := runtime.Config{ID: id, Runtime: runtime.Runc}
	start := func() *exec.Cmd {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		if err := os.WriteFile(filepath.Join(d.dir(id), pidFileName), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	host := start() // a host process: not in the sandbox's cgroup, unknown to runc
	if w, err := d.watchStarted(context.Background(), d.runc, cfg, host.Process.Pid, nil); !errors.Is(err, errInitExited) {
		t.Fatalf("watchStarted of a host process = %v, %v; want errInitExited", w, err)
	}
	if os.Geteuid() != 0 {
		t.Skip("the accepted case needs root (a cgroup of the sandbox)")
	}
	g := cgroups.Open(d.cgroupPath(id))
	dir := filepath.Join(cgroups.Root, d.cgroupPath(id))
	if !cgroups.Unified() {
		dir = filepath.Join(cgroups.Root, "pids", d.cgroupPath(id))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range g.Dirs() {
			_ = os.Remove(p)
		}
	})
	inside := start()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(inside.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := d.watchStarted(context.Background(), d.runc, cfg, inside.Process.Pid, nil)
	if err != nil {
		t.Fatalf("watchStarted of a process of the sandbox's cgroup: %v", err)
	}
	if w.exited() {
		t.Fatal("the watch reports a running init as exited")
	}
	_ = inside.Process.Kill()
	_ = inside.Wait()
	select {
	case <-w.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the watch did not see the init exit")
	}
}
