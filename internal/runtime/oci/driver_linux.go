package oci

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/go-runc"
	"github.com/corralhq/corral/internal/cgroups"
	"github.com/corralhq/corral/internal/idrange"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/supervisor"
	"golang.org/x/sys/unix"
)

// Options configure the driver.
type Options struct {
	// StateDir holds one directory per sandbox (bundle, mounts, socket).
	StateDir string
	// AgentBinary is the host path of the static corral binary that is
	// bind-mounted read-only into every sandbox as its init.
	AgentBinary string
	// RuncPath names the runc binary (default: runc in PATH).
	RuncPath string
	// RunscPath names the runsc binary and RunscLegacy says it is one
	// without the systrap platform (see Runsc). With RunscPath "", New
	// picks one with FindRunsc (the pinned build when cached).
	RunscPath   string
	RunscLegacy bool
	// RunscPlatform is gVisor's platform: PlatformSystrap (default: no
	// KVM needed), PlatformPtrace (the default of a legacy runsc) or
	// PlatformKVM (needs a usable /dev/kvm).
	RunscPlatform string
	// UIDBase is the host uid (and gid) that sandbox root maps to: the
	// base of the server's uid range (required; see package idrange).
	UIDBase uint32
	// StartTimeout bounds how long Start waits for the agent (default 20 s).
	StartTimeout time.Duration
}

// CgroupParent is the cgroup under which every sandbox's cgroup lives.
const CgroupParent = "/corral"

// RuntimeRoot is the runtime's state directory (its --root) for the
// sandboxes of stateDir. Each data directory gets its own, so two corral
// servers on one host (or a server and a test run) never see, adopt or
// reclaim each other's sandboxes.
func RuntimeRoot(stateDir string, rt runtime.Runtime) string {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		abs = stateDir
	}
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join(StateBase, hex.EncodeToString(sum[:6]), string(rt))
}

// SupervisorSocket is the socket of the supervisor that reaps the
// processes of the sandboxes of stateDir, beside their runtime roots.
func SupervisorSocket(stateDir string) string {
	return filepath.Join(filepath.Dir(RuntimeRoot(stateDir, runtime.Runc)), "supervisor", "supervisor.sock")
}

var idPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,39}$`)

// Driver runs sandboxes with runc or runsc.
type Driver struct {
	opts  Options
	runc  *runc.Runc
	runsc *runc.Runc

	// sup runs the runtime's command that makes a sandbox under the
	// supervisor of this state dir (package supervisor), which reaps
	// what it leaves.
	sup *supervisor.Client

	mu sync.Mutex
	// watches holds, per sandbox whose init this instance watches (it
	// started it, or saw it alive since), the watch of its init. Guarded
	// by mu.
	watches map[string]*initWatch
	// oom holds the last OOM-kill count seen per sandbox. Guarded by mu.
	oom map[string]uint64
	// waits holds the run-delay counter per sandbox, made by the first
	// Stats and dropped by Stop. Guarded by mu.
	waits map[string]*cgroups.WaitCounter
}

var _ runtime.Driver = (*Driver)(nil)

// New returns a driver after checking that the state directory and the
// agent binary are usable.
func New(o Options) (*Driver, error) {
	if o.StateDir == "" || o.AgentBinary == "" {
		return nil, errors.New("oci driver: StateDir and AgentBinary are required")
	}
	if err := (idrange.Range{Base: o.UIDBase, Count: idrange.Count}).Validate(); err != nil {
		return nil, fmt.Errorf("oci driver: %w", err)
	}
	if o.RunscPath == "" {
		o.RunscPath = "runsc"
		if r, err := FindRunsc("", ""); err == nil {
			o.RunscPath, o.RunscLegacy = r.Path, r.Legacy
		}
	}
	runscArgs, err := runscFlags(&o.RunscPlatform, o.RunscLegacy)
	if err != nil {
		return nil, fmt.Errorf("oci driver: %w", err)
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 20 * time.Second
	}
	if o.RuncPath == "" {
		o.RuncPath = "runc"
	}
	if err := os.MkdirAll(o.StateDir, 0o711); err != nil {
		return nil, fmt.Errorf("oci driver: state dir: %w", err)
	}
	if _, err := os.Stat(o.AgentBinary); err != nil {
		return nil, fmt.Errorf("oci driver: agent binary: %w", err)
	}
	d := &Driver{opts: o, watches: map[string]*initWatch{}, oom: map[string]uint64{},
		waits: map[string]*cgroups.WaitCounter{}}
	d.sup = &supervisor.Client{Socket: SupervisorSocket(o.StateDir), Binary: o.AgentBinary}
	pruneStateRoots()
	d.runc = &runc.Runc{Command: o.RuncPath, Root: RuntimeRoot(o.StateDir, runtime.Runc), Setpgid: true}
	d.runsc = &runc.Runc{Command: o.RunscPath, Root: RuntimeRoot(o.StateDir, runtime.GVisor), Setpgid: true, ExtraArgs: runscArgs}
	return d, nil
}

// Close lets the supervisor of the driver's state dir exit if it has no
// sandbox left to reap (it stays otherwise, for the next control plane),
// and then removes the state dir's root under StateBase when nothing is
// left in it: a control plane that shuts down calls it. The driver keeps
// working; a later Start starts a supervisor again.
func (d *Driver) Close() error {
	ents, err := os.ReadDir(d.opts.StateDir)
	if err != nil {
		return d.sup.Close()
	}
	for _, e := range ents {
		if idPattern.MatchString(e.Name()) {
			return d.sup.Close() // a sandbox is kept: the supervisor stays
		}
	}
	if err := d.sup.CloseWait(5 * time.Second); err != nil {
		return err
	}
	return d.sup.Prune()
}

// StateBase holds the per-data-directory state roots (RuntimeRoot).
const StateBase = "/run/corral"

var stateRootPattern = regexp.MustCompile(`^[0-9a-f]{12}$`)

// pruneStateRoots removes the state roots under StateBase of every data
// directory (this one's included) that no supervisor serves and that
// hold nothing but empty directories: those of control planes that
// ended without their supervisor's cleanup (killed, or one that only
// listed sandboxes). supervisor.Client.Prune says why that cannot race
// a sandbox being made. TestStateRootsPruned is the regression test.
func pruneStateRoots() {
	ents, err := os.ReadDir(StateBase)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() || !stateRootPattern.MatchString(e.Name()) {
			continue
		}
		c := &supervisor.Client{Socket: filepath.Join(StateBase, e.Name(), "supervisor", "supervisor.sock")}
		_ = c.Prune()
	}
}

// GVisorLegacy reports whether gVisor sandboxes run under a legacy runsc
// (Options.RunscLegacy): network none, no volumes.
func (d *Driver) GVisorLegacy() bool { return d.opts.RunscLegacy }

func (d *Driver) dir(id string) string { return filepath.Join(d.opts.StateDir, id) }

// held returns nil if the driver holds sandbox id (its directory exists:
// Start makes it first, Stop removes it last), else an error wrapping
// runtime.ErrNotFound, as the Driver contract asks of every call on a
// sandbox but Stop and Alive. A caller can then tell "no such sandbox"
// from a failing runtime.
func (d *Driver) held(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("invalid sandbox id %q: %w", id, runtime.ErrNotFound)
	}
	if _, err := os.Lstat(d.dir(id)); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("sandbox %s: %w", id, runtime.ErrNotFound)
	}
	return nil
}
func (d *Driver) cgroupPath(id string) string { return CgroupParent + "/" + id }

func (d *Driver) binary(rt runtime.Runtime) *runc.Runc {
	if rt == runtime.GVisor {
		return d.runsc
	}
	return d.runc
}

// runtimeOf reads which runtime a sandbox was started with.
func (d *Driver) runtimeOf(id string) runtime.Runtime {
	b, err := os.ReadFile(filepath.Join(d.dir(id), "runtime"))
	if err == nil && runtime.Runtime(strings.TrimSpace(string(b))) == runtime.GVisor {
		return runtime.GVisor
	}
	return runtime.Runc
}

// Start prepares the sandbox's file systems and bundle and runs it.
func (d *Driver) Start(ctx context.Context, cfg runtime.Config) (h *runtime.Handle, err error) {
	if !idPattern.MatchString(cfg.ID) {
		return nil, fmt.Errorf("invalid sandbox id %q", cfg.ID)
	}
	if !cfg.Runtime.Valid() {
		return nil, fmt.Errorf("invalid runtime %q", cfg.Runtime)
	}
	dir := d.dir(cfg.ID)
	// Sandbox root (host uid/gid UIDBase) must reach the rootfs and its run
	// dir; no other host user may (the overlay holds setuid binaries owned
	// by that uid): root:UIDBase, mode 0710.
	if err := os.Mkdir(dir, 0o710); err != nil {
		return nil, fmt.Errorf("sandbox dir: %w", err)
	}
	if err := os.Chown(dir, 0, int(d.opts.UIDBase)); err != nil {
		return nil, fmt.Errorf("sandbox dir: %w", err)
	}
	defer func() {
		if err != nil {
			_ = d.Stop(context.WithoutCancel(ctx), cfg.ID, 0)
		}
	}()
	if err := os.WriteFile(filepath.Join(dir, "runtime"), []byte(cfg.Runtime), 0o600); err != nil {
		return nil, err
	}
	ph := runtime.PhasesFrom(ctx)
	t := time.Now()
	rootfs, runDir, err := d.prepareFS(dir, cfg)
	if err != nil {
		return nil, err
	}
	t = ph.Mark(runtime.PhaseMounts, t)
	in := specInput{
		cfg: cfg, rootfs: rootfs, runDir: runDir, agentBin: d.opts.AgentBinary,
		uidBase: d.opts.UIDBase, idRange: idrange.Count, cgroupDir: d.cgroupPath(cfg.ID),
	}
	if cfg.Runtime == runtime.GVisor {
		if in.tmpSource, err = gvisorTmpSource(rootfs); err != nil {
			return nil, err
		}
	}
	spec, err := buildSpec(in)
	if err != nil {
		return nil, err
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600); err != nil {
		return nil, fmt.Errorf("write bundle: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	ph.Mark(runtime.PhaseSpec, t)
	rc := d.starter(cfg)
	pid, err := d.runtimeStart(ctx, rc, cfg, dir, logf, ph)
	logf.Close()
	if err != nil {
		return nil, err
	}
	w, err := d.watchStarted(ctx, rc, cfg, pid, ph)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.watches[cfg.ID] = w
	d.mu.Unlock()
	if cfg.Runtime == runtime.GVisor {
		t := time.Now()
		if err := rc.Start(ctx, cfg.ID); err != nil {
			return nil, fmt.Errorf("%s start: %w%s", rc.Command, err, tail(filepath.Join(dir, "agent.log")))
		}
		ph.Mark(runtime.PhaseRuntime, t)
	}
	if err := d.waitAgent(ctx, cfg.ID, w.done, ph); err != nil {
		return nil, fmt.Errorf("%s run: %w%s", rc.Command, err, tail(filepath.Join(dir, "agent.log")))
	}
	d.mu.Lock()
	d.oom[cfg.ID] = 0
	d.mu.Unlock()
	go d.watchOOM(cfg.ID, w.done)
	return &runtime.Handle{ID: cfg.ID, Pid: pid}, nil
}

// runtimeStart runs the runtime under the supervisor and returns the
// host pid of the sandbox's init. No process stays per sandbox: the
// runtime exits, leaving the sandbox's processes to the supervisor (it
// reaps them, also across a control-plane restart); the init's stdout
// and stderr are agent.log (logf). The runtime gets its own process
// group (the supervisor sees to it), and no parent-death signal, so
// sandboxes outlive the server.
//
// runc makes and starts the container in one process, `runc run
// --detach` (a `runc create` then `runc start` cost a second start of
// the runc binary, about 8 ms of every create: docs/performance.md).
// runsc gets `create`; Start then runs `runsc start`, as runsc reads
// the sandbox's network flag at both.
//
// It records the runtime's process's life as runtime.PhaseRuntime, the
// rest of the supervisor's round trip as runtime.PhaseSupervisor.
func (d *Driver) runtimeStart(ctx context.Context, rc *runc.Runc, cfg runtime.Config, dir string, logf *os.File, ph *runtime.Phases) (int, error) {
	verb := []string{"run", "--detach"}
	if cfg.Runtime == runtime.GVisor {
		verb = []string{"create"}
	}
	// <runtime> <global flags> run --detach|create --bundle DIR --pid-file FILE ID
	argv := append(append(append([]string{rc.Command}, runtimeGlobalArgs(rc)...), verb...),
		"--bundle", dir, "--pid-file", filepath.Join(dir, pidFileName), cfg.ID)
	if !filepath.IsAbs(argv[0]) {
		p, err := exec.LookPath(argv[0])
		if err != nil {
			return 0, fmt.Errorf("find %s: %w", rc.Command, err)
		}
		argv[0] = p
	}
	// Not cancelled with ctx: a runtime left running could make the
	// container after the cleanup of a failed Start ran.
	t := time.Now()
	code, ran, err := d.sup.RunTimed(context.WithoutCancel(ctx), argv, logf)
	total := time.Since(t)
	ran = min(ran, total)
	ph.Add(runtime.PhaseRuntime, ran)
	ph.Add(runtime.PhaseSupervisor, total-ran)
	if err == nil && code != 0 {
		err = fmt.Errorf("exit status %d", code)
	}
	if err != nil {
		err = fmt.Errorf("%s %s: %w%s", rc.Command, verb[0], err, tail(filepath.Join(dir, "agent.log")))
		if runcKeyQuotaFull(err.Error()) {
			err = fmt.Errorf("%w: %w", runtime.ErrKeyQuota, err)
		}
		return 0, err
	}
	pid, err := readPidFile(filepath.Join(dir, pidFileName))
	if err != nil {
		// The runtime wrote no pid file (it should have): ask it.
		t := time.Now()
		st, serr := rc.State(ctx, cfg.ID)
		ph.Mark(runtime.PhaseState, t)
		if serr != nil {
			return 0, fmt.Errorf("%s state: %w", rc.Command, errors.Join(err, serr))
		}
		pid = st.Pid
	}
	return pid, nil
}

// watchStarted opens the watch of the init (pid) of sandbox cfg that
// runtimeStart just started, making sure the pidfd is of that init and
// not of a process that got its pid after it died. runsc's create
// leaves its init waiting for `runsc start`: it cannot have exited. A
// runc container runs at once and its init may already have exited and
// been reaped by the supervisor, and its pid reused; so the pidfd is
// kept only if, after it was opened, the pid is in the sandbox's own
// cgroup (no process outside the sandbox is; none of the sandbox's can
// get that pid, as its pid namespace makes no process once its init
// died) and the pidfd's process still exists (so that pid was it).
// Otherwise the runtime is asked, as for an adopted sandbox (watchOf).
// TestStartWatchesOwnInit is the regression test.
//
// It records its time as runtime.PhaseWatch, the runtime's answer as
// runtime.PhaseState.
func (d *Driver) watchStarted(ctx context.Context, rc *runc.Runc, cfg runtime.Config, pid int, ph *runtime.Phases) (*initWatch, error) {
	t := time.Now()
	w, err := d.watchInit(cfg.ID, pid)
	if err != nil {
		return nil, fmt.Errorf("%w%s", err, tail(filepath.Join(d.dir(cfg.ID), "agent.log")))
	}
	if cfg.Runtime == runtime.GVisor {
		ph.Mark(runtime.PhaseWatch, t)
		return w, nil
	}
	if p, ok := d.sandboxInit(cfg.ID); ok && p == pid && w.running() {
		ph.Mark(runtime.PhaseWatch, t)
		return w, nil
	}
	t = ph.Mark(runtime.PhaseWatch, t)
	// Asked after the pidfd was opened: the runtime reporting pid as its
	// running init (it checks the process's start time) means the pidfd
	// is of the init.
	st, err := rc.State(ctx, cfg.ID)
	ph.Mark(runtime.PhaseState, t)
	if err == nil && st.Pid == pid && st.Status == "running" {
		return w, nil
	}
	w.stop()
	return nil, fmt.Errorf("%w%s", errInitExited, tail(filepath.Join(d.dir(cfg.ID), "agent.log")))
}

// prepareFS mounts the size-capped tmpfs for the writable layer and the
// overlay root, and creates the agent's socket directory.
func (d *Driver) prepareFS(dir string, cfg runtime.Config) (rootfs, runDir string, err error) {
	uid := int(d.opts.UIDBase)
	disk := filepath.Join(dir, "disk")
	rootfs = filepath.Join(dir, "rootfs")
	runDir = filepath.Join(dir, "run")
	for _, p := range []string{disk, rootfs, runDir} {
		if err := os.Mkdir(p, 0o700); err != nil {
			return "", "", err
		}
	}
	size := cfg.Resources.DiskBytes
	inodes := size / 2048
	if inodes < 4096 {
		inodes = 4096
	}
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0755,uid=%d,gid=%d", size, inodes, uid, uid)
	if err := unix.Mount("tmpfs", disk, "tmpfs", unix.MS_NODEV|unix.MS_NOSUID, opts); err != nil {
		return "", "", fmt.Errorf("mount writable layer: %w", err)
	}
	if err := mountRunDir(runDir, uid); err != nil {
		return "", "", err
	}
	upper, work := filepath.Join(disk, "upper"), filepath.Join(disk, "work")
	for _, p := range []string{upper, work} {
		if err := os.Mkdir(p, 0o755); err != nil {
			return "", "", err
		}
	}
	if err := os.Chown(upper, uid, uid); err != nil {
		return "", "", err
	}
	lower := strings.Join(append(append([]string{}, cfg.Layers...), cfg.RootFS), ":")
	ov := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
	if err := unix.Mount("overlay", rootfs, "overlay", unix.MS_NODEV, ov); err != nil {
		return "", "", fmt.Errorf("mount overlay: %w", err)
	}
	if cfg.AccessToken != "" {
		// The directory was just created by us and is empty: no link to follow.
		tok := filepath.Join(runDir, TokenName)
		f, err := os.OpenFile(tok, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return "", "", fmt.Errorf("write access token: %w", err)
		}
		_, werr := f.WriteString(cfg.AccessToken)
		cerr := f.Close()
		if err := errors.Join(werr, cerr, os.Chown(tok, uid, uid)); err != nil {
			return "", "", fmt.Errorf("write access token: %w", err)
		}
	}
	return rootfs, runDir, nil
}

// Bounds of the agent's socket directory (RunDir in the sandbox).
const (
	runDirBytes  = 64 << 10
	runDirInodes = 16
)

// mountRunDir mounts a tiny tmpfs of its own on the agent's socket
// directory, owned by sandbox root (the agent creates its socket there).
//
// Sandbox root can write to that directory. On the data disk it could
// fill the host's disk past its sandbox's disk cap (`dd of=/run/corral/x`
// wrote 200 MiB from a 50 MiB sandbox); on a 64 KiB, 16-inode tmpfs the
// write fails with ENOSPC and host memory is charged at most 64 KiB.
// Stop unmounts it. TestRunDirIsCapped is the regression test.
func mountRunDir(dir string, uid int) error {
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700,uid=%d,gid=%d", runDirBytes, runDirInodes, uid, uid)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NODEV|unix.MS_NOSUID|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("mount agent socket dir: %w", err)
	}
	return nil
}

// pidFileName is the file in a sandbox's directory where the runtime
// writes its init's host pid (runc and runsc --pid-file) once the
// container exists, before the agent runs.
const pidFileName = "init.pid"

// readPidFile reads the pid the runtime wrote.
func readPidFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pid file holds %q", b)
	}
	return pid, nil
}

// Waits of waitAgent between attempts: agentPoll when nothing happened
// (inotify wakes it earlier when the pid file or the socket appears),
// agentRetry when the socket exists but refused (bound, not yet
// listening: the agent is microseconds from accepting).
const (
	agentPoll  = 5 * time.Millisecond
	agentRetry = 200 * time.Microsecond
)

// waitAgent waits until the agent socket accepts a connection, woken by
// inotify when the agent's socket appears in its socket directory, and
// records the wait as runtime.PhaseAgent. Without inotify it polls every
// agentPoll.
func (d *Driver) waitAgent(ctx context.Context, id string, exited <-chan struct{}, ph *runtime.Phases) error {
	t := time.Now()
	deadline := t.Add(d.opts.StartTimeout)
	dir := d.dir(id)
	w := newDirWatch(filepath.Join(dir, "run"))
	// Closing an inotify instance waits for an RCU grace period (about
	// 10 ms here): the start does not wait for it.
	defer func() { go w.close() }()
	for {
		c, err := d.Dial(ctx, id)
		if err == nil {
			c.Close()
			ph.Mark(runtime.PhaseAgent, t)
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-exited:
			return errInitExited
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		wait := agentPoll
		if errors.Is(err, unix.ECONNREFUSED) {
			wait = agentRetry
		}
		w.wait(wait)
	}
}

// dirWatch wakes a waiter when an entry is created in (or renamed into)
// one of its directories. Without a watch (no inotify instance left, say)
// the waiter polls every watchlessPoll.
type dirWatch struct{ f *os.File }

// watchlessPoll is the poll interval of a dirWatch that has no watch.
const watchlessPoll = time.Millisecond

func newDirWatch(dirs ...string) *dirWatch {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return &dirWatch{}
	}
	for _, dir := range dirs {
		if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_ONLYDIR|unix.IN_DONT_FOLLOW); err != nil {
			unix.Close(fd)
			return &dirWatch{}
		}
	}
	// Non-blocking: the runtime poller serves it, so reads honour a deadline.
	return &dirWatch{f: os.NewFile(uintptr(fd), "inotify")}
}

// wait returns after an event or timeout, whichever is first.
func (w *dirWatch) wait(timeout time.Duration) {
	if w.f == nil {
		time.Sleep(min(timeout, watchlessPoll))
		return
	}
	var buf [4096]byte
	_ = w.f.SetReadDeadline(time.Now().Add(timeout))
	if _, err := w.f.Read(buf[:]); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		time.Sleep(timeout) // a broken watch must not spin
	}
}

func (w *dirWatch) close() {
	if w.f != nil {
		w.f.Close()
	}
}

// Dial connects to the sandbox's agent socket.
//
// Code inside the sandbox controls the socket directory: root in the
// sandbox could replace agent.sock with a symlink to a host socket (a
// container runtime's, say) so that the control plane would connect there
// on its behalf. Dial therefore opens the path with O_PATH|O_NOFOLLOW,
// checks it is a socket, and connects through /proc/self/fd, so no symlink
// is ever followed. TestDialRefusesSymlinkedSocket is the regression test.
func (d *Driver) Dial(ctx context.Context, id string) (net.Conn, error) {
	if err := d.held(id); err != nil {
		return nil, err
	}
	return dialNoFollow(ctx, filepath.Join(d.dir(id), "run", SocketName))
}

func dialNoFollow(ctx context.Context, path string) (net.Conn, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open agent socket: %w", err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("agent socket %s is not a socket", filepath.Base(path))
	}
	var dl net.Dialer
	return dl.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
}

// NetNS returns /proc/PID/ns/net of a runc sandbox's init.
func (d *Driver) NetNS(ctx context.Context, id string) (string, error) {
	if err := d.held(id); err != nil {
		return "", err
	}
	if d.runtimeOf(id) == runtime.GVisor {
		return "", errors.New("a gVisor sandbox's network is fixed when it starts")
	}
	if pid, ok := d.sandboxInit(id); ok {
		return fmt.Sprintf("/proc/%d/ns/net", pid), nil
	}
	st, err := d.runc.State(ctx, id)
	if err != nil {
		return "", fmt.Errorf("runc state %s: %w", id, err)
	}
	if st.Pid <= 0 {
		return "", fmt.Errorf("sandbox %s has no init process", id)
	}
	return fmt.Sprintf("/proc/%d/ns/net", st.Pid), nil
}

// sandboxInit returns the host pid of sandbox id's init from the pid file
// the runtime wrote, without running the runtime (`runc state` costs a
// few milliseconds of every network create). The pid is trusted only
// while it names a process in the sandbox's own cgroup: if the init died
// and its pid went to a host process, that process's namespace (the
// host's network, say) would otherwise get the sandbox's veth pair. Any
// process in the sandbox's cgroup is in the sandbox's network namespace:
// it descends from the init, and sandbox root has no CAP_SYS_ADMIN to
// make another. ok is false when the file or the check says nothing
// (the caller asks the runtime).
func (d *Driver) sandboxInit(id string) (int, bool) {
	pid, err := readPidFile(filepath.Join(d.dir(id), pidFileName))
	if err != nil {
		return 0, false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return 0, false
	}
	want := d.cgroupPath(id)
	for _, line := range strings.Split(string(b), "\n") {
		// hierarchy-id:controllers:path; the path is the sandbox's cgroup.
		if parts := strings.SplitN(line, ":", 3); len(parts) == 3 && parts[2] == want {
			return pid, true
		}
	}
	return 0, false
}

// Alive reports whether the sandbox's init is running (or paused). It
// reads the init's watch; only the first call on a sandbox this instance
// did not start asks the runtime.
func (d *Driver) Alive(id string) bool {
	w := d.watchOf(context.Background(), id)
	return w != nil && !w.exited()
}

// Pause freezes the sandbox with the cgroup freezer (runc/runsc pause).
func (d *Driver) Pause(ctx context.Context, id string) error {
	if err := d.held(id); err != nil {
		return err
	}
	rt := d.runtimeOf(id)
	rc := d.binary(rt)
	// runc's cgroup v1 freeze gives up (freezeGaveUp) after a few
	// hundred milliseconds of FREEZING and thaws the sandbox back, while
	// a busy sandbox throttled at its CPU quota on a loaded host reaches
	// the freezer only once its quota refills: such a pause is retried,
	// for up to freezeTimeout. TestConformance/runc/PauseThrottled is
	// the regression test.
	deadline := time.Now().Add(freezeTimeout)
	for {
		err := rc.Pause(ctx, id)
		if err == nil {
			break
		}
		if !freezeGaveUp(err) || time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s pause %s: %w", rc.Command, id, err)
		}
	}
	if rt == runtime.GVisor {
		return d.freezeGVisor(ctx, id)
	}
	return nil
}

// runcFreezeGaveUp is runc's message when its cgroup v1 freeze stayed
// FREEZING through all its tries and it thawed the cgroup back
// (libcontainer/cgroups/fs/freezer.go). The retry in Pause must match the
// message, a string: runc gives no other signal of that case (it exits 1,
// as for every error, and leaves the freezer THAWED, as a pause never
// tried). TestRuncFreezeWording fails when the runc in use no longer
// says it, so that a runc upgrade that rewords it cannot silently turn
// the retry off.
const runcFreezeGaveUp = "unable to freeze"

// freezeGaveUp reports whether a runc pause failed because runc's freezer
// gave up on a sandbox that did not freeze in time (runcFreezeGaveUp):
// go-runc's error carries what runc wrote to stderr.
func freezeGaveUp(err error) bool {
	return err != nil && strings.Contains(err.Error(), runcFreezeGaveUp)
}

// Resume thaws a paused sandbox.
func (d *Driver) Resume(ctx context.Context, id string) error {
	if err := d.held(id); err != nil {
		return err
	}
	return d.resume(ctx, id, d.runtimeOf(id))
}

// resume thaws a paused sandbox of runtime rt: a gVisor sandbox's
// kernel first (freezeGVisor), then its tasks.
func (d *Driver) resume(ctx context.Context, id string, rt runtime.Runtime) error {
	rc := d.binary(rt)
	if rt == runtime.GVisor {
		if err := d.thawGVisor(id); err != nil {
			return err
		}
	}
	if err := rc.Resume(ctx, id); err != nil {
		return fmt.Errorf("%s resume %s: %w", rc.Command, id, err)
	}
	return nil
}

// Stats reads the sandbox's cgroup.
func (d *Driver) Stats(id string) (runtime.Stats, error) {
	g := cgroups.Open(d.cgroupPath(id))
	var s runtime.Stats
	n, read, err := d.oomKills(id, g)
	s.OOMKills = n
	if err != nil || !read {
		return s, err
	}
	s.MemoryBytes, _ = g.MemoryBytes()
	s.Pids, _ = g.Pids()
	s.CPUSeconds, s.CPUWaitSeconds, s.Time = d.cpu(id, g)
	var fs unix.Statfs_t
	if err := unix.Statfs(filepath.Join(d.dir(id), "disk"), &fs); err == nil {
		s.DiskBytes = int64(fs.Blocks-fs.Bfree) * int64(fs.Bsize)
	}
	return s, nil
}

// OOMKills reads the sandbox's OOM-kill count alone: what Stats reports
// as OOMKills, without the other reads (the manager takes it before and
// after every command).
func (d *Driver) OOMKills(id string) (uint64, error) {
	n, _, err := d.oomKills(id, cgroups.Open(d.cgroupPath(id)))
	return n, err
}

// oomKills returns the OOM-kill count of sandbox id (cgroup g), never less
// than a count seen before; read is false when the cgroup could not be
// read and the count is the last one seen.
func (d *Driver) oomKills(id string, g cgroups.Group) (n uint64, read bool, err error) {
	d.mu.Lock()
	seen, watched := d.oom[id]
	d.mu.Unlock()
	if n, err = g.OOMKills(); err != nil {
		if watched {
			return seen, false, nil
		}
		if herr := d.held(id); herr != nil {
			return 0, false, herr
		}
		return 0, false, fmt.Errorf("read cgroup of %s: %w", id, err)
	}
	n = max(n, seen)
	if !watched {
		d.adoptOOM(id, n)
	} else if n > seen {
		// A count seen here is kept, whatever the watch saw: the
		// sandbox may die (and its cgroup go, or be left empty) before
		// the watch's next read, and a later Stats must not report
		// fewer kills than this one did.
		d.mu.Lock()
		if v, ok := d.oom[id]; ok && n > v {
			d.oom[id] = n
		}
		d.mu.Unlock()
	}
	return n, true, nil
}

// cpu reads the sandbox's CPU time and its run-delay counter back to
// back, and the time between the two reads. When the threads cannot be
// listed the counter keeps its value (a drop to 0 and back would read as
// a burst of demand); a sandbox whose threads were never listed (its
// cgroup is gone) gets no counter, so a Stats racing Stop leaves nothing
// behind.
func (d *Driver) cpu(id string, g cgroups.Group) (used, wait float64, at time.Time) {
	tids, terr := g.Threads()
	d.mu.Lock()
	c := d.waits[id]
	if c == nil && terr == nil {
		c = cgroups.NewWaitCounter()
		d.waits[id] = c
	}
	d.mu.Unlock()
	used, _ = g.CPUSeconds()
	at = time.Now()
	switch {
	case c == nil:
	case terr != nil:
		wait = c.Total()
	default:
		wait = c.Update(tids)
	}
	return used, wait, at
}

// Stop kills every process of the sandbox and removes all it held.
func (d *Driver) Stop(ctx context.Context, id string, grace time.Duration) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("invalid sandbox id %q", id)
	}
	ctx = context.WithoutCancel(ctx)
	rt := d.runtimeOf(id)
	rc := d.binary(rt)
	var errs []error
	var exited <-chan struct{}
	if w := d.watchOf(ctx, id); w != nil {
		exited = w.done
	}
	if st, err := rc.State(ctx, id); err == nil {
		if st.Status == "paused" {
			// Frozen processes cannot act on SIGTERM; thaw them first.
			_ = d.resume(ctx, id, rt)
		}
		if grace > 0 {
			_ = rc.Kill(ctx, id, int(syscall.SIGTERM), &runc.KillOpts{All: true})
			d.waitEmpty(id, exited, grace)
		}
		_ = rc.Kill(ctx, id, int(syscall.SIGKILL), &runc.KillOpts{All: true})
		d.waitEmpty(id, exited, 10*time.Second)
		if _, err := rc.State(ctx, id); err == nil {
			if err := rc.Delete(ctx, id, &runc.DeleteOpts{Force: true}); err != nil {
				errs = append(errs, fmt.Errorf("%s delete: %w", rc.Command, err))
			}
		}
	}
	if exited != nil {
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			errs = append(errs, fmt.Errorf("init of %s did not exit", id))
		}
	}
	dir := d.dir(id)
	for _, m := range []string{filepath.Join(dir, "rootfs"), filepath.Join(dir, "disk"), filepath.Join(dir, "run")} {
		if err := unmount(m); err != nil {
			errs = append(errs, err)
		}
	}
	if err := d.removeCgroups(id); err != nil {
		errs = append(errs, err)
	}
	d.mu.Lock()
	delete(d.waits, id)
	d.mu.Unlock()
	if len(errs) == 0 {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("remove sandbox dir: %w", err))
		}
	}
	// After the directory is gone, so that a Stats racing this Stop
	// cannot record the sandbox again (adoptOOM checks it under mu).
	d.mu.Lock()
	delete(d.oom, id)
	if len(errs) == 0 {
		delete(d.watches, id)
	}
	d.mu.Unlock()
	return errors.Join(errs...)
}

// waitEmpty waits until the sandbox's cgroup holds no process and its
// init (when watched) has exited, or until timeout.
func (d *Driver) waitEmpty(id string, exited <-chan struct{}, timeout time.Duration) {
	g := cgroups.Open(d.cgroupPath(id))
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		procs, err := g.Procs()
		empty := err != nil || len(procs) == 0
		done := exited == nil
		if !done {
			select {
			case <-exited:
				done = true
			default:
			}
		}
		if empty && done {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// removeCgroups removes cgroup directories the runtime left behind.
func (d *Driver) removeCgroups(id string) error {
	g := cgroups.Open(d.cgroupPath(id))
	var errs []error
	for _, dir := range g.Dirs() {
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// unmount unmounts path if something is mounted there.
func unmount(path string) error {
	for i := 0; i < 50; i++ {
		err := unix.Unmount(path, 0)
		if err == nil {
			continue // unmount stacked mounts too
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil // not a mount point (any more)
		}
		if errors.Is(err, unix.EBUSY) {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		return fmt.Errorf("unmount %s: %w", filepath.Base(path), err)
	}
	return fmt.Errorf("unmount %s: still busy", filepath.Base(path))
}

// List returns ids found in the state dir or known to either runtime.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	ents, err := os.ReadDir(d.opts.StateDir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if idPattern.MatchString(e.Name()) {
			seen[e.Name()] = true
		}
	}
	for _, rc := range []*runc.Runc{d.runc, d.runsc} {
		if _, err := exec.LookPath(rc.Command); err != nil {
			continue
		}
		cs, err := rc.List(ctx)
		if err != nil {
			continue
		}
		for _, c := range cs {
			seen[c.ID] = true
		}
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	return ids, nil
}

// runtimeGlobalArgs returns the global flags go-runc passes to rc.
func runtimeGlobalArgs(rc *runc.Runc) []string {
	return append([]string{"--root", rc.Root}, rc.ExtraArgs...)
}

// tail returns the last lines of a log file for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 800 {
		b = b[len(b)-800:]
	}
	return ": " + strings.TrimSpace(string(b))
}

// AgentLog returns the last lines the sandbox's init and runtime wrote
// (for diagnosing a sandbox that died).
func (d *Driver) AgentLog(id string) string {
	if !idPattern.MatchString(id) {
		return ""
	}
	return strings.TrimPrefix(tail(filepath.Join(d.dir(id), "agent.log")), ": ")
}

// runcKeyQuotaFull reports whether text, a runtime's failure with its
// log tail, is runc's "unable to create session key: disk quota
// exceeded" (EDQUOT from add_key): the kernel's per-user key quota,
// which the server checks at start (internal/server keyquota.go) but an
// operator can lower later, is full. runc says so only in text, so it is
// recognised here, in the driver that runs runc, and reported as
// runtime.ErrKeyQuota: it defends against a known capacity condition
// answered as a server fault.
func runcKeyQuotaFull(text string) bool {
	return strings.Contains(text, "session key") && strings.Contains(text, "disk quota exceeded")
}
