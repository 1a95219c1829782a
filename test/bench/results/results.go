// Package results is the file format of a benchmark run of test/bench
// (one JSON file per run, so runs can be compared) and its rendering as
// the Markdown tables of docs/performance.md and the README. The
// benchmarks write it; `go run ./test/bench/report FILE` renders it.
package results

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Schema is the version of the file format; a reader refuses others.
const Schema = 1

// Run is one run of the benchmarks.
type Run struct {
	Schema   int       `json:"schema"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// Commit is the git commit of the checkout (with "-dirty" when the
	// tree had uncommitted changes), "" when git could not tell.
	Commit   string            `json:"commit"`
	Machine  Machine           `json:"machine"`
	Settings map[string]string `json:"settings,omitempty"`
	// Benchmarks are the latency benchmarks in the order they ran.
	Benchmarks []Latency `json:"benchmarks"`
	// Skipped names the benchmarks that did not run and why.
	Skipped []Skip   `json:"skipped,omitempty"`
	Burst   *Burst   `json:"burst,omitempty"`
	Density *Density `json:"density,omitempty"`
}

// Machine describes the host the run measured.
type Machine struct {
	Kernel      string  `json:"kernel"`
	CPUs        int     `json:"cpus"`
	CPUModel    string  `json:"cpu_model,omitempty"`
	MemTotalMiB float64 `json:"mem_total_mib"`
	Cgroup      string  `json:"cgroup"` // "v1 (hybrid)" or "v2"
	Go          string  `json:"go"`
	Runc        string  `json:"runc,omitempty"`
	Runsc       string  `json:"runsc,omitempty"`
	Docker      string  `json:"docker,omitempty"`
	LoadBefore  string  `json:"load_before,omitempty"` // /proc/loadavg 1, 5, 15 min
	LoadAfter   string  `json:"load_after,omitempty"`
}

// Latency is one latency benchmark: the wall time of each iteration's
// timed section, in milliseconds.
type Latency struct {
	Name  string  `json:"name"`  // Go benchmark name without "Benchmark"
	Label string  `json:"label"` // what it measures, for the table
	N     int     `json:"n"`
	P50   float64 `json:"p50_ms"`
	P95   float64 `json:"p95_ms"`
	P99   float64 `json:"p99_ms"`
	Mean  float64 `json:"mean_ms"`
	Min   float64 `json:"min_ms"`
	Max   float64 `json:"max_ms"`
	// Baseline names the benchmark of the same run this one is compared
	// with (its ratio is printed), "" for none.
	Baseline string `json:"baseline,omitempty"`
	// Also names further baselines of the same run whose ratios are
	// printed after Baseline's (corral against raw runc with corral's
	// own spec beside the baseline, say).
	Also []string `json:"also_baselines,omitempty"`
	// Group orders the table: "paired", "cold", "warm", "exec", "kill",
	// "breakdown", "seccomp", "other".
	Group string `json:"group"`
}

// Skip is a benchmark that did not run.
type Skip struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Burst is a burst of concurrent creates followed by as many parallel
// kills, with a probe of the control plane meanwhile.
type Burst struct {
	Sandboxes      int     `json:"sandboxes"`
	CreateP50      float64 `json:"create_p50_ms"`
	CreateP95      float64 `json:"create_p95_ms"`
	CreateWallMS   float64 `json:"create_wall_ms"`
	CreatesPerSec  float64 `json:"creates_per_s"`
	KillP50        float64 `json:"kill_p50_ms"`
	KillP95        float64 `json:"kill_p95_ms"`
	KillWallMS     float64 `json:"kill_wall_ms"`
	HealthzN       int     `json:"healthz_n"`
	HealthzP50     float64 `json:"healthz_p50_ms"`
	HealthzP99     float64 `json:"healthz_p99_ms"`
	HealthzMax     float64 `json:"healthz_max_ms"`
	ListN          int     `json:"list_n"`
	ListP50        float64 `json:"list_p50_ms"`
	ListP99        float64 `json:"list_p99_ms"`
	ListMax        float64 `json:"list_max_ms"`
	ProbeErrors    int     `json:"probe_errors"`
	ProbeIntervalM float64 `json:"probe_interval_ms"`
}

// Density is the host memory of N idle sandboxes.
type Density struct {
	Sandboxes int `json:"sandboxes"`
	// MemAvailable* are /proc/meminfo's MemAvailable before the creates
	// and with all sandboxes idle, in MiB.
	MemAvailableBeforeMiB float64 `json:"mem_available_before_mib"`
	MemAvailableAfterMiB  float64 `json:"mem_available_after_mib"`
	// PerSandboxMemAvailableMiB is (before-after)/Sandboxes: everything a
	// sandbox costs the host, kernel objects and page cache included (and
	// anything else the host did meanwhile).
	PerSandboxMemAvailableMiB float64 `json:"per_sandbox_mem_available_mib"`
	// MemAvailableAfterKillMiB is MemAvailable once the sandboxes were
	// killed, and PerSandboxMemAvailableKillMiB (afterKill-after)/N: the
	// same cost seen from the other side (both readings are noisy on a
	// busy host; the two together show how much).
	MemAvailableAfterKillMiB      float64 `json:"mem_available_after_kill_mib"`
	PerSandboxMemAvailableKillMiB float64 `json:"per_sandbox_mem_available_kill_mib"`
	// PerSandboxCgroupMiB is the mean memory charged to the sandbox's
	// memory cgroup (v1 memory.usage_in_bytes, v2 memory.current: its
	// processes' memory, its tmpfs and page cache, kernel memory charged
	// to it).
	PerSandboxCgroupMiB float64 `json:"per_sandbox_cgroup_mib"`
	// PerSandboxPSSMiB is the mean over sandboxes of the summed PSS of
	// every host process of the sandbox (its cgroup's processes and any
	// process whose command line names its id).
	PerSandboxPSSMiB float64 `json:"per_sandbox_pss_mib"`
	// ProcessesPerSandbox is the mean number of such processes.
	ProcessesPerSandbox float64 `json:"processes_per_sandbox"`
	// ByProcess is the mean PSS per sandbox by kind of process (argv[0]'s
	// base name and its first argument).
	ByProcess []ProcessPSS `json:"by_process"`
	// ControlPlanePSSMiB is the PSS of the benchmark process (the
	// in-process control plane) with all sandboxes idle.
	ControlPlanePSSMiB float64 `json:"control_plane_pss_mib"`
	CreateWallMS       float64 `json:"create_wall_ms"`
}

// ProcessPSS is the mean PSS per sandbox of one kind of process.
type ProcessPSS struct {
	Kind          string  `json:"kind"`
	PerSandboxMiB float64 `json:"per_sandbox_mib"`
	Count         float64 `json:"count_per_sandbox"`
}

// Write writes r as indented JSON to path, creating its directory.
func (r *Run) Write(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("results dir: %w", err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}

// Read reads a results file.
func Read(path string) (*Run, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Run
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if r.Schema != Schema {
		return nil, fmt.Errorf("%s: results schema %d, this reader knows %d", path, r.Schema, Schema)
	}
	return &r, nil
}

// Latest returns the newest *.json file in dir by name (the names are
// UTC timestamps).
func Latest(dir string) (string, error) {
	m, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return "", err
	}
	if len(m) == 0 {
		return "", fmt.Errorf("no results (*.json) in %s: run make bench first", dir)
	}
	slices.Sort(m)
	return m[len(m)-1], nil
}

// find returns the latency benchmark named name.
func (r *Run) find(name string) (Latency, bool) {
	for _, l := range r.Benchmarks {
		if l.Name == name {
			return l, true
		}
	}
	return Latency{}, false
}

var groupOrder = []string{"paired", "cold", "warm", "exec", "kill", "breakdown", "seccomp", "other"}

// Markdown writes the run as Markdown: the machine, the latency table
// (with each benchmark's ratio to its baseline of the same run), the
// burst and the density.
func (r *Run) Markdown(w io.Writer) {
	m := r.Machine
	fmt.Fprintf(w, "Measured %s at commit `%s` on %d CPUs (%s), %.1f GiB, kernel %s, cgroup %s; runc %s",
		r.Started.UTC().Format("2006-01-02 15:04 UTC"), r.Commit, m.CPUs, orNA(m.CPUModel), m.MemTotalMiB/1024, m.Kernel, m.Cgroup, orNA(m.Runc))
	if m.Runsc != "" {
		fmt.Fprintf(w, ", runsc %s", m.Runsc)
	}
	if m.Docker != "" {
		fmt.Fprintf(w, ", Docker %s", m.Docker)
	}
	fmt.Fprintf(w, "; %s; load average %s before, %s after", m.Go, orNA(m.LoadBefore), orNA(m.LoadAfter))
	if len(r.Settings) > 0 {
		keys := make([]string, 0, len(r.Settings))
		for k := range r.Settings {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, k+"="+r.Settings[k])
		}
		fmt.Fprintf(w, "; settings %s", strings.Join(parts, ", "))
	}
	fmt.Fprintln(w, ".")
	if len(r.Benchmarks) > 0 || len(r.Skipped) > 0 {
		r.latencyTable(w)
	}
	if b := r.Burst; b != nil {
		fmt.Fprintln(w)
		fmt.Fprintf(w, "Burst of %d concurrent creates, then %d parallel kills; a probe calls the control plane every %.0f ms meanwhile:\n\n",
			b.Sandboxes, b.Sandboxes, b.ProbeIntervalM)
		fmt.Fprintln(w, "| | p50 ms | p95 ms | p99 ms | max ms | wall ms | throughput |")
		fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|")
		fmt.Fprintf(w, "| create (each) | %.1f | %.1f | | | %.0f | %.1f creates/s |\n", b.CreateP50, b.CreateP95, b.CreateWallMS, b.CreatesPerSec)
		fmt.Fprintf(w, "| kill (each) | %.1f | %.1f | | | %.0f | %.1f kills/s |\n", b.KillP50, b.KillP95, b.KillWallMS, perSec(b.Sandboxes, b.KillWallMS))
		fmt.Fprintf(w, "| probe `GET /healthz` (n=%d) | %.1f | | %.1f | %.1f | | |\n", b.HealthzN, b.HealthzP50, b.HealthzP99, b.HealthzMax)
		fmt.Fprintf(w, "| probe `GET /v1/sandboxes` (n=%d) | %.1f | | %.1f | %.1f | | |\n", b.ListN, b.ListP50, b.ListP99, b.ListMax)
		if b.ProbeErrors > 0 {
			fmt.Fprintf(w, "\nThe probe got %d errors.\n", b.ProbeErrors)
		}
	}
	if d := r.Density; d != nil {
		fmt.Fprintln(w)
		fmt.Fprintf(w, "Density: %d idle sandboxes (created in %.1f s).\n\n", d.Sandboxes, d.CreateWallMS/1000)
		fmt.Fprintln(w, "| host memory per idle sandbox | MiB |")
		fmt.Fprintln(w, "|---|--:|")
		fmt.Fprintf(w, "| MemAvailable drop / N (%.0f → %.0f MiB) | %.2f |\n", d.MemAvailableBeforeMiB, d.MemAvailableAfterMiB, d.PerSandboxMemAvailableMiB)
		fmt.Fprintf(w, "| MemAvailable regained after killing them / N (→ %.0f MiB) | %.2f |\n", d.MemAvailableAfterKillMiB, d.PerSandboxMemAvailableKillMiB)
		fmt.Fprintf(w, "| memory charged to the sandbox's memory cgroup | %.2f |\n", d.PerSandboxCgroupMiB)
		fmt.Fprintf(w, "| PSS of the sandbox's host processes (%.1f per sandbox) | %.2f |\n", d.ProcessesPerSandbox, d.PerSandboxPSSMiB)
		for _, p := range d.ByProcess {
			fmt.Fprintf(w, "| … `%s` (%.1f per sandbox) | %.2f |\n", p.Kind, p.Count, p.PerSandboxMiB)
		}
		fmt.Fprintf(w, "| control plane PSS, all %d idle (total, not per sandbox) | %.1f |\n", d.Sandboxes, d.ControlPlanePSSMiB)
	}
}

// latencyTable writes the table of the latency benchmarks, grouped, with
// each one's ratio to its baseline.
func (r *Run) latencyTable(w io.Writer) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| benchmark | n | p50 ms | p95 ms | p99 ms | p50 ratio | p95 ratio |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|")
	bs := slices.Clone(r.Benchmarks)
	slices.SortStableFunc(bs, func(a, b Latency) int {
		return slices.Index(groupOrder, a.Group) - slices.Index(groupOrder, b.Group)
	})
	for _, l := range bs {
		var r50, r95 []string
		for _, name := range append([]string{l.Baseline}, l.Also...) {
			if base, ok := r.find(name); ok && base.P50 > 0 && base.P95 > 0 {
				r50 = append(r50, fmt.Sprintf("×%.2f vs %s", l.P50/base.P50, base.Name))
				r95 = append(r95, fmt.Sprintf("×%.2f", l.P95/base.P95))
			}
		}
		fmt.Fprintf(w, "| %s | %d | %.1f | %.1f | %.1f | %s | %s |\n", l.Label, l.N, l.P50, l.P95, l.P99, strings.Join(r50, "; "), strings.Join(r95, "; "))
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "| %s | skipped: %s | | | | | |\n", s.Name, s.Reason)
	}
}

func perSec(n int, wallMS float64) float64 {
	if wallMS <= 0 {
		return 0
	}
	return float64(n) / (wallMS / 1000)
}

func orNA(s string) string {
	if s == "" {
		return "n/a"
	}
	return s
}
