package integration

import (
	"bufio"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/runtime/oci"
	"github.com/corralhq/corral/internal/server"
	corral "github.com/corralhq/corral/sdk/go"
	"github.com/corralhq/corral/test/testserver"
)

// TestPoolRefillAtClose defends against a warm-pool refill outliving the
// server half-made: a server closed while its pool was refilling
// returned with the refill's runc Start still in flight, which then
// left the sandbox's rootfs mounted under the data dir and a supervisor
// with a container behind (pooled sandboxes are never adopted by the
// next start). The server is closed as soon as a refill has begun; then
// nothing of it may be left on the host: no mount under its data dir,
// no process of the sandbox uid range rooted there, no supervisor for
// its state root.
func TestPoolRefillAtClose(t *testing.T) {
	need(t)
	ts, err := testserver.StartWith("../../cmd/corral", slog.LevelWarn, func(c *server.Config) { c.NoNetwork = true })
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = ts.Close()
		}
	})
	dataDir, stateDir := ts.DataDir, filepath.Join(ts.DataDir, "sandboxes")
	c := corral.New(ts.URL, ts.Key)
	ctx := context.Background()
	if _, err := c.SetPool(ctx, "base", 3, 3, 0); err != nil {
		t.Fatal(err)
	}
	// A refill is under way once a sandbox dir exists; the pass starts
	// three one after another, so one is in flight when the server closes.
	waitFor(t, "a pool refill to begin", time.Minute, func() bool {
		ents, _ := os.ReadDir(stateDir)
		return len(ents) > 0
	})
	closed = true
	if err := ts.Close(); err != nil { // the server, then its scratch dir
		t.Errorf("close: %v", err)
	}
	if ents, _ := os.ReadDir(oci.RuntimeRoot(stateDir, "runc")); len(ents) != 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("runc containers left for %s after close: %v", stateDir, names)
	}
	if m := mountsUnder(t, dataDir); len(m) != 0 {
		t.Errorf("mounts left under %s after close: %v", dataDir, m)
	}
	sock := oci.SupervisorSocket(stateDir)
	if ps := sandboxProcsOf(sock); len(ps) != 0 {
		t.Errorf("sandbox processes of the server's supervisor left after close: %v", ps)
	}
	// An idle supervisor exits by itself: wait for that, generously.
	deadline := time.Now().Add(time.Minute)
	for len(supervisorsOf(sock)) != 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if s := supervisorsOf(sock); len(s) != 0 {
		t.Errorf("supervisors of %s left after close: %v", stateDir, s)
	}
}

// fileUID is the owner of a file (a /proc/PID dir: the process's uid).
func fileUID(fi os.FileInfo) uint32 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Uid
	}
	return 0
}

// mountsUnder lists the mount points under dir (from /proc/self/mountinfo).
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) > 4 && strings.HasPrefix(fs[4], dir) {
			out = append(out, fs[4])
		}
	}
	return out
}

// sandboxProcsOf lists the processes of the sandbox uid range (1<<30
// and up) that descend from a supervisor of sock.
func sandboxProcsOf(sock string) []string {
	sup := map[int]bool{}
	for _, p := range supervisorsOf(sock) {
		n, _ := strconv.Atoi(p)
		sup[n] = true
	}
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fi, err := os.Stat(filepath.Join("/proc", e.Name()))
		if err != nil || fileUID(fi) < 1<<30 {
			continue
		}
		for p := parentOf(pid); p > 1; p = parentOf(p) {
			if sup[p] {
				cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
				out = append(out, e.Name()+" "+strings.ReplaceAll(string(cmd), "\x00", " "))
				break
			}
		}
	}
	return out
}

// parentOf is a process's parent pid (0 when it is gone).
func parentOf(pid int) int {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// supervisorsOf lists the supervisor processes serving sock.
func supervisorsOf(sock string) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00")
		if len(args) >= 4 && args[1] == "supervisor" && args[3] == sock {
			out = append(out, e.Name())
		}
	}
	return out
}
