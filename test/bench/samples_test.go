package bench

import (
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/test/bench/results"
)

// meta describes a latency benchmark in the results: its label, the
// benchmark of the same run it is compared with, and its table group.
type meta struct {
	label, baseline, group string
	// also are further baselines whose ratios are printed too.
	also []string
}

// metas are the latency benchmarks by name (without "Benchmark").
var metas = map[string]meta{
	"CreateFirstExec":               {"corral create → first exec (runc)", "RawRuncRun", "cold", []string{"RawRuncRunCorralSpec"}},
	"RawRuncRun":                    {"raw `runc run` of /bin/true, same rootfs (overlay of the template, same uid shift)", "", "cold", nil},
	"RawRuncRunCorralSpec":          {"raw `runc run` of /bin/true with corral's own spec (seccomp, caps, cgroup limits, masks)", "RawRuncRun", "cold", nil},
	"RawRuncRunCorralSpecNoSeccomp": {"raw `runc run` of /bin/true with corral's spec without seccomp", "RawRuncRunCorralSpec", "cold", nil},
	"RawRuncRunCorralSpecNoLimits":  {"raw `runc run` of /bin/true with corral's spec without cgroup limits", "RawRuncRunCorralSpec", "cold", nil},
	"PairedCorral":                  {"paired: corral create → first exec (runc)", "PairedRunc", "paired", []string{"PairedRuncCorralSpec", "PairedAgentReady"}},
	"PairedRunc":                    {"paired: raw `runc run` of /bin/true, same rootfs", "", "paired", nil},
	"PairedRuncCorralSpec":          {"paired: raw `runc run` of /bin/true, same rootfs, corral's own spec (same seccomp, caps, cgroup limits, masks, mounts)", "PairedRunc", "paired", nil},
	"PairedAgentReady":              {"paired: corral's mounts + raw `runc run -d` of corral's spec with the agent, until its socket accepts (the floor of corral's start)", "PairedRunc", "paired", nil},
	"PairedCreateServerSide":        {"paired: corral create, server side (create_ms of PairedCorral's sandbox.created events)", "PairedCorral", "paired", nil},
	"PairedCreateCall":              {"paired: PairedCorral's Create call alone (HTTP request to response)", "PairedCorral", "paired", nil},
	"PairedFirstCommand":            {"paired: PairedCorral's first command alone (after Create returned)", "PairedCorral", "paired", nil},
	"PairedAgentReadyRunc":          {"paired: PairedAgentReady's `runc run -d` alone (compare the runtime phase of PairedCorral's creates)", "PairedAgentReady", "paired", nil},
	"PairedDocker":                  {"paired: `docker run --rm --network none` of /bin/true, same rootfs", "PairedRunc", "paired", nil},
	"DockerRun":                     {"`docker run --rm --network none` of /bin/true, same rootfs (`docker import`)", "RawRuncRun", "cold", nil},
	"CreateFirstExecNetwork":        {"corral create → first exec, egress network (veth, nftables, proxy)", "CreateFirstExec", "cold", nil},
	"CreateFirstExecSnapshot":       {"corral create → first exec from a snapshot", "CreateFirstExec", "cold", nil},
	"CreateFirstExecVolume":         {"corral create → first exec with a volume", "CreateFirstExec", "cold", nil},
	"GVisorCreateFirstExec":         {"corral create → first exec (gVisor)", "CreateFirstExec", "cold", nil},
	"CreateFirstExecPooled":         {"corral create → first exec from a warm pool", "CreateFirstExec", "warm", nil},
	"ExecRoundTrip":                 {"corral exec round trip of `true` (runc)", "RawRuncExec", "exec", nil},
	"RawRuncExec":                   {"raw `runc exec` of /bin/true", "", "exec", nil},
	"Kill":                          {"corral kill of an idle sandbox (runc)", "", "kill", nil},
	"BreakdownMounts":               {"breakdown: corral's mounts alone (disk tmpfs, run tmpfs, overlay)", "CreateFirstExec", "breakdown", nil},
	"BreakdownRuncCreate":           {"breakdown: `runc create`, corral's spec", "CreateFirstExec", "breakdown", nil},
	"BreakdownRuncStart":            {"breakdown: `runc start`, corral's spec", "CreateFirstExec", "breakdown", nil},
	"BreakdownRuncDelete":           {"breakdown: `runc delete` after exit, corral's spec", "CreateFirstExec", "breakdown", nil},
	"BreakdownRuncRunDetached":      {"breakdown: `runc run --detach`, corral's spec (create and start in one runc process), same iterations", "CreateFirstExec", "breakdown", nil},
	"BreakdownAgentReady":           {"breakdown: mounts + `runc run -d` of the agent, corral's spec, until its socket accepts", "CreateFirstExec", "breakdown", nil},
	"CreateCall":                    {"breakdown: corral create → first exec, the SDK's Create call alone (HTTP request to response)", "CreateFirstExec", "breakdown", nil},
	"CreateFirstCommand":            {"breakdown: corral create → first exec, the first command alone (after Create returned)", "CreateFirstExec", "breakdown", nil},
	"SupervisorCostDirect":          {"supervisor: mounts + `runc run -d` of the agent (corral's spec) until its socket accepts, runc run by the benchmark", "", "breakdown", nil},
	"SupervisorCostSupervised":      {"supervisor: the same, runc run under a supervisor (as corral's driver runs it), same iterations", "SupervisorCostDirect", "breakdown", nil},
	"SupervisorCostDirectRunc":      {"supervisor: `runc run -d` alone, run by the benchmark", "", "breakdown", nil},
	"SupervisorCostSupervisedCall":  {"supervisor: `runc run -d` alone under the supervisor (the client's whole call)", "SupervisorCostDirectRunc", "breakdown", nil},
	"SupervisorCostSupervisedRan":   {"supervisor: `runc run -d` under the supervisor, its life as the supervisor saw it", "SupervisorCostDirectRunc", "breakdown", nil},
	"CreateSecondCommand":           {"breakdown: a second command in the same new sandbox, right after the first (not part of the create → first exec time)", "CreateFirstExec", "breakdown", nil},
	"AgentABAReady":                 {"agent A/B: this checkout's agent, start (mounts, `runc run -d`, corral's spec) until its socket accepts", "", "breakdown", nil},
	"AgentABBReady":                 {"agent A/B: agent B (CORRAL_BENCH_AGENT_B), the same, same iterations", "AgentABAReady", "breakdown", nil},
	"AgentABAFirst":                 {"agent A/B: this checkout's agent, first command (`/bin/true` through Process.Start)", "", "breakdown", nil},
	"AgentABBFirst":                 {"agent A/B: agent B, first command", "AgentABAFirst", "breakdown", nil},
	"AgentABASecond":                {"agent A/B: this checkout's agent, second command", "", "breakdown", nil},
	"AgentABBSecond":                {"agent A/B: agent B, second command", "AgentABASecond", "breakdown", nil},
	"CreateServerSide":              {"breakdown: corral create, server side (create_ms of the sandbox.created event: admission → started)", "CreateFirstExec", "breakdown", nil},
	"VolumeCreateDelete":            {"volume create + delete (1 GiB, mkfs.ext4, loop)", "", "other", nil},
}

// store holds what the benchmarks measured, for the results file.
var store struct {
	sync.Mutex
	order   []string
	latency map[string]results.Latency
	skipped map[string]string
	burst   *results.Burst
	density *results.Density
}

func benchName(b *testing.B) string { return strings.TrimPrefix(b.Name(), "Benchmark") }

// skip records why b does not run and skips it.
func skip(b *testing.B, reason string) {
	b.Helper()
	store.Lock()
	if store.skipped == nil {
		store.skipped = map[string]string{}
	}
	store.skipped[benchName(b)] = reason
	store.Unlock()
	b.Skip(reason)
}

// collect copies the measurements into r.
func collect(r *results.Run) {
	store.Lock()
	defer store.Unlock()
	for _, name := range store.order {
		r.Benchmarks = append(r.Benchmarks, store.latency[name])
	}
	for name, reason := range store.skipped {
		if _, ran := store.latency[name]; !ran {
			r.Skipped = append(r.Skipped, results.Skip{Name: name, Reason: reason})
		}
	}
	slices.SortFunc(r.Skipped, func(a, b results.Skip) int { return strings.Compare(a.Name, b.Name) })
	r.Burst, r.Density = store.burst, store.density
}

// samples records the wall time of each iteration's timed section.
type samples struct {
	b  *testing.B
	d  []time.Duration
	t0 time.Time
}

// newSamples stops b's timer: only the sections between start and stop
// count.
func newSamples(b *testing.B) *samples {
	b.StopTimer()
	b.ResetTimer()
	return &samples{b: b, d: make([]time.Duration, 0, b.N)}
}

func (s *samples) start() {
	s.b.StartTimer()
	s.t0 = time.Now()
}

func (s *samples) stop() {
	s.add(time.Since(s.t0))
	s.b.StopTimer()
}

// add records one sample measured by the caller.
func (s *samples) add(d time.Duration) { s.d = append(s.d, d) }

// report reports p50 and p95 in milliseconds (instead of ns/op) and keeps
// the percentiles for the results. Benchmarks run one after another; the
// last run of each (the one with the requested b.N) is the one kept.
func (s *samples) report() { s.reportAs(benchName(s.b)) }

// reportAs is report under another name (a benchmark measuring several
// phases reports one result per phase).
func (s *samples) reportAs(name string) {
	sorted := slices.Sorted(slices.Values(s.d))
	if len(sorted) == 0 {
		return
	}
	var sum time.Duration
	for _, d := range sorted {
		sum += d
	}
	m := metas[name]
	if phase, ok := strings.CutPrefix(name, "CreatePhase/"); ok {
		m = meta{label: "breakdown: create phase `" + phase + "` (server's trace, phases_ms of sandbox.created)", baseline: "CreateFirstExec", group: "breakdown"}
	}
	if phase, ok := strings.CutPrefix(name, "PairedCreatePhase/"); ok {
		m = meta{label: "paired: create phase `" + phase + "` (server's trace of PairedCorral's creates)", baseline: "PairedCorral", group: "paired"}
	}
	if v, ok := strings.CutPrefix(name, "SeccompCost/"); ok {
		for _, sv := range seccompVariants {
			if sv.name == v {
				m = meta{label: "seccomp: raw `runc run` of /bin/true, corral's spec, " + sv.label, baseline: "SeccompCost/None", group: "seccomp"}
			}
		}
	}
	if m.label == "" {
		m = meta{label: name, group: "other"}
	}
	l := results.Latency{
		Name: name, Label: m.label, Baseline: m.baseline, Also: m.also, Group: m.group, N: len(sorted),
		P50: ms(percentile(sorted, 50)), P95: ms(percentile(sorted, 95)), P99: ms(percentile(sorted, 99)),
		Mean: ms(sum / time.Duration(len(sorted))), Min: ms(sorted[0]), Max: ms(sorted[len(sorted)-1]),
	}
	suffix := ""
	if name != benchName(s.b) {
		suffix = "-" + strings.TrimPrefix(strings.TrimPrefix(name, "Breakdown"), "Paired")
	}
	s.b.ReportMetric(0, "ns/op")
	s.b.ReportMetric(l.P50, "p50-ms"+suffix)
	s.b.ReportMetric(l.P95, "p95-ms"+suffix)
	store.Lock()
	defer store.Unlock()
	if store.latency == nil {
		store.latency = map[string]results.Latency{}
	}
	if _, ok := store.latency[name]; !ok {
		store.order = append(store.order, name)
	}
	store.latency[name] = l
}

// percentile returns the nearest-rank p-th percentile of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
