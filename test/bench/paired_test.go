package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corral "github.com/corralhq/corral/sdk/go"
)

// BenchmarkColdPaired measures, within each iteration, corral's create →
// first exec and the raw baselines of the same rootfs: `runc run` with
// the smallest spec that runs it (minimalSpec, without seccomp: the
// issue's baseline), `runc run` with corral's own spec (the same seccomp
// filter, capabilities, cgroup limits, masks and mounts: what corral
// adds over the runtime with the same security settings), the floor of
// corral's own start (corral's mounts and `runc run --detach` of
// corral's spec with the agent, until its socket accepts: what the
// runtime driver cannot go below) and `docker run --rm` (when Docker can
// run here). It reports PairedCorral, PairedRunc, PairedRuncCorralSpec,
// PairedAgentReady and PairedDocker.
//
// The comparison is made fair three ways, the same for every member:
//   - Each member is timed only after the previous one's teardown is
//     done: its cgroups are gone (pairedSettle), a fixed pause has let
//     the kernel's deferred teardown of its namespaces run, and the
//     host's CPUs were idle for a moment (or a deadline passed; the
//     number of such settles is reported as settle-timeouts).
//   - The members run in a new random order in every iteration
//     (CORRAL_BENCH_SEED fixes the sequence; the seed is logged), so no
//     member always follows the same one (Docker's teardown is the
//     heaviest) or always runs first.
//   - Besides the ratio of the p50s, the p50 of the per-iteration ratios
//     corral/baseline is reported (ratio-p50-*): a member that had a slow
//     iteration is compared with the baselines of that same iteration.
func BenchmarkColdPaired(b *testing.B) {
	c := client(b)
	r := newRawRunc(b)
	bundle := r.bundle(b, "paired-true", minimalSpec(r, "/bin/true"))
	corralBundle := r.bundle(b, "paired-corral-true", r.corralSpec(b, "/bin/true"))
	ready := newAgentReady(b, r)
	var d *dockerd
	docker.once.Do(func() { docker.d, docker.err = launchDocker() })
	if docker.err == nil {
		d = docker.d
	} else {
		b.Logf("without Docker: %v", docker.err)
	}
	ctx := context.Background()
	st := &pairedSettle{}
	since := time.Now()
	ids := map[string]bool{}
	// PairedCorral's two halves: Create's call and the first command.
	call, first := newSamples(b), newSamples(b)
	// PairedAgentReady's `runc run -d` alone, to set beside the runtime
	// phase of PairedCorral's creates.
	readyRunc := newSamples(b)
	type member struct {
		name string
		s    *samples
		run  func()
	}
	members := []*member{
		{name: "PairedCorral", run: func() {
			sb, res, err := timedCreateFirstExec(b, c, corral.CreateOptions{}, pairedSamples["PairedCorral"], call, first)
			ids[sb.ID] = true
			kerr := sb.Kill(ctx)
			st.sandbox = sb.ID
			checkTrue(b, res, err)
			if kerr != nil {
				b.Fatalf("kill: %v", kerr)
			}
		}},
		{name: "PairedRunc", run: func() { timeCmd(b, pairedSamples["PairedRunc"], r.runCmd(bundle)) }},
		{name: "PairedRuncCorralSpec", run: func() { timeCmd(b, pairedSamples["PairedRuncCorralSpec"], r.runCmd(corralBundle)) }},
		{name: "PairedAgentReady", run: func() {
			ready.run(b, pairedSamples["PairedAgentReady"], nil)
			readyRunc.add(ready.call)
		}},
	}
	if d != nil {
		members = append(members, &member{name: "PairedDocker", run: func() { timeCmd(b, pairedSamples["PairedDocker"], d.runCmd()) }})
	}
	pairedSamples = map[string]*samples{}
	for _, m := range members {
		m.s = newSamples(b)
		pairedSamples[m.name] = m.s
	}
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("CORRAL_BENCH_SEED"), 10, 64); err == nil {
		seed = v
	}
	b.Logf("member order: random, seed %d (CORRAL_BENCH_SEED)", seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i < b.N; i++ {
		order := slices.Clone(members)
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, m := range order {
			st.wait(b)
			m.run()
		}
	}
	for _, m := range members {
		m.s.reportAs(m.name)
	}
	readyRunc.reportAs("PairedAgentReadyRunc")
	call.reportAs("PairedCreateCall")
	first.reportAs("PairedFirstCommand")
	reportCreateTrace(b, c, since, ids, "Paired")
	cs := pairedSamples["PairedCorral"].d
	for _, base := range []string{"PairedRunc", "PairedRuncCorralSpec", "PairedAgentReady"} {
		bs := pairedSamples[base].d
		ratios := make([]float64, 0, len(cs))
		for i := range min(len(cs), len(bs)) {
			ratios = append(ratios, float64(cs[i])/float64(bs[i]))
		}
		slices.Sort(ratios)
		if len(ratios) > 0 {
			p50 := ratios[(len(ratios)-1)/2]
			b.ReportMetric(p50, "ratio-p50-"+strings.TrimPrefix(base, "Paired"))
			b.Logf("p50 of the per-iteration ratios PairedCorral/%s: ×%.2f", base, p50)
		}
	}
	b.ReportMetric(float64(st.timeouts), "settle-timeouts")
	b.Logf("settles: %d, of which %d reached the CPU-idle deadline", st.n, st.timeouts)
}

// pairedSamples are BenchmarkColdPaired's samples by member.
var pairedSamples map[string]*samples

// Settling between BenchmarkColdPaired's members.
const (
	// settlePause lets the kernel's deferred teardown of the previous
	// member's namespaces (network namespaces are freed by a work queue,
	// after an RCU grace period) run before the next member is timed.
	settlePause = 100 * time.Millisecond
	// settleIdle is the share of the host's CPU time that must be idle
	// over settleWindow before a member is timed.
	settleIdle = 0.8
	// settleWindow is the window over which idleness is measured
	// (/proc/stat counts in 10 ms ticks per CPU).
	settleWindow = 50 * time.Millisecond
	// settleDeadline bounds the wait for an idle host (on a shared host
	// it may never come): the member is then timed anyway, and counted.
	settleDeadline = time.Second
)

// pairedSettle waits, before each member, until the previous member's
// teardown is done: no cgroup of a benchmark container or sandbox is
// left (corral's sandboxes, the raw runc containers with and without
// corral's spec and Docker's containers all have their cgroups under
// known parents; runc removes a container's when it deletes it, corral's
// Kill when it stops the sandbox, Docker when it removes the container),
// settlePause has passed, and the host's CPUs have been idle for a
// window (or settleDeadline passed).
type pairedSettle struct {
	n, timeouts int
	// sandbox is the last corral sandbox a member made (its cgroup is
	// waited for; other servers' sandboxes on the host are not).
	sandbox string
}

func (p *pairedSettle) wait(b *testing.B) {
	b.Helper()
	p.n++
	deadline := time.Now().Add(30 * time.Second)
	for leftCgroups(p.sandbox) {
		if time.Now().After(deadline) {
			b.Fatal("the previous member's cgroups are still there after 30 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(settlePause)
	deadline = time.Now().Add(settleDeadline)
	for {
		idle, ok := cpuIdleOver(settleWindow)
		if !ok || idle >= settleIdle {
			return
		}
		if time.Now().After(deadline) {
			p.timeouts++
			return
		}
	}
}

// leftCgroups reports whether a cgroup of a benchmark member is still
// there: corral's sandbox (by id, "" for none), a raw runc container's
// (corral's spec: under benchCgroupParent; the minimal spec: named by
// its container id at the top), a Docker container's (the benchmark's
// own daemon's parent).
func leftCgroups(sandbox string) bool {
	root := "/sys/fs/cgroup/pids"
	if _, err := os.Stat(root); err != nil {
		root = "/sys/fs/cgroup" // cgroup v2
	}
	if sandbox != "" {
		if _, err := os.Stat(filepath.Join(root, "corral", sandbox)); err == nil {
			return true
		}
	}
	for _, parent := range []string{benchCgroupParent, "corral-bench-docker"} {
		ents, _ := os.ReadDir(filepath.Join(root, parent))
		for _, e := range ents {
			if e.IsDir() {
				return true
			}
		}
	}
	ents, _ := os.ReadDir(root)
	prefix := fmt.Sprintf("corral-bench-%d-", os.Getpid())
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), prefix) {
			return true
		}
	}
	return false
}

// cpuIdleOver returns the share of all CPUs' time that was idle (idle
// and iowait in /proc/stat) over the next window; ok is false when
// /proc/stat cannot be read.
func cpuIdleOver(window time.Duration) (idle float64, ok bool) {
	i0, t0, ok0 := cpuTimes()
	time.Sleep(window)
	i1, t1, ok1 := cpuTimes()
	if !ok0 || !ok1 || t1 <= t0 {
		return 0, false
	}
	return float64(i1-i0) / float64(t1-t0), true
}

// cpuTimes reads the idle and total jiffies of all CPUs.
func cpuTimes() (idle, total uint64, ok bool) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, 0, false
	}
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		if i == 7 || i == 8 { // guest, guest_nice: already counted in user, nice
			continue
		}
		total += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	return idle, total, true
}
