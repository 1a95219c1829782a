package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/cgroups"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/runtime/drivertest"
	"golang.org/x/sys/unix"
)

// helperEnv, when set, makes the test binary start one sandbox (the
// JSON helperArgs in it) with a driver of its own and exit, leaving the
// sandbox running: a control plane that started a sandbox and died.
const helperEnv = "CORRAL_OCI_TEST_START"

type helperArgs struct {
	Opts   Options
	Config runtime.Config
}

func startHelper() int {
	var a helperArgs
	if err := json.Unmarshal([]byte(os.Getenv(helperEnv)), &a); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	d, err := New(a.Opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := d.Start(context.Background(), a.Config); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestNoZombies: no host process of a sandbox is left behind, not even
// as a zombie, whether the sandbox is stopped, dies from inside (its
// init killed by root in the sandbox), or dies after the control plane
// that started it exited; and the driver learns of the death without a
// process per sandbox. The test process is a child subreaper that never
// reaps what is not its own child (TestMain), as a host init that does
// not reap: a runtime's orphan that corral's supervisor did not take and
// reap (runc's container init, gVisor's sandbox, gofer and stub
// processes, whose parents may die first) would stay here as a zombie.
// It defends the density change that removed the resident shim per
// sandbox: the supervisor must reap everything the shim reaped, also
// across a control-plane restart.
func TestNoZombies(t *testing.T) {
	for _, rt := range []runtime.Runtime{runtime.Runc, runtime.GVisor} {
		t.Run(string(rt), func(t *testing.T) {
			env := conformanceEnv(t, rt)
			s, opts := env.setupOpts(t, rt)
			d := s.Driver

			// Stopped, with processes the agent does not wait for.
			cfg := drivertest.Config(t, s)
			startSandbox(t, d, cfg)
			mustSh(t, d, cfg, "", "setsid sleep 100000 </dev/null >/dev/null 2>&1 & echo ok")
			mustSh(t, d, cfg, "root", "nohup sh -c 'trap \"\" TERM; while :; do sleep 1; done' </dev/null >/dev/null 2>&1 & echo ok")
			procs := sandboxProcs(t, cfg.ID)
			if err := d.Stop(context.Background(), cfg.ID, 500*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			assertReaped(t, "stopped sandbox", procs)
			assertNoLeftovers(t, s, cfg.ID)

			// Killed from inside.
			cfg = drivertest.Config(t, s)
			startSandbox(t, d, cfg)
			killFromInside(t, s, d, cfg)

			// With no sandbox left, the supervisor this process started
			// exits (and is reaped by it).
			waitUntil(t, "the idle supervisor exits", func() bool { return len(supervisorPids(opts.StateDir)) == 0 })

			// Started by a control plane that exited since (with the
			// supervisor it started); this instance never started it.
			cfg = drivertest.Config(t, s)
			arg, err := json.Marshal(helperArgs{Opts: opts, Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			helper := exec.Command(os.Args[0], "-test.run=^$")
			helper.Env = append(os.Environ(), helperEnv+"="+string(arg))
			if out, err := helper.CombinedOutput(); err != nil {
				t.Fatalf("start in a helper process: %v: %s", err, out)
			}
			t.Cleanup(func() { _ = d.Stop(context.Background(), cfg.ID, 0) })
			nd := s.Restart(t)
			if !nd.Alive(cfg.ID) {
				t.Fatal("a sandbox started by a control plane that exited is not alive")
			}
			killFromInside(t, s, nd, cfg)

			// The supervisor lost the process that started it (the
			// helper): it stays, for the next control plane, rather than
			// leave its own zombie. It is reparented here; end and reap it.
			sup := supervisorPids(opts.StateDir)
			if len(sup) != 1 {
				t.Fatalf("supervisors of the state dir: %v, want one", sup)
			}
			if err := syscall.Kill(sup[0], syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			var ws unix.WaitStatus
			if _, err := unix.Wait4(sup[0], &ws, 0, nil); err != nil {
				t.Fatalf("reap the supervisor: %v", err)
			}
			if z := zombiesOf(os.Getpid()); len(z) > 0 {
				t.Fatalf("zombies left to the host's init: %v", z)
			}
		})
	}
}

func startSandbox(t *testing.T, d runtime.Driver, cfg runtime.Config) {
	t.Helper()
	if _, err := d.Start(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(context.Background(), cfg.ID, 0) })
}

func mustSh(t *testing.T, d runtime.Driver, cfg runtime.Config, user, script string) string {
	t.Helper()
	out, err := drivertest.Sh(d, cfg.ID, cfg.AccessToken, user, script)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// killFromInside kills the sandbox's init as root in the sandbox, waits
// for the driver to see it dead, checks that every host process the
// sandbox had is gone (reaped) before any Stop, and stops it.
func killFromInside(t *testing.T, s drivertest.Setup, d runtime.Driver, cfg runtime.Config) {
	t.Helper()
	mustSh(t, d, cfg, "", "setsid sleep 100000 </dev/null >/dev/null 2>&1 & echo ok")
	procs := sandboxProcs(t, cfg.ID)
	// The call dies with the agent; its result does not matter.
	_, _ = drivertest.Sh(d, cfg.ID, cfg.AccessToken, "root", "kill -KILL -1; kill -TERM 1")
	waitUntil(t, "the driver sees the sandbox dead", func() bool { return !d.Alive(cfg.ID) })
	assertReaped(t, "sandbox killed from inside", procs)
	if err := d.Stop(context.Background(), cfg.ID, 0); err != nil {
		t.Fatal(err)
	}
	assertNoLeftovers(t, s, cfg.ID)
}

func assertNoLeftovers(t *testing.T, s drivertest.Setup, id string) {
	t.Helper()
	if left := s.Leftovers(id); len(left) > 0 {
		t.Fatalf("after Stop, the host holds of %s: %v", id, left)
	}
}

// proc is one host process, told apart from a later one of the same pid
// by its start time.
type proc struct {
	pid   int
	start string
}

// sandboxProcs lists the host processes in the sandbox's cgroup.
func sandboxProcs(t *testing.T, id string) []proc {
	t.Helper()
	pids, err := cgroups.Open(CgroupParent + "/" + id).Procs()
	if err != nil || len(pids) == 0 {
		t.Fatalf("processes of %s: %v %v", id, pids, err)
	}
	var out []proc
	for _, pid := range pids {
		if st, ok := startTime(pid); ok {
			out = append(out, proc{pid, st})
		}
	}
	return out
}

// startTime is field 22 of /proc/PID/stat; ok is false if pid is gone
// (reaped: a zombie still has it).
func startTime(pid int) (string, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", false
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 20 {
		return "", false
	}
	return f[19], true
}

// assertReaped waits until none of procs is in the process table any
// more (neither running nor a zombie).
func assertReaped(t *testing.T, what string, procs []proc) {
	t.Helper()
	var left []string
	waitUntil(t, what+": every host process reaped", func() bool {
		left = left[:0]
		for _, p := range procs {
			if st, ok := startTime(p.pid); ok && st == p.start {
				left = append(left, describe(p.pid))
			}
		}
		return len(left) == 0
	}, func() string { return strings.Join(left, "; ") })
}

// describe is a process's pid, state, parent and command.
func describe(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return fmt.Sprintf("%s [%s]", strings.TrimSpace(string(b)), strings.ReplaceAll(string(cmd), "\x00", " "))
}

// zombiesOf lists the zombies whose parent is ppid.
func zombiesOf(ppid int) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 1 && f[0] == "Z" && f[1] == strconv.Itoa(ppid) {
			out = append(out, describe(pid))
		}
	}
	return out
}

// supervisorPids lists the supervisor processes serving stateDir.
func supervisorPids(stateDir string) []int {
	sock := SupervisorSocket(stateDir)
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00")
		if len(args) >= 4 && args[1] == "supervisor" && args[3] == sock {
			out = append(out, pid)
		}
	}
	return out
}

// waitUntil polls cond for up to two minutes (a bound against hangs on a
// busy host, not a measurement); last, if given, says what was seen.
func waitUntil(t *testing.T, what string, cond func() bool, last ...func() string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			msg := ""
			if len(last) > 0 {
				msg = ": " + last[0]()
			}
			t.Fatalf("%s: not so after 2 minutes%s", what, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
