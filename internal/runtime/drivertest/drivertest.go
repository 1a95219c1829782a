// Package drivertest is the conformance suite of runtime.Driver: one
// exported test function, Run, that every driver must pass (runc and runsc
// through runtime/oci today, a Kubernetes driver next), as containerd runs
// one suite against every snapshotter.
//
// The suite drives real sandboxes from the base template and talks to
// their agents through Driver.Dial with the real Connect clients. It
// checks outcomes, never durations: every wait is a poll with a generous
// deadline. What it covers:
//
//   - start and dial: Start returns once the agent answers; the default
//     user, root, the environment and the access token behave as
//     configured; List and Alive see the sandbox; a second Start of the
//     same id fails and leaves the first sandbox running;
//   - limits applied and visible: RLIMIT_NOFILE inside, the disk cap
//     (ENOSPC, and Stats.DiskBytes within it), the task limit (fork fails),
//     the CPU quota (CPU time used stays within quota times wall time) and
//     memory (Stats.MemoryBytes within the limit);
//   - total stop: after Stop of a running or a paused sandbox with
//     processes detached from the agent, nothing is left (the driver's
//     Leftovers probe is empty), Alive is false, List omits it, Dial fails,
//     and a second Stop is not an error;
//   - OOM: a memory hog is killed at the limit and Stats.OOMKills says so,
//     also when the whole sandbox died of it (until Stop);
//   - pause and resume: a busy loop's CPU time stops while paused (the
//     sandbox still counts as alive) and advances again after Resume;
//   - pause under throttling: a sandbox held at a small CPU quota by
//     busy loops pauses and resumes, round after round;
//   - adoption: a new driver instance over the same state (a control-plane
//     restart) lists, dials, stats, resumes and stops the sandboxes the
//     old one started, running and paused;
//   - an OOM kill of an adopted sandbox is reported like one of a sandbox
//     the instance started (once the new instance has read its Stats, as
//     a control plane's watchdog does every second);
//   - snapshot: the writable layer (a new file and a deleted template file)
//     copied while running and while paused, leaving the sandbox as it
//     was, and usable as Config.Layers of a new sandbox; an existing
//     destination is refused and left alone;
//   - unknown sandboxes: Stats, Dial, Pause, Resume, NetNS, Processes and Snapshot of an id
//     the driver does not hold fail with an error wrapping
//     runtime.ErrNotFound; Stop of it is not an error.
package drivertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/proto/process"
)

// Setup is what a driver gives the suite: the driver under test and the
// host-side means to check it.
type Setup struct {
	// Driver is the driver under test, over a state of its own.
	Driver runtime.Driver
	// Runtime is put in every Config the suite starts.
	Runtime runtime.Runtime
	// RootFS is the base template's root file system, owned by the uid
	// range the driver maps sandbox root to.
	RootFS string
	// Restart returns a new instance of the driver over the same state
	// (what a control plane gets after a restart); the suite stops using
	// the old one.
	Restart func(t *testing.T) runtime.Driver
	// Leftovers lists what the host still holds of sandbox id, whatever
	// the driver put there: processes, mounts, cgroups, runtime state,
	// files. After Stop it must be empty. Each entry is a human-readable
	// description ("mount /x/y", "pid 123 (runsc-gofer)").
	Leftovers func(id string) []string
	// Remote, when set, says why the driver's sandboxes run off this host
	// (a Kubernetes Pod on a node): Handle.Pid is 0, Stats carry no
	// cgroup readings, and Pause, Resume, NetNS, Processes and Snapshot
	// of a running sandbox fail wrapping runtime.ErrUnsupported, leaving
	// it running (subtest Unsupported checks that). The subtests that
	// measure a host cgroup or freeze one (Limits, OOM, AdoptOOM,
	// PauseResume, Snapshot) are skipped with this reason; Adopt adopts a
	// running sandbox only.
	Remote string
}

// Deadlines of the suite's polls: generous bounds against hangs on a busy
// host, not measurements.
const (
	waitLong  = 2 * time.Minute
	pollEvery = 100 * time.Millisecond
)

// Run runs the conformance suite against the driver newSetup makes. Each
// subtest calls newSetup for a fresh driver and state; the setup registers
// its own cleanup with t.
func Run(t *testing.T, newSetup func(t *testing.T) Setup) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s Setup)
	}{
		{"StartDial", testStartDial},
		{"Limits", testLimits},
		{"StopTotal", testStopTotal},
		{"OOM", testOOM},
		{"PauseResume", testPauseResume},
		{"PauseThrottled", testPauseThrottled},
		{"Adopt", testAdopt},
		{"AdoptOOM", testAdoptOOM},
		{"Snapshot", testSnapshot},
		{"Unknown", testUnknown},
		{"Unsupported", testUnsupported},
	}
	hostOnly := map[string]bool{"Limits": true, "OOM": true, "AdoptOOM": true, "PauseResume": true, "PauseThrottled": true, "Snapshot": true}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetup(t)
			if s.Remote != "" && hostOnly[tc.name] {
				t.Skipf("sandboxes run off this host: %s", s.Remote)
			}
			tc.fn(t, s)
		})
	}
}

// baseResources are the limits of a sandbox whose test is not about them.
var baseResources = runtime.Resources{CPU: 1, MemoryBytes: 512 << 20, DiskBytes: 256 << 20, Pids: 256, Nofile: 1024}

// newID returns a fresh sandbox id.
func newID(t *testing.T) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "dt" + hex.EncodeToString(b)
}

// config returns a Config for the setup's template and runtime.
func config(t *testing.T, s Setup, res runtime.Resources) runtime.Config {
	return runtime.Config{
		ID: newID(t), Runtime: s.Runtime, RootFS: s.RootFS, Resources: res,
		Env: map[string]string{"CONFORMANCE": "yes"}, DefaultUser: "user",
		AccessToken: newID(t) + newID(t), // 28 characters: a real token is 48 and agents on TCP refuse short ones
	}
}

// start starts cfg with d and stops it when the test ends (a no-op for a
// sandbox the test stopped). It returns a client of the sandbox's agent.
func start(t *testing.T, d runtime.Driver, cfg runtime.Config) (*runtime.Handle, *agent) {
	t.Helper()
	h, err := d.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start %s: %v", cfg.ID, err)
	}
	t.Cleanup(func() { _ = d.Stop(context.Background(), cfg.ID, 0) })
	return h, newAgent(d, cfg.ID, cfg.AccessToken)
}

// stop stops id and checks that nothing of it is left.
func stop(t *testing.T, s Setup, d runtime.Driver, id string, grace time.Duration) {
	t.Helper()
	if err := d.Stop(context.Background(), id, grace); err != nil {
		t.Fatalf("stop %s: %v", id, err)
	}
	assertGone(t, s, d, id)
}

// assertGone checks that the host holds nothing of id and the driver no
// longer sees it.
func assertGone(t *testing.T, s Setup, d runtime.Driver, id string) {
	t.Helper()
	if left := s.Leftovers(id); len(left) > 0 {
		t.Errorf("after Stop, the host still holds of %s:\n  %s", id, strings.Join(left, "\n  "))
	}
	if d.Alive(id) {
		t.Errorf("after Stop, Alive(%s) is true", id)
	}
	ids, err := d.List(context.Background())
	if err != nil {
		t.Errorf("list: %v", err)
	}
	if slices.Contains(ids, id) {
		t.Errorf("after Stop, List still has %s: %v", id, ids)
	}
	if c, err := d.Dial(context.Background(), id); err == nil {
		c.Close()
		t.Errorf("after Stop, Dial(%s) connected", id)
	}
}

// poll calls cond until it reports done or waitLong passes; then the test
// fails with what cond last said.
func poll(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for {
		done, last := cond()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not so after %s: %s", what, waitLong, last)
		}
		time.Sleep(pollEvery)
	}
}

// cpu returns the sandbox's CPU seconds.
func cpu(t *testing.T, d runtime.Driver, id string) float64 {
	t.Helper()
	st, err := d.Stats(id)
	if err != nil {
		t.Fatalf("stats %s: %v", id, err)
	}
	return st.CPUSeconds
}

// busy starts a busy loop in the sandbox, detached from the agent's call.
func busy(t *testing.T, a *agent) {
	t.Helper()
	a.must(t, "", "nohup sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 & echo started")
}

// assertAdvancing waits until the sandbox's CPU time grows by a clear
// margin: its busy loop runs.
func assertAdvancing(t *testing.T, d runtime.Driver, id, what string) {
	t.Helper()
	from := cpu(t, d, id)
	poll(t, what+": CPU time advances", func() (bool, string) {
		now := cpu(t, d, id)
		return now-from >= 0.3, fmt.Sprintf("%.3f s -> %.3f s", from, now)
	})
}

// frozenWindow is how long a paused sandbox is watched, and frozenSlack
// the CPU time it may use meanwhile: a busy loop that ran would use the
// whole window (times its quota, here 1 core).
const (
	frozenWindow = 2 * time.Second
	frozenSlack  = 0.1
)

// assertFrozen checks that a paused sandbox with a busy loop uses no CPU
// time (beyond frozenSlack) over frozenWindow.
func assertFrozen(t *testing.T, d runtime.Driver, id, what string) {
	t.Helper()
	if !d.Alive(id) {
		t.Fatalf("%s: a paused sandbox is not alive", what)
	}
	from := cpu(t, d, id)
	time.Sleep(frozenWindow)
	used := cpu(t, d, id) - from
	if used > frozenSlack {
		t.Fatalf("%s: a paused sandbox used %.3f s of CPU in %s (busy loop not frozen)", what, used, frozenWindow)
	}
	t.Logf("%s: %.3f s of CPU in %s while paused", what, used, frozenWindow)
}

// testPauseThrottled: a sandbox whose busy loops hold it at a small CPU
// quota (its tasks throttled most of each period) pauses, stays alive,
// resumes and runs commands again, round after round. It defends against
// a pause that fails on a loaded host: runc's cgroup v1 freeze gives up
// ("unable to freeze") after a few hundred milliseconds of FREEZING,
// thawing and refreezing on the way, while a throttled task reaches the
// freezer only once its quota refills (TestConformance/runc/Snapshot
// failed so on a busy host).
func testPauseThrottled(t *testing.T, s Setup) {
	if s.Runtime == runtime.GVisor {
		// runsc pauses in its own kernel and the host freeze after it
		// waits (freezeGVisor); a gVisor sandbox at this quota only
		// takes long to boot.
		t.Skip("gVisor's host freeze waits for throttled tasks itself")
	}
	d := s.Driver
	res := baseResources
	res.CPU = 0.05
	cfg := config(t, s, res)
	_, a := start(t, d, cfg)
	a.must(t, "", "for i in 1 2 3 4; do nohup sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 & done; echo started")
	ctx := context.Background()
	for round := 1; round <= 3; round++ {
		if err := d.Pause(ctx, cfg.ID); err != nil {
			t.Fatalf("round %d: pause of a throttled sandbox: %v", round, err)
		}
		if !d.Alive(cfg.ID) {
			t.Fatalf("round %d: a paused sandbox is not alive", round)
		}
		if err := d.Resume(ctx, cfg.ID); err != nil {
			t.Fatalf("round %d: resume of a throttled sandbox: %v", round, err)
		}
	}
	if got := a.must(t, "", "echo resumed"); got != "resumed" {
		t.Fatalf("after the pauses: %q", got)
	}
	stop(t, s, d, cfg.ID, 0)
}

func testStartDial(t *testing.T, s Setup) {
	d := s.Driver
	cfg := config(t, s, baseResources)
	h, a := start(t, d, cfg)
	if h.ID != cfg.ID || (h.Pid <= 0 && s.Remote == "") {
		t.Fatalf("handle %+v for %s", h, cfg.ID)
	}
	if got := a.must(t, "", "id -un; id -u"); got != "user\n1000" {
		t.Fatalf("default user: %q, want user 1000", got)
	}
	if got := a.must(t, "root", "id -u"); got != "0" {
		t.Fatalf("root: id -u %q", got)
	}
	if got := a.must(t, "", `echo "$CONFORMANCE"`); got != "yes" {
		t.Fatalf("Config.Env: CONFORMANCE=%q", got)
	}
	// The access token is required: a call without it is refused.
	if _, err := newAgent(d, cfg.ID, "").pc.List(context.Background(), connect.NewRequest(&process.ListRequest{})); connectCode(err) != "unauthenticated" {
		t.Fatalf("call without the access token: %v; want unauthenticated", err)
	}
	if !d.Alive(cfg.ID) {
		t.Fatal("Alive is false for a running sandbox")
	}
	ids, err := d.List(context.Background())
	if err != nil || !slices.Contains(ids, cfg.ID) {
		t.Fatalf("List = %v, %v; want it to hold %s", ids, err, cfg.ID)
	}
	st, err := d.Stats(cfg.ID)
	if err != nil || (s.Remote == "" && (st.Pids <= 0 || st.MemoryBytes <= 0)) {
		t.Fatalf("stats of a running sandbox: %+v, %v", st, err)
	}
	// A second Start of the same id fails and leaves the first running.
	if _, err := d.Start(context.Background(), cfg); err == nil {
		t.Fatal("a second Start of a running sandbox's id succeeded")
	}
	if got := a.must(t, "", "echo still"); got != "still" {
		t.Fatalf("after a refused second Start: %q", got)
	}
	// A refused config starts nothing and leaves nothing.
	bad := config(t, s, baseResources)
	bad.ID = "Not/An-ID"
	if _, err := d.Start(context.Background(), bad); err == nil {
		t.Fatalf("Start accepted id %q", bad.ID)
	}
	stop(t, s, d, cfg.ID, time.Second)
}

func testLimits(t *testing.T, s Setup) {
	d := s.Driver
	res := runtime.Resources{CPU: 0.5, MemoryBytes: 256 << 20, DiskBytes: 64 << 20, Pids: 64, Nofile: 512}
	cfg := config(t, s, res)
	_, a := start(t, d, cfg)

	if got := a.must(t, "", "ulimit -n"); got != strconv.FormatInt(res.Nofile, 10) {
		t.Errorf("RLIMIT_NOFILE inside: %s, want %d", got, res.Nofile)
	}

	// Disk: writing past the cap fails with ENOSPC; Stats sees the bytes.
	fill := a.run(context.Background(), "", "dd if=/dev/zero of=$HOME/fill bs=1M count=128 2>&1; echo rc=$?")
	if !strings.Contains(fill.Stdout, "No space left on device") || strings.Contains(fill.Stdout, "rc=0") {
		t.Errorf("writing 128 MiB into a 64 MiB sandbox: %s", fill)
	}
	st, err := d.Stats(cfg.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.DiskBytes < 32<<20 || st.DiskBytes > res.DiskBytes+(4<<20) {
		t.Errorf("Stats.DiskBytes with the disk full: %d, want about %d", st.DiskBytes, res.DiskBytes)
	}
	a.must(t, "", "rm -f $HOME/fill")

	// Tasks: forking stops short of the limit.
	fork := a.must(t, "", `python3 -c '
import os, signal
kids = []
err = "none"
try:
    for i in range(400):
        p = os.fork()
        if p == 0:
            signal.pause()
            os._exit(0)
        kids.append(p)
except OSError as e:
    err = "refused"
for p in kids:
    os.kill(p, 9)
for p in kids:
    os.waitpid(p, 0)
print(len(kids), err)
'`)
	var n int
	var how string
	if _, err := fmt.Sscan(fork, &n, &how); err != nil || how != "refused" || int64(n) >= res.Pids {
		t.Errorf("forking 400 children with a %d-task limit: %q; want refused below the limit", res.Pids, fork)
	}

	// Memory: what the sandbox holds stays within its limit.
	if st, err := d.Stats(cfg.ID); err != nil || st.MemoryBytes > res.MemoryBytes {
		t.Errorf("Stats.MemoryBytes %d (%v) over the %d limit", st.MemoryBytes, err, res.MemoryBytes)
	}

	// CPU: two busy loops for a few seconds use at most the quota's share
	// of the wall time (an upper bound: a busy host only lowers it).
	before, err := d.Stats(cfg.ID)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	a.must(t, "", "timeout 3 sh -c 'while :; do :; done' & timeout 3 sh -c 'while :; do :; done' & wait; echo done")
	after, err := d.Stats(cfg.ID)
	if err != nil {
		t.Fatal(err)
	}
	wall := time.Since(t0).Seconds()
	used := after.CPUSeconds - before.CPUSeconds
	if used <= 0 {
		t.Errorf("two busy loops used no CPU time (%.3f s -> %.3f s)", before.CPUSeconds, after.CPUSeconds)
	}
	if limit := res.CPU*wall*1.25 + 0.25; used > limit {
		t.Errorf("two busy loops used %.2f s of CPU in %.2f s with a %.1f-core quota (at most %.2f s)", used, wall, res.CPU, limit)
	}
	stop(t, s, d, cfg.ID, time.Second)
}

func testStopTotal(t *testing.T, s Setup) {
	d := s.Driver
	for _, paused := range []bool{false, true} {
		t.Run(map[bool]string{false: "running", true: "paused"}[paused], func(t *testing.T) {
			if paused && s.Remote != "" {
				t.Skipf("no pause off this host: %s", s.Remote)
			}
			cfg := config(t, s, baseResources)
			h, a := start(t, d, cfg)
			// Processes the agent does not wait for: a new session as the
			// user, a root daemon ignoring SIGTERM, files in the layer.
			a.must(t, "", "setsid sleep 100000 </dev/null >/dev/null 2>&1 & echo x > $HOME/file; echo ok")
			a.must(t, "root", "nohup sh -c 'trap \"\" TERM; while :; do sleep 1; done' </dev/null >/dev/null 2>&1 & echo ok")
			if paused {
				if err := d.Pause(context.Background(), cfg.ID); err != nil {
					t.Fatal(err)
				}
			}
			if left := s.Leftovers(cfg.ID); len(left) == 0 {
				t.Fatalf("Leftovers of running sandbox %s (init pid %d) is empty: the probe sees nothing", cfg.ID, h.Pid)
			}
			stop(t, s, d, cfg.ID, 500*time.Millisecond)
			if err := d.Stop(context.Background(), cfg.ID, time.Second); err != nil {
				t.Errorf("second Stop: %v", err)
			}
		})
	}
}

func testOOM(t *testing.T, s Setup) {
	d := s.Driver
	res := baseResources
	res.MemoryBytes = 64 << 20
	cfg := config(t, s, res)
	_, a := start(t, d, cfg)
	checkOOM(t, s, d, cfg, a)
}

// testAdoptOOM: a control plane restarted while a sandbox runs must still
// learn that the sandbox's memory limit killed it, or it records the
// death as an error.
func testAdoptOOM(t *testing.T, s Setup) {
	res := baseResources
	res.MemoryBytes = 64 << 20
	cfg := config(t, s, res)
	start(t, s.Driver, cfg)
	d := s.Restart(t)
	t.Cleanup(func() { _ = d.Stop(context.Background(), cfg.ID, 0) })
	checkOOM(t, s, d, cfg, newAgent(d, cfg.ID, cfg.AccessToken))
}

// checkOOM runs a memory hog in cfg's sandbox (64 MiB limit), checks that
// d reports the kill, and stops the sandbox.
func checkOOM(t *testing.T, s Setup, d runtime.Driver, cfg runtime.Config, a *agent) {
	t.Helper()
	before, err := d.Stats(cfg.ID)
	if err != nil {
		t.Fatal(err)
	}
	if before.OOMKills != 0 {
		t.Fatalf("a fresh sandbox reports %d OOM kills", before.OOMKills)
	}
	hog := a.run(context.Background(), "", "exec python3 -c 'a=[]\nwhile True: a.append(bytearray(1<<20))'")
	if hog.End != nil && hog.End.GetExited() {
		t.Fatalf("a memory hog under a 64 MiB limit exited on its own: %s", hog)
	}
	poll(t, "Stats.OOMKills after a memory hog", func() (bool, string) {
		st, err := d.Stats(cfg.ID)
		return err == nil && st.OOMKills > 0, fmt.Sprintf("%+v, %v", st, err)
	})
	// Either the kernel killed the hog and the sandbox goes on, or it
	// killed the sandbox itself (gVisor: one host process holds the whole
	// sandbox's memory); which one may take a moment to show.
	lived := false
	poll(t, "after an OOM kill, the sandbox answers or is dead", func() (bool, string) {
		if !d.Alive(cfg.ID) {
			return true, ""
		}
		res := a.run(context.Background(), "", "echo alive")
		lived = res.exitOK() && strings.TrimSpace(res.Stdout) == "alive"
		return lived, res.String()
	})
	if lived {
		t.Logf("the OOM killed the hog (%s); the sandbox lives", hog)
	} else {
		// The reason stays readable until Stop.
		st, err := d.Stats(cfg.ID)
		if err != nil || st.OOMKills == 0 {
			t.Fatalf("stats of a sandbox the OOM killed: %+v, %v; want OOMKills > 0", st, err)
		}
		t.Logf("the OOM killed the sandbox (%s)", hog)
	}
	stop(t, s, d, cfg.ID, time.Second)
}

func testPauseResume(t *testing.T, s Setup) {
	d := s.Driver
	cfg := config(t, s, baseResources)
	_, a := start(t, d, cfg)
	busy(t, a)
	assertAdvancing(t, d, cfg.ID, "before Pause")
	if err := d.Pause(context.Background(), cfg.ID); err != nil {
		t.Fatal(err)
	}
	assertFrozen(t, d, cfg.ID, "after Pause")
	if err := d.Resume(context.Background(), cfg.ID); err != nil {
		t.Fatal(err)
	}
	assertAdvancing(t, d, cfg.ID, "after Resume")
	if got := a.must(t, "", "echo thawed"); got != "thawed" {
		t.Fatalf("after Resume: %q", got)
	}
	stop(t, s, d, cfg.ID, time.Second)
}

func testAdopt(t *testing.T, s Setup) {
	old := s.Driver
	running, paused := config(t, s, baseResources), config(t, s, baseResources)
	_, a := start(t, old, running)
	a.must(t, "", "echo kept > $HOME/kept")
	adopted := []string{running.ID}
	if s.Remote == "" {
		_, pa := start(t, old, paused)
		busy(t, pa)
		if err := old.Pause(context.Background(), paused.ID); err != nil {
			t.Fatal(err)
		}
		adopted = append(adopted, paused.ID)
	}

	d := s.Restart(t)
	t.Cleanup(func() {
		_ = d.Stop(context.Background(), running.ID, 0)
		_ = d.Stop(context.Background(), paused.ID, 0)
	})
	ids, err := d.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range adopted {
		if !slices.Contains(ids, id) {
			t.Fatalf("after a restart, List = %v lacks %s", ids, id)
		}
		if !d.Alive(id) {
			t.Fatalf("after a restart, Alive(%s) is false", id)
		}
	}
	na := newAgent(d, running.ID, running.AccessToken)
	if got := na.must(t, "", "cat $HOME/kept"); got != "kept" {
		t.Fatalf("adopted sandbox: %q", got)
	}
	if _, err := d.Stats(running.ID); err != nil {
		t.Fatalf("stats of an adopted sandbox: %v", err)
	}
	if s.Remote != "" {
		stop(t, s, d, running.ID, time.Second)
		return
	}
	assertFrozen(t, d, paused.ID, "adopted paused sandbox")
	if err := d.Resume(context.Background(), paused.ID); err != nil {
		t.Fatalf("resume an adopted paused sandbox: %v", err)
	}
	assertAdvancing(t, d, paused.ID, "adopted sandbox after Resume")
	if got := newAgent(d, paused.ID, paused.AccessToken).must(t, "", "echo thawed"); got != "thawed" {
		t.Fatalf("adopted sandbox after Resume: %q", got)
	}
	stop(t, s, d, running.ID, time.Second)
	stop(t, s, d, paused.ID, time.Second)
}

func testSnapshot(t *testing.T, s Setup) {
	d := s.Driver
	cfg := config(t, s, baseResources)
	_, a := start(t, d, cfg)
	a.must(t, "", "echo hi > $HOME/snap.txt")
	a.must(t, "root", "test -e /etc/issue && rm /etc/issue && echo removed")
	layers := t.TempDir()
	if err := os.Chmod(layers, 0o711); err != nil {
		t.Fatal(err)
	}

	// Of a running sandbox: it is running again afterwards.
	dst := filepath.Join(layers, "running")
	n, err := d.Snapshot(context.Background(), cfg.ID, dst)
	if err != nil {
		t.Fatalf("snapshot of a running sandbox: %v", err)
	}
	if n < 3 {
		t.Fatalf("snapshot copied %d bytes, want at least the 3 of snap.txt", n)
	}
	if got := a.must(t, "", "echo running"); got != "running" {
		t.Fatalf("after a snapshot: %q", got)
	}
	// An existing destination is refused and left as it was.
	if _, err := d.Snapshot(context.Background(), cfg.ID, dst); err == nil {
		t.Fatal("a snapshot over an existing destination succeeded")
	}
	if _, err := os.Stat(dst); err != nil {
		t.Fatalf("a refused snapshot removed the existing destination: %v", err)
	}

	// Of a paused sandbox: it stays paused.
	busy(t, a)
	if err := d.Pause(context.Background(), cfg.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Snapshot(context.Background(), cfg.ID, filepath.Join(layers, "paused")); err != nil {
		t.Fatalf("snapshot of a paused sandbox: %v", err)
	}
	assertFrozen(t, d, cfg.ID, "after a snapshot of a paused sandbox")
	stop(t, s, d, cfg.ID, 0)

	// The layer is a Config.Layers entry of a new sandbox: the file is
	// there, the deleted template file is not.
	for _, layer := range []string{"running", "paused"} {
		next := config(t, s, baseResources)
		next.Layers = []string{filepath.Join(layers, layer)}
		_, na := start(t, d, next)
		if got := na.must(t, "", "cat $HOME/snap.txt; test -e /etc/issue && echo present || echo absent"); got != "hi\nabsent" {
			t.Fatalf("sandbox on the %s snapshot: %q, want hi and /etc/issue absent", layer, got)
		}
		stop(t, s, d, next.ID, 0)
	}
}

func testUnknown(t *testing.T, s Setup) {
	d := s.Driver
	ctx := context.Background()
	id := newID(t)
	calls := map[string]func() error{
		"Stats":     func() error { _, err := d.Stats(id); return err },
		"Dial":      func() error { c, err := d.Dial(ctx, id); closeConn(c); return err },
		"Pause":     func() error { return d.Pause(ctx, id) },
		"Resume":    func() error { return d.Resume(ctx, id) },
		"NetNS":     func() error { _, err := d.NetNS(ctx, id); return err },
		"Processes": func() error { _, err := d.Processes(id); return err },
		"Snapshot": func() error {
			_, err := d.Snapshot(ctx, id, filepath.Join(t.TempDir(), "layer"))
			return err
		},
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("%s of an unknown sandbox: %v, want an error wrapping runtime.ErrNotFound", name, err)
		}
	}
	if d.Alive(id) {
		t.Error("Alive of an unknown sandbox is true")
	}
	if err := d.Stop(ctx, id, 0); err != nil {
		t.Errorf("Stop of an unknown sandbox: %v", err)
	}
	if left := s.Leftovers(id); len(left) > 0 {
		t.Errorf("calls on an unknown sandbox left: %v", left)
	}
}

// testUnsupported: a driver whose sandboxes run off this host refuses
// what its platform does not offer with runtime.ErrUnsupported (so the
// API can say so) and the sandbox goes on; a host driver has nothing to
// refuse.
func testUnsupported(t *testing.T, s Setup) {
	if s.Remote == "" {
		t.Skip("a host driver offers every operation")
	}
	d := s.Driver
	cfg := config(t, s, baseResources)
	_, a := start(t, d, cfg)
	ctx := context.Background()
	calls := map[string]func() error{
		"Pause":     func() error { return d.Pause(ctx, cfg.ID) },
		"Resume":    func() error { return d.Resume(ctx, cfg.ID) },
		"NetNS":     func() error { _, err := d.NetNS(ctx, cfg.ID); return err },
		"Processes": func() error { _, err := d.Processes(cfg.ID); return err },
		"Snapshot": func() error {
			_, err := d.Snapshot(ctx, cfg.ID, filepath.Join(t.TempDir(), "layer"))
			return err
		},
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, runtime.ErrUnsupported) {
			t.Errorf("%s of a running remote sandbox: %v, want an error wrapping runtime.ErrUnsupported", name, err)
		}
	}
	if got := a.must(t, "", "echo still"); got != "still" {
		t.Fatalf("after the refused calls: %q", got)
	}
	stop(t, s, d, cfg.ID, time.Second)
}
