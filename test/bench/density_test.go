package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/cgroups"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/runtime/oci"
	"github.com/corralhq/corral/internal/server"
	"github.com/corralhq/corral/test/testserver"
)

// TestIdleDensity measures what an idle sandbox costs the host: it
// starts CORRAL_DENSITY sandboxes (networking off, the base template) on
// a server of its own whose max-sandboxes is raised to fit them, lets
// them idle, and reports
//
//   - PSS (/proc/PID/smaps_rollup) of every host process per sandbox, by
//     kind: the processes in the sandbox's cgroup (the agent; under
//     gVisor the sentry and gofer), any process outside it whose command
//     line names the sandbox (a per-sandbox shim or runtime: none is
//     expected), corral's supervisor (shared by all) and the control
//     plane's growth;
//   - the sandbox cgroups' memory usage (what the kernel charges them,
//     tmpfs and kernel objects included);
//   - MemAvailable before and after, per sandbox.
//
// It is a measurement, not a test (docs/performance.md, "Idle sandbox
// density"): it asserts only that every sandbox started and that the
// host is clean after they are killed. It skips unless CORRAL_DENSITY
// is set, e.g.
//
//	CORRAL_DENSITY=50 go test -count=1 -run TestIdleDensity -v ./test/bench/
//
// CORRAL_DENSITY_RUNTIME=gvisor measures gVisor sandboxes instead.
func TestIdleDensity(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CORRAL_DENSITY"))
	if n <= 0 {
		t.Skip("a measurement: set CORRAL_DENSITY=N to start N idle sandboxes")
	}
	if env.skip != "" {
		t.Skip(env.skip)
	}
	rt := os.Getenv("CORRAL_DENSITY_RUNTIME")
	if rt == "" {
		rt = "runc"
	}
	ts, err := testserver.StartWith("../../cmd/corral", slog.LevelError, func(c *server.Config) {
		c.Admission.MaxConcurrent = n + 10
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ts.Close()
	api := func(method, path string, body any, out any) (int, error) {
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequest(method, ts.URL+path, rd)
		req.Header.Set("Authorization", "Bearer "+ts.Key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if out != nil && resp.StatusCode < 300 {
			if err := json.Unmarshal(b, out); err != nil {
				return resp.StatusCode, err
			}
		}
		if resp.StatusCode >= 300 {
			return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
		return resp.StatusCode, nil
	}
	// One sandbox first: the template is cached and the server warm.
	warm := densityCreate(t, api, rt)
	if _, err := api("DELETE", "/v1/sandboxes/"+warm, nil, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	availBefore := densityMemAvailable(t)
	selfBefore := densityPSS(os.Getpid())

	ids := make([]string, n)
	t0 := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ids[i] = densityCreate(t, api, rt)
		}()
	}
	wg.Wait()
	t.Logf("%d %s sandboxes started in %s", n, rt, time.Since(t0).Round(time.Second))
	defer func() {
		t0 := time.Now()
		for i := 0; i < len(ids); i += 50 {
			var kw sync.WaitGroup
			for _, id := range ids[i:min(i+50, len(ids))] {
				if id == "" {
					continue
				}
				kw.Add(1)
				go func() {
					defer kw.Done()
					if _, err := api("DELETE", "/v1/sandboxes/"+id, nil, nil); err != nil {
						t.Errorf("kill %s: %v", id, err)
					}
				}()
			}
			kw.Wait()
		}
		t.Logf("%d sandboxes killed in %s", n, time.Since(t0).Round(time.Second))
	}()
	if t.Failed() {
		return
	}
	// Idle: the agents' start-up garbage collected and returned.
	time.Sleep(20 * time.Second)
	availAfter := densityMemAvailable(t)
	selfAfter := densityPSS(os.Getpid())

	kinds := map[string]*densityKind{}
	add := func(kind string, pid int) {
		k := kinds[kind]
		if k == nil {
			k = &densityKind{}
			kinds[kind] = k
		}
		k.n++
		k.pss += densityPSS(pid)
		if k.n == 1 {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
			k.sample = strings.Join(strings.Fields(strings.ReplaceAll(string(bytes.SplitN(b, []byte("\n"), 2)[min(1, len(bytes.SplitN(b, []byte("\n"), 2))-1)]), " kB", "k")), " ")
		}
	}
	var cgBytes int64
	inCgroup := map[int]bool{}
	for _, id := range ids {
		g := cgroups.Open("/corral/" + id)
		pids, _ := g.Procs()
		for _, pid := range pids {
			inCgroup[pid] = true
			add("in the sandbox cgroup: "+densityComm(pid), pid)
		}
		if b, err := g.MemoryBytes(); err == nil {
			cgBytes += b
		}
	}
	idSet := map[string]bool{}
	for _, id := range ids {
		idSet[id] = true
	}
	// This server's supervisor serves a socket beside its runtime roots.
	supDir := filepath.Dir(oci.RuntimeRoot(filepath.Join(ts.DataDir, "sandboxes"), runtime.Runc)) + "/"
	sup := 0
	for _, pid := range densityPids() {
		if inCgroup[pid] {
			continue
		}
		args := densityCmdline(pid)
		if len(args) > 1 && args[1] == "supervisor" && strings.Contains(strings.Join(args, " "), supDir) {
			add("corral supervisor (shared)", pid)
			sup++
			continue
		}
		for _, a := range args {
			if idSet[a] || idSet[filepath.Base(a)] {
				add("outside the cgroup, naming the sandbox: "+filepath.Base(args[0])+" "+densityVerb(args), pid)
				break
			}
		}
	}
	names := make([]string, 0, len(kinds))
	for k := range kinds {
		names = append(names, k)
	}
	sort.Strings(names)
	var total int64
	t.Logf("PSS by process kind (%d sandboxes, %s):", n, rt)
	for _, k := range names {
		s := kinds[k]
		total += s.pss
		t.Logf("  %-60s %4d processes  %7.2f MiB per process  %6.2f MiB per sandbox", k, s.n, densityMiB(s.pss)/float64(s.n), densityMiB(s.pss)/float64(n))
		t.Logf("      one of them: %s", s.sample)
	}
	t.Logf("  %-60s %6.2f MiB per sandbox", "control plane growth (this process)", densityMiB(selfAfter-selfBefore)/float64(n))
	t.Logf("PSS of all host processes per sandbox: %.2f MiB", densityMiB(total+selfAfter-selfBefore)/float64(n))
	t.Logf("sandbox cgroups' memory usage: %.2f MiB per sandbox", densityMiB(cgBytes)/float64(n))
	t.Logf("MemAvailable: %.0f MiB before, %.0f MiB after: %.2f MiB per sandbox (host-wide: other processes on the host move it too)",
		densityMiB(availBefore), densityMiB(availAfter), densityMiB(availBefore-availAfter)/float64(n))
	if sup > 1 {
		t.Errorf("%d supervisors for one server", sup)
	}
}

type densityKind struct {
	n      int
	pss    int64
	sample string // smaps_rollup of the first process of the kind
}

func densityMiB(b int64) float64 { return float64(b) / (1 << 20) }

// createIdle creates a sandbox that lives an hour, checks that it runs a
// command, and returns its id.
func densityCreate(t *testing.T, api func(string, string, any, any) (int, error), rt string) string {
	var sb struct{ ID string }
	if _, err := api("POST", "/v1/sandboxes", map[string]any{"timeout": 3600, "runtime": rt}, &sb); err != nil {
		t.Error(err)
		return ""
	}
	var res struct{ Stdout string }
	if _, err := api("POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"command": "echo up"}, &res); err != nil || res.Stdout != "up\n" {
		t.Errorf("exec in %s: %q %v", sb.ID, res.Stdout, err)
	}
	return sb.ID
}

// pss is the process's proportional set size in bytes, 0 if it is gone.
func densityPSS(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "Pss:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// memAvailable is MemAvailable of /proc/meminfo in bytes.
func densityMemAvailable(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no MemAvailable in /proc/meminfo")
	return 0
}

func densityPids() []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

func densityCmdline(pid int) []string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

func densityComm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// firstVerb is the first argument that is not a flag or its value, for
// telling `corral shim` from `runc run`.
func densityVerb(args []string) string {
	for _, a := range args[1:] {
		switch a {
		case "shim", "run", "create", "boot", "gofer", "init":
			return a
		}
	}
	return ""
}
