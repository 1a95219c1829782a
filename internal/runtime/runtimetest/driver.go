// Package runtimetest is a fake runtime.Driver for unit tests: it keeps
// the Driver contract in memory (started, paused, dead and stopped
// sandboxes, stats a test sets, processes, snapshots, List for adoption)
// and serves each sandbox's agent in process, over in-memory
// connections, so that the sandbox Manager and the API can be tested in
// seconds without root, runc or a kernel feature.
//
// The fake agent never executes anything on the host: a process start is
// answered from a scripted table of responders (see Command, Result and
// Driver.Respond), and files live in an in-memory map. It checks the
// access token as the real agent does.
//
// Typical use, in a test of the Manager:
//
//	d := runtimetest.New()
//	d.RespondLine("make test", runtimetest.Result{Stdout: "ok\n"})
//	m := sandbox.New(cfg, st, d, templates, log)
//	sb, _ := m.Create(ctx, sandbox.CreateRequest{})
//	d.OOM(sb.ID) // the watcher ends it with reason "oom"
//
// Where it differs from the real drivers: Stop ignores the grace (there
// is nothing to SIGTERM); NetNS always fails; a paused agent holds new
// requests but not the processes already running. Like them, calls on an
// id it does not hold fail wrapping runtime.ErrNotFound (the contract,
// checked of the real drivers by runtime/drivertest).
//
// It is a test seam, not a sandbox: code that needs isolation, limits or
// the real agent's behaviour is tested against the real drivers.
package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/corralhq/corral/internal/runtime"
)

// State is a fake sandbox's state as the driver holds it.
type State string

// The states of a held sandbox. A stopped sandbox is not held at all.
const (
	// Running: the agent answers.
	Running State = "running"
	// Paused: frozen; the agent accepts connections but answers nothing
	// until Resume.
	Paused State = "paused"
	// Dead: the init exited (Kill, OOM); the driver still holds its state
	// until Stop, as the real drivers hold a dead sandbox's directories.
	Dead State = "dead"
)

// idPattern is the real driver's (internal/runtime/oci): ids outside it
// are refused by Start and Stop.
var idPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,39}$`)

// Driver is an in-memory runtime.Driver. The zero value is not usable;
// call New.
type Driver struct {
	mu sync.Mutex
	// boxes are the held sandboxes by id; guarded by mu.
	boxes map[string]*box
	// nextPid numbers inits and processes; guarded by mu.
	nextPid int
	// responders are tried newest first; guarded by mu.
	responders []Responder
	// startHook, when set, can refuse a Start; guarded by mu.
	startHook func(runtime.Config) error
	// stopHook, when set, runs first in every Stop; guarded by mu.
	stopHook func(id string)
	// starts and stops count calls (for assertions); guarded by mu.
	starts, stops int
	// dials counts agent connections by sandbox id; guarded by mu.
	dials map[string]int
}

var _ runtime.Driver = (*Driver)(nil)

// New returns an empty fake driver.
func New() *Driver {
	return &Driver{boxes: map[string]*box{}, nextPid: 100}
}

// box is one held sandbox.
type box struct {
	cfg   runtime.Config
	pid   int
	state State
	stats runtime.Stats
	agent *agent
	// created is when Start returned.
	created time.Time
}

// notFound is the error for an id the driver does not hold.
func notFound(id string) error {
	return fmt.Errorf("sandbox %q: %w", id, runtime.ErrNotFound)
}

// OnStart makes every later Start call hook first; a non-nil error
// refuses the start (nothing is held). nil removes the hook.
func (d *Driver) OnStart(hook func(runtime.Config) error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.startHook = hook
}

// OnStop makes every later Stop call hook(id) first (a test can hold a
// stop in flight); nil removes the hook.
func (d *Driver) OnStop(hook func(id string)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopHook = hook
}

// Start holds a new running sandbox and starts its fake agent. Like the
// real driver it refuses an invalid id or runtime and an id it holds.
func (d *Driver) Start(ctx context.Context, cfg runtime.Config) (*runtime.Handle, error) {
	if !idPattern.MatchString(cfg.ID) {
		return nil, fmt.Errorf("invalid sandbox id %q", cfg.ID)
	}
	if !cfg.Runtime.Valid() {
		return nil, fmt.Errorf("invalid runtime %q", cfg.Runtime)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	hook := d.startHook
	d.mu.Unlock()
	if hook != nil {
		if err := hook(cfg); err != nil {
			return nil, err
		}
	}
	files, err := loadLayers(cfg)
	if err != nil {
		return nil, fmt.Errorf("fake start %s: %w", cfg.ID, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.boxes[cfg.ID]; ok {
		return nil, fmt.Errorf("sandbox dir: %s exists", cfg.ID)
	}
	d.nextPid++
	b := &box{cfg: cloneConfig(cfg), pid: d.nextPid, state: Running, created: time.Now()}
	b.agent = newAgent(d, cfg, files)
	d.boxes[cfg.ID] = b
	d.starts++
	return &runtime.Handle{ID: cfg.ID, Pid: b.pid}, nil
}

func cloneConfig(c runtime.Config) runtime.Config {
	out := c
	out.Layers = slices.Clone(c.Layers)
	out.Files = slices.Clone(c.Files)
	out.Volumes = slices.Clone(c.Volumes)
	if c.Env != nil {
		out.Env = make(map[string]string, len(c.Env))
		for k, v := range c.Env {
			out.Env[k] = v
		}
	}
	return out
}

// Stop ends every process of the sandbox and forgets it: afterwards the
// driver holds nothing of it (List, Alive, Dial and Stats no longer see
// it). Stopping an unknown or stopped sandbox is not an error; an invalid
// id is, as for the real driver.
func (d *Driver) Stop(ctx context.Context, id string, grace time.Duration) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("invalid sandbox id %q", id)
	}
	d.mu.Lock()
	hook := d.stopHook
	d.mu.Unlock()
	if hook != nil {
		hook(id)
	}
	d.mu.Lock()
	b, ok := d.boxes[id]
	delete(d.boxes, id)
	d.stops++
	d.mu.Unlock()
	if ok {
		b.agent.shutdown()
	}
	return nil
}

// List returns the ids of every held sandbox (running, paused or dead).
func (d *Driver) List(ctx context.Context) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ids := make([]string, 0, len(d.boxes))
	for id := range d.boxes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}

// Dial connects to the sandbox's agent over an in-memory connection. A
// dead sandbox refuses the connection; a paused one accepts it, and its
// agent answers once the sandbox is resumed.
func (d *Driver) Dial(ctx context.Context, id string) (net.Conn, error) {
	d.mu.Lock()
	b, ok := d.boxes[id]
	var a *agent
	if ok && b.state != Dead {
		a = b.agent
	}
	d.mu.Unlock()
	if !ok {
		return nil, notFound(id)
	}
	if a == nil {
		return nil, fmt.Errorf("dial agent of %s: connection refused (sandbox init exited)", id)
	}
	d.mu.Lock()
	if d.dials == nil {
		d.dials = map[string]int{}
	}
	d.dials[id]++
	d.mu.Unlock()
	return a.dial(ctx)
}

// Dials returns how many connections to sandbox id's agent were dialled.
func (d *Driver) Dials(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dials[id]
}

// Stats returns the stats the test set (SetStats, OOM, OOMKillCommands).
// A dead sandbox still reports them, as the real driver reports the OOM
// kills it saw, until Stop.
func (d *Driver) Stats(id string) (runtime.Stats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.boxes[id]
	if !ok {
		return runtime.Stats{}, notFound(id)
	}
	s := b.stats
	s.Time = time.Now()
	return s, nil
}

// Alive reports whether the sandbox's init runs (running or paused).
func (d *Driver) Alive(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.boxes[id]
	return ok && b.state != Dead
}

// Pause freezes a running sandbox. Pausing a paused or dead sandbox is an
// error, as runc's is.
func (d *Driver) Pause(ctx context.Context, id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.boxes[id]
	if !ok {
		return notFound(id)
	}
	if b.state != Running {
		return fmt.Errorf("fake pause %s: container not running (%s)", id, b.state)
	}
	b.state = Paused
	b.agent.freeze()
	return nil
}

// Resume thaws a paused sandbox; resuming one that is not paused is an
// error, as runc's is.
func (d *Driver) Resume(ctx context.Context, id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.boxes[id]
	if !ok {
		return notFound(id)
	}
	if b.state != Paused {
		return fmt.Errorf("fake resume %s: container not paused (%s)", id, b.state)
	}
	b.state = Running
	b.agent.thaw()
	return nil
}

// NetNS fails: the fake has no network namespaces (as a gVisor sandbox's
// network is fixed at start). Tests of networking use the real driver.
func (d *Driver) NetNS(ctx context.Context, id string) (string, error) {
	if !d.holds(id) {
		return "", notFound(id)
	}
	return "", errors.New("the fake driver has no network namespaces")
}

// Processes lists the init (the agent, pid the Handle's) and the fake
// agent's running processes.
func (d *Driver) Processes(id string) ([]runtime.Process, error) {
	d.mu.Lock()
	b, ok := d.boxes[id]
	var pid int
	var a *agent
	var st State
	if ok {
		pid, a, st = b.pid, b.agent, b.state
	}
	d.mu.Unlock()
	if !ok {
		return nil, notFound(id)
	}
	if st == Dead {
		return nil, fmt.Errorf("sandbox %s has no init process", id)
	}
	state := "S"
	if st == Paused {
		state = "D"
	}
	out := []runtime.Process{{Pid: pid, PPid: 1, UID: 0, User: "root", State: state, Command: "/corral agent"}}
	for _, p := range a.procs.running() {
		uid, user := 1000, "user"
		if p.cmd.User == "root" {
			uid, user = 0, "root"
		}
		out = append(out, runtime.Process{Pid: int(p.pid), PPid: pid, UID: uid, User: user, State: state, Command: clip(p.cmd.Line(), 1024)})
	}
	return out, nil
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// Snapshot writes the files the sandbox changed since it started (its
// writable layer) under the new directory dst, with a marker file naming
// the sandbox and the paths it removed; a sandbox started with dst in
// its Layers sees those files. A paused sandbox stays paused. dst must
// not exist, as for the real driver.
func (d *Driver) Snapshot(ctx context.Context, id, dst string) (int64, error) {
	d.mu.Lock()
	b, ok := d.boxes[id]
	var a *agent
	if ok && b.state != Dead {
		a = b.agent
	}
	d.mu.Unlock()
	if !ok {
		return 0, notFound(id)
	}
	if a == nil {
		return 0, fmt.Errorf("state of %s: sandbox init exited", id)
	}
	return a.files.writeLayer(id, dst)
}

// holds reports whether id is held.
func (d *Driver) holds(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.boxes[id]
	return ok
}

// Test controls.

// Kill makes the sandbox's init exit (a crash): the agent's connections
// break, Alive is false, and the driver keeps the sandbox (dead) until
// Stop. It reports whether the sandbox was alive.
func (d *Driver) Kill(id string) bool {
	return d.die(id, false)
}

// OOM is Kill at the memory limit: the sandbox's OOM-kill count goes up
// by one first, so that its Stats say why it died.
func (d *Driver) OOM(id string) bool {
	return d.die(id, true)
}

func (d *Driver) die(id string, oom bool) bool {
	d.mu.Lock()
	b, ok := d.boxes[id]
	alive := ok && b.state != Dead
	if alive {
		if oom {
			b.stats.OOMKills++
		}
		b.state = Dead
	}
	d.mu.Unlock()
	if alive {
		b.agent.shutdown()
	}
	return alive
}

// OOMKillCommands is the memory limit killing the sandbox's commands but
// not its init: the OOM-kill count goes up by one and every running
// process ends with SIGKILL. It returns how many processes it ended.
func (d *Driver) OOMKillCommands(id string) int {
	d.mu.Lock()
	b, ok := d.boxes[id]
	if ok {
		b.stats.OOMKills++
	}
	d.mu.Unlock()
	if !ok {
		return 0
	}
	return b.agent.procs.killAll()
}

// SetStats sets what Stats reports for the sandbox (its Time is set by
// Stats). It reports whether the sandbox is held.
func (d *Driver) SetStats(id string, s runtime.Stats) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.boxes[id]
	if ok {
		b.stats = s
	}
	return ok
}

// StateOf returns the sandbox's state, or "" if the driver does not hold it.
func (d *Driver) StateOf(id string) State {
	d.mu.Lock()
	defer d.mu.Unlock()
	if b, ok := d.boxes[id]; ok {
		return b.state
	}
	return ""
}

// Config returns the configuration a held sandbox was started with.
func (d *Driver) Config(id string) (runtime.Config, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.boxes[id]
	if !ok {
		return runtime.Config{}, false
	}
	return cloneConfig(b.cfg), true
}

// Starts counts the sandboxes Start has started so far.
func (d *Driver) Starts() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.starts
}

// Stops counts the Stop calls made so far (of any id).
func (d *Driver) Stops() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stops
}

// ReadFile returns a file of a held sandbox's in-memory filesystem.
func (d *Driver) ReadFile(id, path string) ([]byte, bool) {
	d.mu.Lock()
	b, ok := d.boxes[id]
	d.mu.Unlock()
	if !ok {
		return nil, false
	}
	return b.agent.files.read(path)
}

// WriteFile puts a file into a held sandbox's in-memory filesystem (as
// if code in the sandbox wrote it).
func (d *Driver) WriteFile(id, path string, data []byte) bool {
	d.mu.Lock()
	b, ok := d.boxes[id]
	d.mu.Unlock()
	if !ok {
		return false
	}
	return b.agent.files.write(path, data, "user") == nil
}

// Commands returns the commands the sandbox's agent was asked to start,
// oldest first.
func (d *Driver) Commands(id string) []Command {
	d.mu.Lock()
	b, ok := d.boxes[id]
	d.mu.Unlock()
	if !ok {
		return nil
	}
	return b.agent.procs.history()
}
