package supervisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestExitRemovesEmptyStateRoot: the directory a supervisor's socket
// directory is in (a data directory's state root under /run/corral,
// shared with the runtimes' roots) is removed with its empty
// directories when the supervisor exits, and by Prune when no
// supervisor serves it; a root that still holds a sandbox's state (a
// non-empty runtime root) stays, and Prune leaves a root whose
// supervisor serves alone. Without it one empty root per data directory
// ever used accumulated (over a thousand on a test host).
func TestExitRemovesEmptyStateRoot(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	c := &Client{Socket: filepath.Join(root, "supervisor", "supervisor.sock"), Binary: os.Args[0]}
	t.Cleanup(func() { _ = c.CloseWait(0) })
	for _, d := range []string{"runc", "gvisor/sb"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	out, _ := os.Create(filepath.Join(t.TempDir(), "out"))
	defer out.Close()
	// An orphan to reap keeps the supervisor serving (an idle one exits
	// after 300 ms here).
	if _, err := c.Run(context.Background(), []string{"/bin/sh", "-c", "sleep 1000 </dev/null >/dev/null 2>&1 & echo $!"}, out); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(out.Name())
	orphan, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("orphan pid %q", b)
	}
	defer syscall.Kill(orphan, syscall.SIGKILL)
	if err := c.Prune(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "runc")); err != nil {
		t.Fatalf("Prune removed a root while its supervisor serves: %v", err)
	}
	_ = syscall.Kill(orphan, syscall.SIGKILL)
	if err := c.CloseWait(60e9); err != nil {
		t.Fatal(err)
	}
	poll(t, "the supervisor exits", func() bool { return len(pidsServing(c.Socket)) == 0 })
	if _, err := os.Stat(filepath.Join(root, "runc")); !os.IsNotExist(err) {
		t.Fatalf("the empty runtime root is left after the supervisor exited: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "gvisor", "sb")); err != nil {
		t.Fatalf("a sandbox's state was removed: %v", err)
	}
	// No supervisor: Prune removes what is empty, and the root once it is.
	if err := os.MkdirAll(filepath.Join(root, "runc"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := c.Prune(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "runc")); !os.IsNotExist(err) {
		t.Fatalf("Prune left an empty runtime root: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "gvisor", "sb")); err != nil {
		t.Fatalf("Prune removed a sandbox's state: %v", err)
	}
	if err := os.RemoveAll(filepath.Join(root, "gvisor")); err != nil {
		t.Fatal(err)
	}
	if err := c.Prune(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Fatalf("Prune left an empty state root: %v", err)
	}
	// A supervisor starts again in the pruned place.
	if code, err := c.Run(context.Background(), []string{"/bin/true"}, out); err != nil || code != 0 {
		t.Fatalf("run after Prune: %d, %v", code, err)
	}
}

// TestSupervisorOOMScoreAdj: the supervisor runs with a negative
// oom_score_adj (OOMScoreAdj), so that under memory pressure the OOM
// killer picks a sandbox's processes before the one process that reaps
// them all.
func TestSupervisorOOMScoreAdj(t *testing.T) {
	if !hasCap(24) { // CAP_SYS_RESOURCE
		t.Skip("lowering oom_score_adj needs CAP_SYS_RESOURCE, which this process lacks")
	}
	c := newClient(t)
	out, _ := os.Create(filepath.Join(t.TempDir(), "out"))
	defer out.Close()
	if _, err := c.Run(context.Background(), []string{"/bin/true"}, out); err != nil {
		t.Fatal(err)
	}
	sup := pidsServing(c.Socket)
	if len(sup) != 1 {
		t.Fatalf("supervisors serving %s: %v", c.Socket, sup)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", sup[0]))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(b)); got != strconv.Itoa(OOMScoreAdj) {
		t.Fatalf("supervisor oom_score_adj = %s, want %d", got, OOMScoreAdj)
	}
}

// hasCap reports whether this process has capability bit n in its
// effective set.
func hasCap(n uint) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<n) != 0
		}
	}
	return false
}
