package oci

import (
	"errors"
	"fmt"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sort"

	"github.com/corralhq/corral/internal/inroot"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Paths inside the sandbox.
const (
	// AgentPath is where the read-only agent binary is mounted.
	AgentPath = "/.corral/agent"
	// RunDir is the per-sandbox directory that holds the agent's socket.
	RunDir = "/run/corral"
	// SocketName is the agent socket's name inside RunDir.
	SocketName = "agent.sock"
)

// capabilities is the minimal set for the sandbox's root (the agent and
// code run through sudo). It is Docker's default set without NET_RAW (raw
// sockets, CVE-2020-14386), MKNOD and SETFCAP. Code run as `user` has none.
var capabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT", "CAP_AUDIT_WRITE",
}

// maskedPaths and readonlyPaths are runc's defaults: kernel interfaces
// that leak host data or change the host (threat-model.md #4).
var maskedPaths = []string{
	"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
	"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
	"/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
}

var readonlyPaths = []string{
	"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
}

// TokenName is the file in RunDir that holds the agent's access token.
const TokenName = "token"

func agentArgs(user string, token bool) []string {
	args := []string{AgentPath, "agent", "--socket", RunDir + "/" + SocketName, "--default-user", user}
	if token {
		args = append(args, "--token-file", RunDir+"/"+TokenName)
	}
	return args
}

// specInput is what Spec needs beyond the runtime.Config.
type specInput struct {
	cfg       runtime.Config
	rootfs    string // the mounted overlay
	runDir    string // host dir holding the agent socket
	agentBin  string // host path of the static corral binary
	uidBase   uint32 // host uid that sandbox root maps to
	idRange   uint32
	cgroupDir string
	// tmpSource is the host path bound at /tmp under gVisor, checked by
	// gvisorTmpSource.
	tmpSource string
}

// gvisorTmpSource returns the host path of the overlay's /tmp, which a
// gVisor sandbox gets bound at /tmp, after checking that it is a real
// directory of the overlay reached through no symbolic link. runsc
// resolves a bind source on the host as host root, so a template (or a
// snapshot a sandbox made) whose /tmp links to /etc or to /var/lib/corral
// would otherwise have the host directory mounted read-write into the
// sandbox. Anything else is an inroot.RefusedError saying why. The check
// holds until runsc mounts the path: the lower layers are read-only
// template dirs, the upper layer is on the sandbox's fresh tmpfs and no
// process of the sandbox runs yet.
func gvisorTmpSource(rootfs string) (string, error) {
	if err := inroot.RealDir(rootfs, "/tmp"); err != nil {
		var re *inroot.RefusedError
		if errors.As(err, &re) {
			return "", &inroot.RefusedError{Path: re.Path, Reason: re.Reason +
				": gVisor sandboxes bind /tmp from their root file system, which must hold a real directory there"}
		}
		return "", fmt.Errorf("check /tmp of the root file system: %w", err)
	}
	return filepath.Join(rootfs, "tmp"), nil
}

// agentReserve is how many tasks of the pids limit are kept for the
// agent and root's processes: one user's processes get the rest.
const agentReserve = 32

// gvisorTaskOverhead is added to the host pids limit of gVisor sandboxes.
const gvisorTaskOverhead = 256

// nprocLimit is the per-user process limit for a sandbox with pids tasks.
func nprocLimit(pids int64) int64 {
	return max(pids-agentReserve, pids/2)
}

// cpuPeriod is the CFS period; the quota is cpu*period.
const cpuPeriod = 100000

// buildSpec writes the OCI runtime spec of a sandbox with corral's
// hardening defaults: every namespace including a user namespace that maps
// sandbox root to an unprivileged host range, Docker's seccomp profile, a
// minimal capability set, masked /proc paths, and no host mount but the
// read-only agent binary and the agent's socket directory.
func buildSpec(in specInput) (*specs.Spec, error) {
	cfg := in.cfg
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	keys := make([]string, 0, len(cfg.Env))
	for k := range cfg.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, "CORRAL_ENV_"+k+"="+cfg.Env[k])
	}
	user := cfg.DefaultUser
	if user == "" {
		user = "user"
	}
	caps := &specs.LinuxCapabilities{
		Bounding:  capabilities,
		Effective: capabilities,
		Permitted: capabilities,
	}
	nofile := uint64(cfg.Resources.Nofile)
	// No RLIMIT_FSIZE: the tmpfs cap must surface as ENOSPC, not SIGXFSZ.
	// RLIMIT_NPROC keeps a fork bomb of one user below the cgroup's pids
	// limit, so the agent (another uid) can still start threads: a Go
	// program that cannot create a thread dies. It counts per user in the
	// sandbox's user namespace.
	nproc := uint64(nprocLimit(cfg.Resources.Pids))
	rlimits := []specs.POSIXRlimit{
		{Type: "RLIMIT_NOFILE", Hard: nofile, Soft: nofile},
		{Type: "RLIMIT_NPROC", Hard: nproc, Soft: nproc},
	}
	mem := cfg.Resources.MemoryBytes
	quota := int64(cfg.Resources.CPU * cpuPeriod)
	period := uint64(cpuPeriod)
	pids := cfg.Resources.Pids
	if cfg.Runtime == runtime.GVisor {
		// Under gVisor the host cgroup holds the sentry's and gofer's own
		// threads and one stub process per sandboxed address space; the
		// limit on sandboxed tasks is RLIMIT_NPROC inside.
		pids += gvisorTaskOverhead
	}
	swappiness := uint64(0)
	disableOOMKiller := false
	ro := []string{"nosuid", "noexec", "nodev", "ro"}
	// The runtime runs under the supervisor, whose oom_score_adj is
	// negative (supervisor.OOMScoreAdj) and would be inherited: the
	// sandbox's processes get the default score instead, so that the OOM
	// killer picks them before the supervisor (the agent's commands get
	// +100 on top).
	oomScoreAdj := 0

	s := &specs.Spec{
		Version: "1.0.2",
		Process: &specs.Process{
			User:            specs.User{UID: 0, GID: 0},
			Args:            agentArgs(user, cfg.AccessToken != ""),
			Env:             env,
			Cwd:             "/",
			Capabilities:    caps,
			Rlimits:         rlimits,
			NoNewPrivileges: cfg.NoNewPrivileges,
			OOMScoreAdj:     &oomScoreAdj,
		},
		Root:     &specs.Root{Path: in.rootfs},
		Hostname: "corral",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: ro},
			{Destination: AgentPath, Type: "bind", Source: in.agentBin, Options: []string{"bind", "ro", "nosuid", "nodev"}},
			{Destination: RunDir, Type: "bind", Source: in.runDir, Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"}},
		},
		Linux: &specs.Linux{
			UIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: in.uidBase, Size: in.idRange}},
			GIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: in.uidBase, Size: in.idRange}},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.UserNamespace},
				{Type: specs.CgroupNamespace},
			},
			CgroupsPath: in.cgroupDir,
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				Memory: &specs.LinuxMemory{
					Limit: &mem, Swap: &mem, Swappiness: &swappiness,
					DisableOOMKiller: &disableOOMKiller,
				},
				CPU:  &specs.LinuxCPU{Quota: &quota, Period: &period},
				Pids: &specs.LinuxPids{Limit: &pids},
			},
			MaskedPaths:   maskedPaths,
			ReadonlyPaths: readonlyPaths,
		},
	}
	if cfg.Resources.CPU <= 0 {
		s.Linux.Resources.CPU = nil
	}
	for _, f := range cfg.Files {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: f.Destination, Type: "bind",
			Source: f.Source, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
	}
	for _, v := range cfg.Volumes {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: v.Destination, Type: "bind",
			Source: v.Source, Options: []string{"rbind", "rw", "nosuid", "nodev"}})
	}
	if in.cfg.Runtime == runtime.GVisor {
		// runsc puts an internal tmpfs on /tmp unless the spec mounts
		// something there; that tmpfs would escape the disk cap. Bind the
		// overlay's own /tmp instead, so /tmp is capped like /.
		if in.tmpSource == "" {
			return nil, errors.New("gVisor sandbox without a checked /tmp bind source")
		}
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/tmp", Type: "bind",
			Source: in.tmpSource, Options: []string{"rbind", "rw", "nosuid", "nodev"}})
	}
	if cfg.NetNS != "" {
		if cfg.Runtime != runtime.GVisor {
			return nil, errors.New("a prepared network namespace is for gVisor sandboxes only")
		}
		for i := range s.Linux.Namespaces {
			if s.Linux.Namespaces[i].Type == specs.NetworkNamespace {
				s.Linux.Namespaces[i].Path = cfg.NetNS
			}
		}
	}
	// The same profile under gVisor, where runsc loads it into gVisor's
	// kernel (--oci-seccomp): without it, code in a gVisor sandbox made
	// every system call gVisor implements (unshare of a user namespace
	// and cgroupfs mounts in it, keyctl, syslog), and escape checkers
	// saw no seccomp filter at all. TestEscapeBattery is the regression
	// test.
	prof, err := seccomp.GetDefaultProfile(s)
	if err != nil {
		return nil, fmt.Errorf("seccomp profile: %w", err)
	}
	prof.Architectures = nativeArch(prof.Architectures)
	if cfg.Runtime == runtime.GVisor {
		gvisorErrnos(prof)
	}
	s.Linux.Seccomp = prof
	return s, nil
}

// gvisorErrnos adapts the profile to runsc, whose OCI seccomp ignores a
// rule's errnoRet and answers EPERM for every errno action. Docker's
// profile refuses clone3 with ENOSYS so that glibc falls back to clone,
// whose flags the profile can check; with EPERM instead, glibc's
// pthread_create fails and no threaded program (python's threading, a
// JVM) could start a thread in a gVisor sandbox. So clone3 is admitted
// under gVisor, whose kernel implements it. A user namespace made with
// it is no way around the profile: the filter holds in it, so mount,
// unshare, setns and keyctl are refused there as well (TestEscapeBattery,
// "clone3 user namespace"). Any other rule keeps its refusal, as EPERM.
func gvisorErrnos(prof *specs.LinuxSeccomp) {
	for i, r := range prof.Syscalls {
		if r.Action == specs.ActErrno && r.ErrnoRet != nil && *r.ErrnoRet == uint(unix.ENOSYS) && slices.Equal(r.Names, []string{"clone3"}) {
			prof.Syscalls[i].Action = specs.ActAllow
			prof.Syscalls[i].ErrnoRet = nil
		}
	}
}

// nativeArches is the seccomp architecture of each GOARCH corral builds
// for: the only ABI a sandbox's filter admits.
var nativeArches = map[string]specs.Arch{
	"amd64": specs.ArchX86_64, "arm64": specs.ArchAARCH64,
	"ppc64le": specs.ArchPPC64LE, "s390x": specs.ArchS390X, "riscv64": specs.ArchRISCV64,
}

// nativeArch keeps only the host's own architecture of the seccomp
// profile's list. Docker's profile also admits the compat ABIs (x86 and
// x32 on amd64, arm on arm64); without them, a system call made through a
// compat entry (int 0x80, an x32 number, a 32-bit binary) kills the
// calling thread with SIGSYS instead of reaching the kernel's compat
// paths, which have carried their own exploitable bugs (CVE-2010-3081 in
// compat_alloc_user_space, CVE-2018-1068 in ebtables' compat layer).
// gVisor runs no 32-bit code either. It is also most of runc's start time
// here: libseccomp compiles the profile once per architecture, about
// 36 ms of an 80 ms `runc run` with three of them and about 1 ms with one
// (docs/performance.md). An unknown GOARCH keeps the
// list as it is. TestHardening ("no 32-bit system calls") is the
// regression test.
func nativeArch(arches []specs.Arch) []specs.Arch {
	a, ok := nativeArches[goruntime.GOARCH]
	if !ok {
		return arches
	}
	return []specs.Arch{a}
}
