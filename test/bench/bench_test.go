package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/idrange"
	corral "github.com/corralhq/corral/sdk/go"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// trueArgv runs the command as a program without a shell.
var trueArgv = corral.RunOptions{Args: []string{}}

// BenchmarkCreateFirstExec times SDK Create (base template, runc) until the
// first `true` run in the new sandbox returns.
func BenchmarkCreateFirstExec(b *testing.B) { benchCreateFirstExec(b, "runc") }

// BenchmarkGVisorCreateFirstExec is BenchmarkCreateFirstExec under gVisor.
func BenchmarkGVisorCreateFirstExec(b *testing.B) {
	need(b)
	if _, err := exec.LookPath("runsc"); err != nil {
		b.Skip("runsc (gVisor) is not installed: apt-get install runsc")
	}
	benchCreateFirstExec(b, "gvisor")
}

// BenchmarkCreateFirstExecNetwork is BenchmarkCreateFirstExec for a
// sandbox with an egress policy: it also gets a veth pair, addresses, its
// rule in the nftables table and its entry in the proxy's client table.
func BenchmarkCreateFirstExecNetwork(b *testing.B) {
	benchCreate(b, corral.CreateOptions{Network: "allow", Allow: []string{"pypi.org"}}, nil)
}

// BenchmarkCreateFirstExecSnapshot is BenchmarkCreateFirstExec for
// sandboxes started from a snapshot (a layer with a few files on top of
// the base template).
func BenchmarkCreateFirstExecSnapshot(b *testing.B) {
	c := client(b)
	ctx := context.Background()
	src, err := c.Create(ctx, corral.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Kill(context.Background())
	if _, err := src.Run(ctx, "mkdir -p /home/user/proj && seq 1000 > /home/user/proj/data.txt", corral.RunOptions{}); err != nil {
		b.Fatal(err)
	}
	sn, err := c.Snapshot(ctx, src.ID, "bench")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.DeleteSnapshot(context.Background(), sn.ID) })
	benchCreate(b, corral.CreateOptions{Snapshot: sn.ID}, nil)
}

// BenchmarkCreateFirstExecPooled is BenchmarkCreateFirstExec with a warm
// pool of the base template: each create takes a sandbox the pool started
// ahead of time (waiting, outside the timer, for the pool to refill).
func BenchmarkCreateFirstExecPooled(b *testing.B) {
	c := client(b)
	ctx := context.Background()
	if _, err := c.SetPool(ctx, "base", 2, 2, 0); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _, _ = c.SetPool(context.Background(), "base", 0, 0, 0) })
	waitIdle := func() {
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			ps, err := c.Pools(ctx)
			if err == nil && len(ps) == 1 && ps[0].Idle >= 1 {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		b.Fatal("the pool did not refill within a minute")
	}
	benchCreate(b, corral.CreateOptions{}, waitIdle)
	if ps, err := c.Pools(ctx); err == nil && len(ps) == 1 {
		b.ReportMetric(float64(ps[0].Hits), "pool-hits")
		b.ReportMetric(ps[0].RefillMSAvg, "refill-ms")
	}
}

// BenchmarkCreateFirstExecVolume is BenchmarkCreateFirstExec for
// sandboxes that mount a volume (one more bind mount).
func BenchmarkCreateFirstExecVolume(b *testing.B) {
	c := client(b)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		b.Skip("volumes need loop devices")
	}
	v, err := c.CreateVolume(context.Background(), fmt.Sprintf("bench-%d", time.Now().UnixNano()), 64)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.DeleteVolume(context.Background(), v.ID) })
	benchCreate(b, corral.CreateOptions{Volumes: []corral.VolumeMount{{Volume: v.ID, Path: "/data"}}}, nil)
}

// BenchmarkVolumeCreateDelete times making a 1 GiB volume (sparse image,
// mkfs.ext4, loop mount) and deleting it.
func BenchmarkVolumeCreateDelete(b *testing.B) {
	c := client(b)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		b.Skip("volumes need loop devices")
	}
	ctx := context.Background()
	s := newSamples(b)
	for i := 0; i < b.N; i++ {
		s.start()
		v, err := c.CreateVolume(ctx, fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), i), 1024)
		if err != nil {
			b.Fatal(err)
		}
		err = c.DeleteVolume(ctx, v.ID)
		s.stop()
		if err != nil {
			b.Fatal(err)
		}
	}
	s.report()
}

func benchCreateFirstExec(b *testing.B, rt string) {
	benchCreate(b, corral.CreateOptions{Runtime: rt}, nil)
}

// benchCreate times create → first `true`; before, when set, runs ahead
// of each iteration outside the measurement.
func benchCreate(b *testing.B, opts corral.CreateOptions, before func()) {
	c := client(b)
	ctx := context.Background()
	s := newSamples(b)
	for i := 0; i < b.N; i++ {
		if before != nil {
			b.StopTimer()
			before()
			b.StartTimer()
		}
		s.start()
		sb, err := c.Create(ctx, opts)
		if err != nil {
			b.Fatalf("create: %v", err)
		}
		res, err := sb.Run(ctx, "true", trueArgv)
		s.stop()
		kerr := sb.Kill(ctx)
		checkTrue(b, res, err)
		if kerr != nil {
			b.Fatalf("kill: %v", kerr)
		}
	}
	s.report()
}

// BenchmarkExecRoundTrip times one `true` run (SDK → server → agent and
// back) in a running sandbox.
func BenchmarkExecRoundTrip(b *testing.B) {
	c := client(b)
	ctx := context.Background()
	// The same call on purpose: a task without loop detection and with a
	// call budget for every iteration.
	task, err := c.CreateTask(ctx, corral.TaskOptions{Agent: "bench", MaxCalls: int64(b.N) + 10, NoLoopCheck: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _, _ = c.EndTask(context.Background(), task.ID) })
	sb, err := c.Create(ctx, corral.CreateOptions{Task: task.ID})
	if err != nil {
		b.Fatalf("create: %v", err)
	}
	b.Cleanup(func() { _ = sb.Kill(context.Background()) })
	res, err := sb.Run(ctx, "true", trueArgv) // warm up connections
	checkTrue(b, res, err)
	s := newSamples(b)
	for i := 0; i < b.N; i++ {
		s.start()
		res, err := sb.Run(ctx, "true", trueArgv)
		s.stop()
		checkTrue(b, res, err)
	}
	s.report()
}

// BenchmarkKill times Sandbox.Kill of an idle sandbox.
func BenchmarkKill(b *testing.B) {
	c := client(b)
	ctx := context.Background()
	s := newSamples(b)
	for i := 0; i < b.N; i++ {
		sb, err := c.Create(ctx, corral.CreateOptions{})
		if err != nil {
			b.Fatalf("create: %v", err)
		}
		s.start()
		err = sb.Kill(ctx)
		s.stop()
		if err != nil {
			b.Fatalf("kill: %v", err)
		}
	}
	s.report()
}

// BenchmarkRawRuncRun is the baseline of BenchmarkCreateFirstExec: the
// time of `runc run` of /bin/true in the same base template rootfs, to
// completion (runc run deletes the container when its process exits).
func BenchmarkRawRuncRun(b *testing.B) {
	need(b)
	r := newRawRunc(b)
	bundle := r.bundle(b, "true", "/bin/true")
	s := newSamples(b)
	for i := 0; i < b.N; i++ {
		cmd := r.cmd("run", "--bundle", bundle, r.newID())
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = io.Discard, &stderr
		s.start()
		err := cmd.Run()
		s.stop()
		if err != nil {
			b.Fatalf("runc run: %v: %s", err, stderr.Bytes())
		}
	}
	s.report()
}

// BenchmarkRawRuncExec is the baseline of BenchmarkExecRoundTrip: the time
// of `runc exec <id> /bin/true` in a running container of the same rootfs.
func BenchmarkRawRuncExec(b *testing.B) {
	need(b)
	r := newRawRunc(b)
	bundle := r.bundle(b, "sleep", "/bin/sleep", "1000")
	id := r.newID()
	// Detached, the container keeps runc's stdio: use files, not pipes,
	// or cmd.Run would wait for the container to close them.
	logf, err := os.Create(filepath.Join(r.dir, id+".log"))
	if err != nil {
		b.Fatal(err)
	}
	defer logf.Close()
	cmd := r.cmd("run", "-d", "--bundle", bundle, id)
	cmd.Stderr = logf // stdin and stdout: /dev/null
	if err := cmd.Run(); err != nil {
		out, _ := os.ReadFile(logf.Name())
		b.Fatalf("runc run -d: %v: %s", err, out)
	}
	s := newSamples(b)
	for i := 0; i < b.N; i++ {
		cmd := r.cmd("exec", id, "/bin/true")
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = io.Discard, &stderr
		s.start()
		err := cmd.Run()
		s.stop()
		if err != nil {
			b.Fatalf("runc exec: %v: %s", err, stderr.Bytes())
		}
	}
	s.report()
}

// client returns an SDK client of the shared server, or skips b.
func client(b *testing.B) *corral.Client {
	b.Helper()
	need(b)
	return corral.New(env.url, env.key)
}

// checkTrue fails b unless a `true` run succeeded.
func checkTrue(b *testing.B, res *corral.CommandResult, err error) {
	b.Helper()
	if err != nil {
		b.Fatalf("run true: %v", err)
	}
	if res.ExitCode != 0 {
		b.Fatalf("run true: exit %d (%s), stderr %q", res.ExitCode, res.Status, res.Stderr)
	}
}

// rawRunc runs containers of the base template's rootfs with runc directly,
// with its own state root, outside corral.
type rawRunc struct {
	root   string // runc --root
	dir    string // bundles and logs
	rootfs string // the base template's rootfs (never written)
}

var containerSeq atomic.Int64

func newRawRunc(b *testing.B) *rawRunc {
	b.Helper()
	rootfs, err := env.srv.TemplateRootFS("base")
	if err != nil {
		b.Fatalf("base template: %v", err)
	}
	dir := b.TempDir()
	r := &rawRunc{root: filepath.Join(dir, "runcroot"), dir: dir, rootfs: rootfs}
	// runc run deletes its container when the process exits; this catches
	// any left by a failed iteration.
	b.Cleanup(func() {
		out, _ := r.cmd("list", "-q").Output()
		for _, id := range strings.Fields(string(out)) {
			_ = r.cmd("delete", "-f", id).Run()
		}
	})
	return r
}

func (r *rawRunc) newID() string {
	return fmt.Sprintf("corral-bench-%d-%d", os.Getpid(), containerSeq.Add(1))
}

func (r *rawRunc) cmd(args ...string) *exec.Cmd {
	return exec.Command("runc", append([]string{"--root", r.root}, args...)...)
}

// bundle writes an OCI bundle named name that runs args and returns its
// directory.
//
// The spec is the smallest one that runs the template the way corral does,
// so the baseline pays for the same rootfs and namespaces. The template's
// files belong to the base of the server's uid range (corral's sandbox
// root; read from the rootfs' owner), so it uses the
// user-namespace variant: container root mapped to that uid like in
// corral's spec (rather than host root without a user namespace), with
// pid, ipc, uts, mount and network namespaces, the root read-only and
// corral's /proc, /dev and /sys mounts (a tmpfs on /dev, so runc creates
// no device node in the template). It leaves out what corral adds on top:
// the overlay and tmpfs writable layer, cgroup namespace and limits,
// seccomp, capabilities, masked paths and the agent.
func (r *rawRunc) bundle(b *testing.B, name string, args ...string) string {
	b.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(r.rootfs, &st); err != nil {
		b.Fatal(err)
	}
	idmap := []specs.LinuxIDMapping{{ContainerID: 0, HostID: st.Uid, Size: idrange.Count}}
	ro := []string{"nosuid", "noexec", "nodev", "ro"}
	spec := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Args: args,
			Env:  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Cwd:  "/",
		},
		Root:     &specs.Root{Path: r.rootfs, Readonly: true},
		Hostname: "bench",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: ro},
		},
		Linux: &specs.Linux{
			UIDMappings: idmap,
			GIDMappings: idmap,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.UserNamespace},
			},
		},
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	dir := filepath.Join(r.dir, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600); err != nil {
		b.Fatal(err)
	}
	return dir
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
	s.d = append(s.d, time.Since(s.t0))
	s.b.StopTimer()
}

// report reports p50 and p95 in milliseconds (instead of ns/op) and keeps
// them for the summary.
func (s *samples) report() {
	sorted := slices.Sorted(slices.Values(s.d))
	res := result{n: len(sorted), p50: percentile(sorted, 50), p95: percentile(sorted, 95)}
	s.b.ReportMetric(0, "ns/op")
	s.b.ReportMetric(ms(res.p50), "p50-ms")
	s.b.ReportMetric(ms(res.p95), "p95-ms")
	// Benchmarks run one after another; the last run of each (the one
	// with the requested b.N) is the one kept.
	results[s.b.Name()] = res
}

// percentile returns the nearest-rank p-th percentile of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

type result struct {
	n        int
	p50, p95 time.Duration
}

// results holds each benchmark's percentiles by benchmark name.
var results = map[string]result{}

// summaryRows are the benchmarks of the summary table, in order.
var summaryRows = []struct{ name, label string }{
	{"BenchmarkCreateFirstExec", "corral create → first exec (runc)"},
	{"BenchmarkGVisorCreateFirstExec", "corral create → first exec (gVisor)"},
	{"BenchmarkExecRoundTrip", "corral exec round trip (runc)"},
	{"BenchmarkKill", "corral kill (runc)"},
	{"BenchmarkRawRuncRun", "raw `runc run` of /bin/true"},
	{"BenchmarkRawRuncExec", "raw `runc exec` of /bin/true"},
}

// printSummary writes a Markdown table of the benchmarks that ran, and
// corral's overhead over the raw runc baselines.
func printSummary(w io.Writer) {
	if len(results) == 0 {
		return
	}
	b, _ := os.ReadFile("/proc/loadavg")
	load := strings.Fields(string(b))
	load = load[:min(3, len(load))]
	fmt.Fprintf(w, "\ncorral benchmarks: %d CPUs, load average %s\n\n", goruntime.NumCPU(), strings.Join(load, " "))
	fmt.Fprintln(w, "| benchmark | n | p50 ms | p95 ms |")
	fmt.Fprintln(w, "|---|--:|--:|--:|")
	for _, row := range summaryRows {
		if r, ok := results[row.name]; ok {
			fmt.Fprintf(w, "| %s | %d | %.1f | %.1f |\n", row.label, r.n, ms(r.p50), ms(r.p95))
		}
	}
	ratio := func(label, corralName, rawName string) {
		c, ok1 := results[corralName]
		r, ok2 := results[rawName]
		if ok1 && ok2 && r.p50 > 0 && r.p95 > 0 {
			fmt.Fprintf(w, "| %s | | ×%.2f | ×%.2f |\n", label,
				float64(c.p50)/float64(r.p50), float64(c.p95)/float64(r.p95))
		}
	}
	ratio("create → first exec / raw runc run", "BenchmarkCreateFirstExec", "BenchmarkRawRuncRun")
	ratio("exec round trip / raw runc exec", "BenchmarkExecRoundTrip", "BenchmarkRawRuncExec")
}
