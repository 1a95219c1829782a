package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralhq/corral/internal/idrange"
	"github.com/corralhq/corral/internal/runtime/oci"
	"github.com/corralhq/corral/internal/supervisor"
	corral "github.com/corralhq/corral/sdk/go"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// BenchmarkRawRuncRun is the baseline of BenchmarkCreateFirstExec: the
// time of `runc run` of /bin/true in the same rootfs as corral's
// sandboxes, to completion (runc run deletes the container when its
// process exits). The bundle (an overlay of the template, like corral's)
// is prepared once, outside the timer: this is what runc costs, given a
// rootfs.
func BenchmarkRawRuncRun(b *testing.B) {
	need(b)
	r := newRawRunc(b)
	benchRuncRun(b, r, r.bundle(b, "true", minimalSpec(r, "/bin/true")))
}

// BenchmarkRawRuncRunCorralSpec is BenchmarkRawRuncRun with the spec
// corral wrote for a real sandbox (Docker's seccomp profile, capabilities,
// rlimits, cgroup limits and namespace, masked paths, the agent's bind
// mounts), running /bin/true instead of the agent: what corral's
// hardening costs runc.
func BenchmarkRawRuncRunCorralSpec(b *testing.B) {
	need(b)
	r := newRawRunc(b)
	spec := r.corralSpec(b, "/bin/true")
	benchRuncRun(b, r, r.bundle(b, "corral-true", spec))
}

func benchRuncRun(b *testing.B, r *rawRunc, bundle string) {
	s := newSamples(b)
	for i := 0; i < b.N; i++ {
		timeCmd(b, s, r.runCmd(bundle))
	}
	s.report()
}

// runCmd is `runc run` of bundle as a new container, to completion.
func (r *rawRunc) runCmd(bundle string) *exec.Cmd {
	return r.cmd("run", "--bundle", bundle, r.newID())
}

// timeCmd runs cmd as one timed section of s (its output kept for the
// error only) and fails b, with the output, when it fails: the timing
// loop of every baseline that runs a command (raw runc, Docker).
func timeCmd(b *testing.B, s *samples, cmd *exec.Cmd) {
	b.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	s.start()
	err := cmd.Run()
	s.stop()
	if err != nil {
		b.Fatalf("%s: %v: %s", strings.Join(cmd.Args, " "), err, out.Bytes())
	}
}

// BenchmarkRawRuncExec is the baseline of BenchmarkExecRoundTrip: the time
// of `runc exec <id> /bin/true` in a running container of the same rootfs.
func BenchmarkRawRuncExec(b *testing.B) {
	need(b)
	r := newRawRunc(b)
	bundle := r.bundle(b, "sleep", minimalSpec(r, "/bin/sleep", "1000"))
	id := r.newID()
	r.runDetached(b, bundle, id)
	s := newSamples(b)
	for i := 0; i < b.N; i++ {
		timeCmd(b, s, r.cmd("exec", id, "/bin/true"))
	}
	s.report()
}

// BenchmarkBreakdown measures, from outside corral, the parts of a cold
// create that a raw runtime pays too: corral's mounts alone (the disk
// tmpfs, the agent's run-dir tmpfs and the overlay of the template, as
// its driver mounts them), then `runc create`, `runc start` and `runc
// delete` of /bin/true with corral's own spec, each timed on its own,
// and in the same iteration `runc run --detach` of it (one process that
// makes and starts it, what the driver runs).
// BenchmarkBreakdownAgentReady adds the agent's start.
func BenchmarkBreakdown(b *testing.B) {
	need(b)
	r := newRawRunc(b)
	spec := r.corralSpec(b, "/bin/true")
	bundle := r.bundle(b, "phases", spec)
	mounts, create, start, del, detached := newSamples(b), newSamples(b), newSamples(b), newSamples(b), newSamples(b)
	scratch := b.TempDir()
	for i := 0; i < b.N; i++ {
		dir := filepath.Join(scratch, fmt.Sprint(i))
		if err := os.Mkdir(dir, 0o700); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		err := mountLikeCorral(dir, r.rootfsLower, r.uid)
		mounts.add(time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		if err := unmountAll(dir); err != nil {
			b.Fatal(err)
		}
		id := r.newID()
		logf := r.logFile(b, id)
		c := r.cmd("create", "--bundle", bundle, id)
		c.Stdout, c.Stderr = logf, logf
		t0 = time.Now()
		err = c.Run()
		create.add(time.Since(t0))
		if err != nil {
			b.Fatalf("runc create: %v: %s", err, r.log(id))
		}
		t0 = time.Now()
		err = r.cmd("start", id).Run()
		start.add(time.Since(t0))
		if err != nil {
			b.Fatalf("runc start: %v: %s", err, r.log(id))
		}
		r.waitStopped(b, id)
		t0 = time.Now()
		out, err := r.cmd("delete", id).CombinedOutput()
		del.add(time.Since(t0))
		if err != nil {
			b.Fatalf("runc delete: %v: %s", err, out)
		}
		logf.Close()
		// The same container made and started by one runc process, as
		// corral's driver does (`runc run --detach`).
		id = r.newID()
		logf = r.logFile(b, id)
		c = r.cmd("run", "--detach", "--bundle", bundle, id)
		c.Stdout, c.Stderr = logf, logf
		t0 = time.Now()
		err = c.Run()
		detached.add(time.Since(t0))
		if err != nil {
			b.Fatalf("runc run --detach: %v: %s", err, r.log(id))
		}
		r.waitStopped(b, id)
		if out, err := r.cmd("delete", id).CombinedOutput(); err != nil {
			b.Fatalf("runc delete: %v: %s", err, out)
		}
		logf.Close()
	}
	mounts.reportAs("BreakdownMounts")
	create.reportAs("BreakdownRuncCreate")
	start.reportAs("BreakdownRuncStart")
	del.reportAs("BreakdownRuncDelete")
	detached.reportAs("BreakdownRuncRunDetached")
}

// BenchmarkBreakdownAgentReady times what corral's runtime driver does
// for a create, done from outside by hand: corral's mounts, `runc run -d`
// of corral's spec with the agent as its process, until the agent's
// socket accepts a connection. The rest of a corral create (API, store,
// admission, network namespace, cgroup setup, the first request) is the
// difference to BenchmarkCreateFirstExec.
func BenchmarkBreakdownAgentReady(b *testing.B) {
	need(b)
	a := newAgentReady(b, newRawRunc(b))
	s := newSamples(b)
	for i := 0; i < b.N; i++ {
		a.run(b, s, nil)
	}
	s.report()
}

// BenchmarkSupervisorCost times BreakdownAgentReady's start with runc
// run directly by the benchmark and run under a supervisor of its own
// (package supervisor, as corral's driver runs it), in random order
// within each iteration with BenchmarkColdPaired's settle before each:
// what running the runtime under the supervisor costs a create.
func BenchmarkSupervisorCost(b *testing.B) {
	need(b)
	a := newAgentReady(b, newRawRunc(b))
	sock := filepath.Join(b.TempDir(), "sup", "supervisor.sock")
	sup := &supervisor.Client{Socket: sock, Binary: env.agentBin}
	b.Cleanup(func() { _ = sup.CloseWait(10 * time.Second) })
	direct, supervised := newSamples(b), newSamples(b)
	directRunc, supCall, supRan := newSamples(b), newSamples(b), newSamples(b)
	st := &pairedSettle{}
	for i := 0; i < b.N; i++ {
		first := func() { a.run(b, direct, nil); directRunc.add(a.call) }
		second := func() { a.run(b, supervised, sup); supCall.add(a.call); supRan.add(a.ran) }
		if i%2 == 1 {
			first, second = second, first
		}
		st.wait(b)
		first()
		st.wait(b)
		second()
	}
	direct.reportAs("SupervisorCostDirect")
	supervised.reportAs("SupervisorCostSupervised")
	directRunc.reportAs("SupervisorCostDirectRunc")
	supCall.reportAs("SupervisorCostSupervisedCall")
	supRan.reportAs("SupervisorCostSupervisedRan")
}

// agentReady runs corral's agent with corral's spec by hand, one
// container at a time: BenchmarkBreakdownAgentReady and the floor
// member of BenchmarkColdPaired.
type agentReady struct {
	r       *rawRunc
	scratch string
	dir     string
	spec    *specs.Spec
	n       int
	// call is how long the last run's runc took (its Run, or the
	// supervisor's RunTimed); ran is the supervisor's report of its life.
	call, ran time.Duration
}

func newAgentReady(b *testing.B, r *rawRunc) *agentReady {
	b.Helper()
	// In the server's scratch dir (mode 0711), which the sandbox root
	// may traverse, as corral's sandbox dirs are in its data dir.
	scratch, err := os.MkdirTemp(env.tmp, "agent-ready-")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.Chmod(scratch, 0o711); err != nil {
		b.Fatal(err)
	}
	a := &agentReady{r: r, scratch: scratch, dir: filepath.Join(scratch, "sb")}
	b.Cleanup(func() {
		out, _ := r.cmd("list", "-q").Output()
		for _, id := range strings.Fields(string(out)) {
			_ = r.cmd("delete", "-f", id).Run()
		}
		if err := unmountAll(a.dir); err != nil {
			b.Error(err)
		}
		_ = os.RemoveAll(scratch)
	})
	// The same spec in every iteration: the rootfs and run dir paths are
	// one overlay and one run dir, mounted afresh for each iteration.
	a.spec = r.corralSpec(b, "")
	a.spec.Root.Path = filepath.Join(a.dir, "rootfs")
	for j, m := range a.spec.Mounts {
		if m.Destination == "/run/corral" {
			a.spec.Mounts[j].Source = filepath.Join(a.dir, "run")
		}
	}
	return a
}

// run times, as one section of s, corral's mounts, `runc run -d` of the
// agent and the wait until its socket accepts; the container's removal
// and the unmounts after it are not timed. With sup, runc runs under
// that supervisor, as corral's driver runs it.
func (a *agentReady) run(b *testing.B, s *samples, sup *supervisor.Client) {
	b.Helper()
	a.start(b, s, sup, nil)
}

// runWith is run that calls then, once the agent accepts and before the
// container is removed (outside s's timed section).
func (a *agentReady) runWith(b *testing.B, s *samples, then func()) {
	b.Helper()
	a.start(b, s, nil, then)
}

// setAgent makes the next runs start the agent binary at path (on the
// host) instead of the server's.
func (a *agentReady) setAgent(path string) {
	for j, m := range a.spec.Mounts {
		if m.Destination == oci.AgentPath {
			a.spec.Mounts[j].Source = path
		}
	}
}

func (a *agentReady) start(b *testing.B, s *samples, sup *supervisor.Client, then func()) {
	b.Helper()
	r, dir := a.r, a.dir
	if err := os.Mkdir(dir, 0o710); err != nil {
		b.Fatal(err)
	}
	if err := os.Chown(dir, 0, r.uid); err != nil {
		b.Fatal(err)
	}
	a.n++
	bundle := r.bundle(b, fmt.Sprintf("agent-%d", a.n), a.spec)
	id := r.newID()
	logf := r.logFile(b, id)
	defer logf.Close()
	s.start()
	err := mountLikeCorral(dir, r.rootfsLower, r.uid)
	if err == nil {
		err = writeToken(filepath.Join(dir, "run"), r.uid)
	}
	if err != nil {
		b.Fatal(err)
	}
	c := r.cmd("run", "-d", "--bundle", bundle, id)
	if sup != nil {
		argv := append([]string{}, c.Args...)
		if p, err := exec.LookPath(argv[0]); err == nil {
			argv[0] = p
		}
		t0 := time.Now()
		code, ran, err := sup.RunTimed(context.Background(), argv, logf)
		a.call, a.ran = time.Since(t0), ran
		if err == nil && code != 0 {
			err = fmt.Errorf("exit status %d", code)
		}
		if err != nil {
			b.Fatalf("runc run -d under the supervisor: %v: %s", err, r.log(id))
		}
	} else {
		c.Stdout, c.Stderr = logf, logf
		t0 := time.Now()
		if err := c.Run(); err != nil {
			b.Fatalf("runc run -d: %v: %s", err, r.log(id))
		}
		a.call, a.ran = time.Since(t0), 0
	}
	if err := waitSocket(filepath.Join(dir, "run", "agent.sock"), 30*time.Second); err != nil {
		b.Fatalf("agent: %v: %s", err, r.log(id))
	}
	s.stop()
	if then != nil {
		then()
	}
	if out, err := r.cmd("delete", "-f", id).CombinedOutput(); err != nil {
		b.Fatalf("runc delete -f: %v: %s", err, out)
	}
	if err := unmountAll(dir); err != nil {
		b.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		b.Fatal(err)
	}
}

// rawRunc runs containers of the base template's rootfs with runc
// directly, with its own state root, outside corral. The template cache
// is root-only (it holds setuid files owned by the sandbox root's host
// uid), so, like corral, it mounts an overlay of the template in a
// directory the sandbox root may traverse (root:BASE, mode 0710) and runs
// containers there; the overlay reaches the template with the mounter's
// (host root's) credentials. The cache's permissions are not touched.
type rawRunc struct {
	root        string // runc --root
	dir         string // bundles and logs (root only)
	rootfsLower string // the base template's rootfs in the cache (never written)
	mnt         string // the mounted sandbox dir: disk, run, rootfs
	rootfs      string // the overlay
	uid         int    // host uid of the sandbox root (the template files' owner)
}

var containerSeq atomic.Int64

func newRawRunc(b *testing.B) *rawRunc {
	b.Helper()
	lower, err := env.srv.TemplateRootFS("base")
	if err != nil {
		b.Fatalf("base template: %v", err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(lower, &st); err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	r := &rawRunc{root: filepath.Join(dir, "runcroot"), dir: dir, rootfsLower: lower, uid: int(st.Uid)}
	// The sandbox dir lives in the server's scratch dir (mode 0711), as
	// corral's sandbox dirs live in its data dir.
	mnt, err := os.MkdirTemp(env.tmp, "raw-runc-")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.Chmod(mnt, 0o710); err != nil {
		b.Fatal(err)
	}
	if err := os.Chown(mnt, 0, r.uid); err != nil {
		b.Fatal(err)
	}
	r.mnt, r.rootfs = mnt, filepath.Join(mnt, "rootfs")
	if err := mountLikeCorral(mnt, lower, r.uid); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		// runc run deletes its container when the process exits; this
		// catches any left by a failed iteration.
		out, _ := r.cmd("list", "-q").Output()
		for _, id := range strings.Fields(string(out)) {
			_ = r.cmd("delete", "-f", id).Run()
		}
		if err := unmountAll(mnt); err != nil {
			b.Error(err)
		}
		_ = os.RemoveAll(mnt)
		removeCgroups(benchCgroupParent)
	})
	return r
}

// mountLikeCorral mounts in dir what corral's runtime driver mounts for a
// sandbox: a size-capped tmpfs "disk" holding the overlay's upper and work
// dirs, the agent's tiny run-dir tmpfs "run", and the overlay "rootfs"
// with the template as its lower layer.
func mountLikeCorral(dir, lower string, uid int) error {
	disk, run, rootfs := filepath.Join(dir, "disk"), filepath.Join(dir, "run"), filepath.Join(dir, "rootfs")
	for _, p := range []string{disk, run, rootfs} {
		if err := os.Mkdir(p, 0o700); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0755,uid=%d,gid=%d", 1<<30, (1<<30)/2048, uid, uid)
	if err := unix.Mount("tmpfs", disk, "tmpfs", unix.MS_NODEV|unix.MS_NOSUID, opts); err != nil {
		return fmt.Errorf("mount disk tmpfs: %w", err)
	}
	opts = fmt.Sprintf("size=%d,nr_inodes=16,mode=0700,uid=%d,gid=%d", 64<<10, uid, uid)
	if err := unix.Mount("tmpfs", run, "tmpfs", unix.MS_NODEV|unix.MS_NOSUID|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("mount run tmpfs: %w", err)
	}
	upper, work := filepath.Join(disk, "upper"), filepath.Join(disk, "work")
	for _, p := range []string{upper, work} {
		if err := os.Mkdir(p, 0o755); err != nil {
			return err
		}
	}
	if err := os.Chown(upper, uid, uid); err != nil {
		return err
	}
	ov := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
	if err := unix.Mount("overlay", rootfs, "overlay", unix.MS_NODEV, ov); err != nil {
		return fmt.Errorf("mount overlay: %w", err)
	}
	return nil
}

// unmountAll unmounts what mountLikeCorral mounted in dir.
func unmountAll(dir string) error {
	var errs []error
	for _, p := range []string{"rootfs", "run", "disk"} {
		if err := unix.Unmount(filepath.Join(dir, p), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// writeToken writes an agent access token in the run dir.
func writeToken(run string, uid int) error {
	p := filepath.Join(run, "token")
	if err := os.WriteFile(p, []byte("bench-token"), 0o600); err != nil {
		return err
	}
	return os.Chown(p, uid, uid)
}

// waitSocket polls until the unix socket at path accepts a connection,
// every 100 µs: at least as soon as corral's driver (woken by inotify)
// would see it, so that a baseline using it is never slowed by its wait.
func waitSocket(path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.Dial("unix", path)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("socket %s: %w", path, err)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func (r *rawRunc) newID() string {
	return fmt.Sprintf("corral-bench-%d-%d", os.Getpid(), containerSeq.Add(1))
}

func (r *rawRunc) cmd(args ...string) *exec.Cmd {
	return exec.Command("runc", append([]string{"--root", r.root}, args...)...)
}

// logFile creates the log of container id. Detached, a container keeps
// runc's stdio: files, not pipes, or cmd.Run would wait for the
// container to close them.
func (r *rawRunc) logFile(b *testing.B, id string) *os.File {
	f, err := os.Create(filepath.Join(r.dir, id+".log"))
	if err != nil {
		b.Fatal(err)
	}
	return f
}

func (r *rawRunc) log(id string) string {
	out, _ := os.ReadFile(filepath.Join(r.dir, id+".log"))
	return string(out)
}

// runDetached starts bundle as container id in the background.
func (r *rawRunc) runDetached(b *testing.B, bundle, id string) {
	logf := r.logFile(b, id)
	defer logf.Close()
	cmd := r.cmd("run", "-d", "--bundle", bundle, id)
	cmd.Stderr = logf // stdin and stdout: /dev/null
	if err := cmd.Run(); err != nil {
		b.Fatalf("runc run -d: %v: %s", err, r.log(id))
	}
}

// waitStopped polls runc state until container id's process has exited.
func (r *rawRunc) waitStopped(b *testing.B, id string) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		out, err := r.cmd("state", id).Output()
		var st struct{ Status string }
		if err == nil && json.Unmarshal(out, &st) == nil && st.Status == "stopped" {
			return
		}
		time.Sleep(time.Millisecond)
	}
	b.Fatalf("container %s did not stop within 30 s", id)
}

// minimalSpec is the smallest spec that runs args in r's overlay the way
// corral does, so the baseline pays for the same rootfs and namespaces:
// the user-namespace variant, container root mapped to the template
// files' owner as in corral's spec (rather than host root without a user
// namespace), with pid, ipc, uts, mount and network namespaces, the root
// read-only and corral's /proc, /dev and /sys mounts (a tmpfs on /dev,
// so runc creates no device node). It leaves out what corral adds on top:
// cgroup namespace and limits, seccomp, capabilities, masked paths, rlimits
// and the agent (BenchmarkRawRuncRunCorralSpec has them).
func minimalSpec(r *rawRunc, args ...string) *specs.Spec {
	idmap := []specs.LinuxIDMapping{{ContainerID: 0, HostID: uint32(r.uid), Size: idrange.Count}}
	ro := []string{"nosuid", "noexec", "nodev", "ro"}
	return &specs.Spec{
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
}

// benchCgroupParent holds the cgroups of the containers run with
// corral's spec.
const benchCgroupParent = "corral-bench"

// corralSpecs caches the spec corral wrote for a real sandbox.
var corralSpecs struct {
	once sync.Once
	data []byte
	err  error
}

// corralSpec returns the OCI spec corral's driver wrote for a real
// sandbox of the base template (read from its bundle), adjusted to run in
// r's overlay and run dir, in a cgroup of its own under
// benchCgroupParent, in fresh namespaces, with args as its process
// (none: the agent, as corral runs it).
func (r *rawRunc) corralSpec(b *testing.B, args ...string) *specs.Spec {
	b.Helper()
	corralSpecs.once.Do(func() {
		c := corral.New(env.url, env.key)
		ctx := context.Background()
		sb, err := c.Create(ctx, corral.CreateOptions{})
		if err != nil {
			corralSpecs.err = fmt.Errorf("create: %w", err)
			return
		}
		defer sb.Kill(context.WithoutCancel(ctx))
		corralSpecs.data, corralSpecs.err = os.ReadFile(filepath.Join(env.dataDir, "sandboxes", sb.ID, "config.json"))
	})
	if corralSpecs.err != nil {
		b.Fatalf("corral's spec: %v", corralSpecs.err)
	}
	var s specs.Spec
	if err := json.Unmarshal(corralSpecs.data, &s); err != nil {
		b.Fatal(err)
	}
	s.Root.Path = r.rootfs
	for i, m := range s.Mounts {
		if m.Destination == "/run/corral" {
			s.Mounts[i].Source = filepath.Join(r.mnt, "run")
		}
	}
	for i := range s.Linux.Namespaces {
		s.Linux.Namespaces[i].Path = ""
	}
	s.Linux.CgroupsPath = fmt.Sprintf("/%s/%d", benchCgroupParent, containerSeq.Add(1))
	if len(args) > 0 && args[0] != "" {
		s.Process.Args = args
	}
	return &s
}

// bundle writes an OCI bundle named name with spec and returns its
// directory.
func (r *rawRunc) bundle(b *testing.B, name string, spec *specs.Spec) string {
	b.Helper()
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

// removeCgroups removes the cgroup parent (and its empty children) from
// every hierarchy, v1 or v2.
func removeCgroups(parent string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", parent))
	dirs = append(dirs, filepath.Join("/sys/fs/cgroup", parent))
	for _, d := range dirs {
		kids, _ := os.ReadDir(d)
		for _, k := range kids {
			if k.IsDir() {
				_ = os.Remove(filepath.Join(d, k.Name()))
			}
		}
		_ = os.Remove(d)
	}
}

// BenchmarkRawRuncRunCorralSpecNoSeccomp is BenchmarkRawRuncRunCorralSpec
// without the seccomp profile: what loading Docker's profile costs runc.
func BenchmarkRawRuncRunCorralSpecNoSeccomp(b *testing.B) {
	need(b)
	r := newRawRunc(b)
	spec := r.corralSpec(b, "/bin/true")
	spec.Linux.Seccomp = nil
	benchRuncRun(b, r, r.bundle(b, "corral-true-noseccomp", spec))
}

// BenchmarkRawRuncRunCorralSpecNoLimits is BenchmarkRawRuncRunCorralSpec
// without cgroup limits (memory, swap, CPU, pids, devices; the cgroup
// itself remains): what setting them costs runc.
func BenchmarkRawRuncRunCorralSpecNoLimits(b *testing.B) {
	need(b)
	r := newRawRunc(b)
	spec := r.corralSpec(b, "/bin/true")
	spec.Linux.Resources = nil
	benchRuncRun(b, r, r.bundle(b, "corral-true-nolimits", spec))
}
