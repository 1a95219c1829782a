package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corral "github.com/corralhq/corral/sdk/go"
	"github.com/corralhq/corral/test/bench/results"
)

// densityParallel is how many creates of BenchmarkDensity run at once.
const densityParallel = 8

// densitySettle is how long BenchmarkDensity waits, before each
// MemAvailable reading, for the host to settle.
const densitySettle = 5 * time.Second

// BenchmarkDensity starts CORRAL_BENCH_DENSITY (default 50) idle sandboxes
// of the base template and measures the host memory each costs: the drop
// of MemAvailable from before the creates to all of them idle, divided by
// their number (kernel objects and page cache included, and whatever else
// the host did meanwhile), and the PSS (/proc/PID/smaps_rollup) of every
// host process of each sandbox. A sandbox's processes are found without
// assuming a process model: every process in a cgroup whose path names
// the sandbox's id, and every process whose command line names it (a
// shim, a runtime, a supervisor, the agent, anything the sandbox runs). It
// runs once per process whatever b.N.
func BenchmarkDensity(b *testing.B) {
	c := client(b)
	if r := store.density; r != nil {
		reportDensity(b, r)
		return
	}
	b.StopTimer()
	ctx := context.Background()
	n := densityN
	if reason := keyQuotaShort(n); reason != "" {
		skip(b, reason)
	}
	runtime.GC()
	time.Sleep(densitySettle)
	before := meminfoKiB("MemAvailable")
	ids := make([]string, n)
	errs := make([]error, n)
	sem := make(chan struct{}, densityParallel)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			sb, err := c.Create(ctx, corral.CreateOptions{Timeout: 30 * time.Minute})
			if err == nil {
				ids[i] = sb.ID
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	createWall := time.Since(t0)
	b.Cleanup(func() { killAll(c, ids) })
	for _, err := range errs {
		if err != nil {
			b.Fatalf("create %d idle sandboxes: %v", n, err)
		}
	}
	runtime.GC()
	time.Sleep(densitySettle)
	after := meminfoKiB("MemAvailable")
	procs := sandboxProcesses(ids)
	r := &results.Density{
		Sandboxes:             n,
		MemAvailableBeforeMiB: float64(before) / 1024, MemAvailableAfterMiB: float64(after) / 1024,
		PerSandboxMemAvailableMiB: float64(before-after) / 1024 / float64(n),
		ControlPlanePSSMiB:        float64(pssKiB(os.Getpid())) / 1024,
		CreateWallMS:              ms(createWall),
	}
	kinds := map[string]*results.ProcessPSS{}
	var total, count float64
	for _, ps := range procs {
		for _, p := range ps {
			mib := float64(p.pssKiB) / 1024
			total += mib
			count++
			k := kinds[p.kind]
			if k == nil {
				k = &results.ProcessPSS{Kind: p.kind}
				kinds[p.kind] = k
			}
			k.PerSandboxMiB += mib / float64(n)
			k.Count += 1 / float64(n)
		}
	}
	r.PerSandboxPSSMiB, r.ProcessesPerSandbox = total/float64(n), count/float64(n)
	var cgKiB int64
	for _, ps := range procs {
		seen := map[string]bool{}
		for _, p := range ps {
			if p.memCgroup != "" && !seen[p.memCgroup] {
				seen[p.memCgroup] = true
				cgKiB += cgroupMemoryKiB(p.memCgroup)
			}
		}
	}
	r.PerSandboxCgroupMiB = float64(cgKiB) / 1024 / float64(n)
	killAll(c, ids)
	clear(ids) // killed: nothing left for the cleanup
	runtime.GC()
	time.Sleep(densitySettle)
	killed := meminfoKiB("MemAvailable")
	r.MemAvailableAfterKillMiB = float64(killed) / 1024
	r.PerSandboxMemAvailableKillMiB = float64(killed-after) / 1024 / float64(n)
	for _, k := range kinds {
		r.ByProcess = append(r.ByProcess, *k)
	}
	slices.SortFunc(r.ByProcess, func(a, b results.ProcessPSS) int { return strings.Compare(a.Kind, b.Kind) })
	store.Lock()
	store.density = r
	store.Unlock()
	reportDensity(b, r)
}

func reportDensity(b *testing.B, r *results.Density) {
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(r.PerSandboxMemAvailableMiB, "memavail-MiB/sandbox")
	b.ReportMetric(r.PerSandboxPSSMiB, "pss-MiB/sandbox")
	b.ReportMetric(r.ProcessesPerSandbox, "procs/sandbox")
}

// killAll kills the sandboxes ids (8 at a time).
func killAll(c *corral.Client, ids []string) {
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, id := range ids {
		if id == "" {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			_, _ = c.Kill(context.Background(), id)
		}()
	}
	wg.Wait()
}

// hostProc is a host process of a sandbox.
type hostProc struct {
	pid    int
	kind   string // argv[0]'s base name and its first subcommand
	pssKiB int64
	// memCgroup is the process's memory cgroup (v1 memory controller or
	// the v2 unified path) when its path names the sandbox, else "".
	memCgroup string
}

// memoryCgroup returns the memory cgroup path in a /proc/PID/cgroup text
// if it names id: "N:memory:/corral/ID" (v1) or "0::/…ID…" (v2).
func memoryCgroup(cgroup, id string) string {
	for _, line := range strings.Split(cgroup, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.Contains(parts[2], id) {
			continue
		}
		if slices.Contains(strings.Split(parts[1], ","), "memory") {
			return filepath.Join("/sys/fs/cgroup/memory", parts[2])
		}
		if parts[0] == "0" && parts[1] == "" {
			if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
				return filepath.Join("/sys/fs/cgroup", parts[2])
			}
		}
	}
	return ""
}

// cgroupMemoryKiB returns a memory cgroup's charged memory (v1
// memory.usage_in_bytes, v2 memory.current), or 0.
func cgroupMemoryKiB(dir string) int64 {
	for _, f := range []string{"memory.usage_in_bytes", "memory.current"} {
		if b, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
			n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			return n / 1024
		}
	}
	return 0
}

// sandboxProcesses returns the host processes of each sandbox by id:
// those whose cgroup path or command line names the id.
func sandboxProcesses(ids []string) map[string][]hostProc {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	out := map[string][]hostProc{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cg, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		id := findID(want, string(cg), string(cmd))
		if id == "" {
			continue
		}
		out[id] = append(out[id], hostProc{pid: pid, kind: processKind(cmd), pssKiB: pssKiB(pid), memCgroup: memoryCgroup(string(cg), id)})
	}
	return out
}

// idToken splits cgroup paths and command lines into candidate ids.
var idToken = regexp.MustCompile(`[a-z0-9][a-z0-9-]*`)

// findID returns the first id of want named in any of texts, or "".
func findID(want map[string]bool, texts ...string) string {
	for _, t := range texts {
		for _, tok := range idToken.FindAllString(t, -1) {
			if want[tok] {
				return tok
			}
		}
	}
	return ""
}

// subcommand is a word that names what a process is (a subcommand like
// "shim", "run", "agent"), not a flag or a path.
var subcommand = regexp.MustCompile(`^[a-z][a-z-]*$`)

// processKind names a process by argv[0]'s base name and its first
// subcommand-like argument ("corral shim", "runc run", "agent agent").
func processKind(cmdline []byte) string {
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if len(args) == 0 || args[0] == "" {
		return "(kernel thread)"
	}
	kind := filepath.Base(args[0])
	for _, a := range args[1:] {
		if subcommand.MatchString(a) {
			return kind + " " + a
		}
	}
	return kind
}

// pssKiB returns the PSS of process pid from smaps_rollup, or 0.
func pssKiB(pid int) int64 {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "smaps_rollup"))
	if err != nil {
		return 0
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if f := strings.Fields(string(line)); len(f) >= 2 && f[0] == "Pss:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// keyQuotaShort says why n more sandboxes cannot start here, or "". Every
// sandbox's root is the same host uid (the base of the server's uid
// range) and runc gives each container a new session keyring, charged to
// that uid's kernel key quota (kernel.keys.maxkeys, 200 by default): past
// it, runc fails with "unable to create session key: disk quota exceeded".
func keyQuotaShort(n int) string {
	lower, err := env.srv.TemplateRootFS("base")
	if err != nil {
		return ""
	}
	var st syscall.Stat_t
	if syscall.Stat(lower, &st) != nil {
		return ""
	}
	used, maxKeys := keyUsage(st.Uid)
	if maxKeys == 0 || n <= maxKeys-used {
		return ""
	}
	return fmt.Sprintf("%d sandboxes need %d kernel keys (one session keyring each) of host uid %d, whose quota kernel.keys.maxkeys=%d has %d left: "+
		"raise it (sysctl -w kernel.keys.maxkeys=%d kernel.keys.maxbytes=%d) or run fewer (CORRAL_BENCH_DENSITY)",
		n, n, st.Uid, maxKeys, maxKeys-used, 2*(n+used)+100, 200*(2*(n+used)+100))
}

// keyUsage returns how many kernel keys uid holds and its quota, from
// /proc/key-users ("UID: usage nkeys/nikeys qnkeys/maxkeys qnbytes/maxbytes"),
// or the default quota when uid holds none.
func keyUsage(uid uint32) (used, maxKeys int) {
	b, _ := os.ReadFile("/proc/sys/kernel/keys/maxkeys")
	maxKeys, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	kb, _ := os.ReadFile("/proc/key-users")
	for _, line := range strings.Split(string(kb), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || f[0] != strconv.FormatUint(uint64(uid), 10)+":" {
			continue
		}
		q, m, ok := strings.Cut(f[3], "/")
		if !ok {
			continue
		}
		used, _ = strconv.Atoi(q)
		if v, err := strconv.Atoi(m); err == nil {
			maxKeys = v
		}
	}
	return used, maxKeys
}
