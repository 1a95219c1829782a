// Package runtime defines the contract between the sandbox manager and the
// isolation technology that runs a sandbox. Drivers (runtime/oci for runc
// and runsc; later a Kubernetes driver) know nothing of HTTP or the store:
// they start a sandbox whose agent listens on a socket, report what they
// hold, and tear a sandbox down completely.
package runtime

import (
	"context"
	"errors"
	"net"
	"time"
)

// Runtime names an OCI runtime a sandbox runs under.
type Runtime string

// The runtimes corral supports.
const (
	// Runc is the default runtime: Linux namespaces, cgroups and seccomp.
	Runc Runtime = "runc"
	// GVisor is runsc, gVisor's user-space kernel: a stronger boundary at
	// some cost in syscall speed and compatibility.
	GVisor Runtime = "gvisor"
)

// Valid reports whether r names a supported runtime.
func (r Runtime) Valid() bool { return r == Runc || r == GVisor }

// Resources are the hard limits of one sandbox, applied by cgroups, rlimits
// and the size of the writable layer.
type Resources struct {
	// CPU is the CPU quota in cores (0.5 = half a core).
	CPU float64
	// MemoryBytes limits memory; swap is limited to the same value so the
	// sandbox cannot escape the limit into swap.
	MemoryBytes int64
	// DiskBytes caps the writable layer (the tmpfs under the overlay).
	DiskBytes int64
	// Pids caps the number of tasks (processes and threads).
	Pids int64
	// Nofile is RLIMIT_NOFILE for every process.
	Nofile int64
}

// Config describes a sandbox to start.
type Config struct {
	// ID is the sandbox id: [a-z0-9], at most 32 characters.
	ID string
	// Runtime selects runc or gVisor.
	Runtime Runtime
	// RootFS is the template's read-only root filesystem (the overlay's
	// lower layer). Its files are owned by the shifted uid range.
	RootFS string
	// Layers are snapshot layers stacked on RootFS, top-most first.
	Layers []string
	// Resources are the sandbox's limits.
	Resources Resources
	// Env is passed to every process started in the sandbox.
	Env map[string]string
	// NoNewPrivileges is set for templates that do not offer sudo.
	NoNewPrivileges bool
	// DefaultUser is the user commands run as when the caller names none.
	DefaultUser string
	// AccessToken, when set, is required by the agent on every request
	// (header X-Access-Token).
	AccessToken string
	// Files are host files bind-mounted read-only into the sandbox
	// (resolv.conf, the egress CA bundle).
	Files []FileBind
	// Volumes are host directories (mounted volumes) bind-mounted
	// read-write, nosuid and nodev.
	Volumes []FileBind
	// Template and Team name the sandbox's template (name or
	// name:version) and owning team, for drivers that label what they
	// start (the kube driver's Pod labels and image choice).
	Template, Team string
	// NetNS, for a gVisor sandbox with a network, is the path of the
	// network namespace prepared with its veth pair: gVisor's network
	// stack takes its interfaces over when it starts (it cannot be given
	// one later). "" gives the sandbox a namespace of its own with
	// loopback only. A runc sandbox gets its veth pair after it starts,
	// in the namespace runc made, and must leave this "".
	NetNS string
	// Egress says the sandbox may reach the egress proxy (its network
	// mode is not none and the proxy is remote, as under --driver kube):
	// a driver whose network isolation is not the host gateway's admits
	// the sandbox to the proxy at the network level only then (the kube
	// driver's Pod label the NetworkPolicy selects).
	Egress bool
	// TrustCA is the egress CA's certificate (PEM, the public part only)
	// for a sandbox that uses secrets, for drivers that cannot bind-mount
	// Files into the sandbox: the kube driver hands it to the agent,
	// which installs it where Files would have put it.
	TrustCA []byte
}

// FileBind mounts the host file Source read-only at Destination.
type FileBind struct {
	Source      string
	Destination string
}

// Handle is a running sandbox as the driver sees it.
type Handle struct {
	// ID is the sandbox id.
	ID string
	// Pid is the host pid of the sandbox's init (the agent).
	Pid int
}

// Stats is a point-in-time reading of a sandbox's cgroup.
type Stats struct {
	// OOMKills counts processes the kernel killed at the memory limit.
	OOMKills uint64
	// MemoryBytes is current memory use.
	MemoryBytes int64
	// Pids is the current number of tasks.
	Pids int64
	// CPUSeconds is the CPU time used since start.
	CPUSeconds float64
	// CPUWaitSeconds is the time the sandbox's threads have been runnable
	// but not running (waiting for a CPU, or throttled at the CPU quota),
	// summed over threads, since the driver first read it; 0 if the
	// driver cannot tell. With CPUSeconds it gives the sandbox's CPU
	// demand, which the watchdog's runaway rule compares with its quota.
	CPUWaitSeconds float64
	// DiskBytes is what the writable layer holds.
	DiskBytes int64
	// Time is when CPUSeconds and CPUWaitSeconds were read (zero if the
	// driver does not say). Rates are computed over these times: a
	// reading stamped after a call that was preempted on a busy host
	// would be off by the delay.
	Time time.Time
}

// ErrNotFound is returned (wrapped) for a sandbox the driver does not
// hold: never started, or stopped.
var ErrNotFound = errors.New("sandbox not found in runtime")

// Driver starts and stops sandboxes. Implementations must make Stop total:
// when it returns nil no process, mount, cgroup, namespace or file of the
// sandbox is left on the host.
//
// Calls on a sandbox the driver does not hold (Dial, Stats, Pause,
// Resume, NetNS, Processes, Snapshot) return an error wrapping
// ErrNotFound; Stop of it returns nil and Alive false. A new instance of
// a driver over the same state (a control plane restarted) holds the
// sandboxes the old one started, running or paused: List has them and
// every call works on them.
//
// Every driver must pass the conformance suite, package
// runtime/drivertest (docs/ARCHITECTURE.md, "The driver contract").
type Driver interface {
	// Start creates and starts a sandbox and returns once its agent is
	// accepting connections.
	Start(ctx context.Context, cfg Config) (*Handle, error)
	// Stop terminates every process of the sandbox (SIGTERM, then SIGKILL of
	// the whole sandbox after grace) and removes everything it held on the
	// host. Stopping an unknown or already stopped sandbox is not an error.
	Stop(ctx context.Context, id string, grace time.Duration) error
	// List returns the ids of every sandbox the driver finds on the host,
	// running or half torn down, so that orphans can be reclaimed.
	List(ctx context.Context) ([]string, error)
	// Dial connects to the sandbox's agent.
	Dial(ctx context.Context, id string) (net.Conn, error)
	// Stats reads the sandbox's cgroup counters. OOMKills counts every
	// kill at the memory limit since Start, including one that ended the
	// whole sandbox (under gVisor the kernel kills the sandbox's one host
	// process): it stays readable after the sandbox died, until Stop, so
	// that the control plane can record why it ended. For a sandbox an
	// instance adopted, that holds from the instance's first Stats of it.
	Stats(id string) (Stats, error)
	// Alive reports whether the sandbox's init process is still running
	// (paused counts as alive).
	Alive(id string) bool
	// Pause freezes every process of the sandbox (cgroup freezer): memory
	// is kept, no CPU is used. Resume thaws them.
	Pause(ctx context.Context, id string) error
	// Resume thaws a paused sandbox.
	Resume(ctx context.Context, id string) error
	// NetNS returns a path to the network namespace the sandbox's processes
	// use, for adding a network to a running sandbox. It fails for
	// runtimes whose network stack is fixed at start (gVisor).
	NetNS(ctx context.Context, id string) (string, error)
	// Processes lists the sandbox's processes as the host sees them, with
	// ids as the sandbox sees them (a diagnostic, like ps from outside).
	Processes(id string) ([]Process, error)
	// Snapshot copies the sandbox's writable layer to the new directory
	// dst, consistently: the sandbox is frozen during the copy (and left
	// as it was: a paused sandbox stays paused). It returns the bytes
	// copied.
	Snapshot(ctx context.Context, id, dst string) (int64, error)
}

// ErrUnsupported is returned (wrapped) by a driver for an operation its
// platform does not offer (Pause, NetNS or Snapshot of a Kubernetes Pod).
var ErrUnsupported = errors.New("not supported by this runtime driver")

// ErrKeyQuota is returned (wrapped) by a driver whose runtime could not
// give a sandbox its session keyring because the kernel's per-user key
// quota (kernel.keys.maxkeys, maxbytes) is full: a capacity condition,
// not a fault of the server.
var ErrKeyQuota = errors.New("the kernel's per-user key quota is full")

// EgressSwitch is implemented by drivers that admit a sandbox to the
// egress proxy at the network level themselves (the kube driver: a Pod
// label its NetworkPolicy selects). SetEgress admits (on) or shuts out
// sandbox id when its network changes at run time; it defends against a
// sandbox whose network became none still reaching the proxy through
// the CNI.
type EgressSwitch interface {
	SetEgress(ctx context.Context, id string, on bool) error
}

// LossReporter is implemented by drivers whose sandboxes can end without
// the control plane (a Kubernetes Pod evicted, its node lost). LostReason
// says why sandbox id is gone or dead ("" when it does not know), so the
// control plane can record it when it ends the sandbox.
type LossReporter interface {
	LostReason(id string) string
}

// Shared is implemented by drivers whose sandboxes every control plane
// using the same cluster sees (Kubernetes Pods): List returns other
// control planes' sandboxes too, and any of them may Stop one. A driver
// without it is host-local (runc, runsc): it holds only the sandboxes of
// the control plane on its host.
type Shared interface {
	SharedRuntime() bool
}

// IsShared reports whether d is a Shared driver.
func IsShared(d Driver) bool {
	s, ok := d.(Shared)
	return ok && s.SharedRuntime()
}

// Process is one process of a sandbox.
type Process struct {
	// Pid and PPid are host pids.
	Pid  int `json:"pid"`
	PPid int `json:"ppid"`
	// UID is the uid inside the sandbox (host uid minus the mapping base).
	UID int `json:"uid"`
	// User is "root", "user" (uid 1000) or the uid as text.
	User string `json:"user"`
	// CPUSeconds is the process's user+system CPU time.
	CPUSeconds float64 `json:"cpu_seconds"`
	// RSSBytes is its resident memory.
	RSSBytes int64 `json:"rss_bytes"`
	// State is the kernel's one-letter state (R, S, D, Z, T...).
	State string `json:"state"`
	// Command is the command line (arguments joined by spaces, at most 1 KiB).
	Command string `json:"command"`
}
