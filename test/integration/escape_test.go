package integration

// The escape battery: what container-escape self-assessment tools (CDK,
// deepce, amicontained, BOtB) evaluate from inside a container, rebuilt
// as probes that run inside corral's sandboxes under every runtime, as
// the default user and as sandbox root. Each probe prints a verdict and
// the test asserts it: the attack is refused, what it needs is absent, or
// what it reaches is harmless (the sandbox's own, not the host's).

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/corralhq/corral/internal/cgroups"
)

// escapeLib is the probes' Python library, installed in each battery
// sandbox at /opt/escape/esc.py (the base template has python3 but
// none of the tools the escape checkers ship). Every helper prints or
// returns a verdict: "refused" (EPERM, EACCES, ENOSYS, EROFS: the kernel,
// gVisor or the seccomp filter said no), "absent" (ENOENT, ENODEV,
// ENXIO) or "allowed".
const escapeLib = `
import ctypes, errno, os, socket, struct

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

# x86_64 system call numbers.
NR = dict(ptrace=101, syslog=103, iopl=172, ioperm=173, init_module=175,
          delete_module=176, swapon=167, reboot=169, mount=165, pivot_root=155,
          kexec_load=246, add_key=248, request_key=249, keyctl=250,
          unshare=272, perf_event_open=298, open_by_handle_at=304,
          setns=308, process_vm_readv=310, finit_module=313, bpf=321,
          kexec_file_load=320, userfaultfd=323, io_uring_setup=425,
          fsopen=430, clone3=435, clock_settime=227)

REFUSED = {errno.EPERM, errno.EACCES, errno.ENOSYS, errno.EROFS}
ABSENT = {errno.ENOENT, errno.ENODEV, errno.ENXIO}

def verdict(e):
    if e == 0:
        return 'allowed'
    if e in REFUSED:
        return 'refused'
    if e in ABSENT:
        return 'absent'
    return errno.errorcode.get(e, str(e))

def arg(a):
    if isinstance(a, int):
        return ctypes.c_long(a)
    if isinstance(a, (bytes, str)):
        return ctypes.c_char_p(a.encode() if isinstance(a, str) else a)
    return a

def sc(name, *args):
    """Makes system call name; returns 0 or its errno."""
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(NR[name]), *[arg(a) for a in args])
    return 0 if r >= 0 else ctypes.get_errno()

def say(what, e):
    print(what, verdict(e))

def try_open(path, flags=os.O_RDONLY):
    try:
        os.close(os.open(path, flags))
        return 0
    except OSError as x:
        return x.errno

def try_write(path, data=b'x'):
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as x:
        return x.errno
    try:
        os.write(fd, data)
        return 0
    except OSError as x:
        return x.errno
    finally:
        os.close(fd)

def mount(src, target, fstype, opts=''):
    return sc('mount', src, target, fstype, 0, opts)

def pids():
    return sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
`

// escapeSandbox is one sandbox of the battery with the probe library.
type escapeSandbox struct {
	id, rt string
}

// escapeTask is the task the battery's sandboxes run under: the battery
// makes hundreds of calls (a server's default task allows 30) of similar
// probes (which loop detection would take for an agent stuck in a loop).
var escapeTask struct {
	once sync.Once
	id   string
}

// newEscapeSandbox creates a sandbox for the battery (body adds to the
// create request) and installs the probe library in it.
func newEscapeSandbox(t *testing.T, rt string, body map[string]any) *escapeSandbox {
	t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	body["runtime"] = rt
	escapeTask.once.Do(func() {
		var task struct {
			ID string `json:"id"`
		}
		if st := call(t, "POST", "/v1/tasks", map[string]any{"max_calls": 100000, "max_sandboxes": 1000, "no_loop_check": true}, &task); st != http.StatusCreated {
			t.Fatalf("create the battery's task: %d", st)
		}
		escapeTask.id = task.ID
	})
	body["task"] = escapeTask.id
	id := create(t, body)
	mustSh(t, id, "mkdir -p /opt/escape && cat > /opt/escape/esc.py && chmod 755 /opt/escape && chmod 644 /opt/escape/esc.py",
		map[string]any{"user": "root", "stdin": base64.StdEncoding.EncodeToString([]byte(escapeLib))})
	return &escapeSandbox{id: id, rt: rt}
}

// py is a probe in Python with the library imported.
func py(code string) string {
	return "python3 - <<'EOF'\nimport sys\nsys.path.insert(0, '/opt/escape')\nfrom esc import *\n" + code + "\nEOF"
}

// escapeCase is one attack of the battery.
type escapeCase struct {
	name  string
	probe string
	// want is the probe's expected output for the runtime and the user
	// ("user" or "root").
	want func(rt, user string) string
	// users the case runs as; both when nil.
	users []string
	// gvisor, when set, is why the case does not apply under gVisor.
	gvisor string
}

// same wants out from every runtime and user.
func same(out string) func(rt, user string) string {
	return func(string, string) string { return out }
}

// lines joins verdict lines.
func lines(l ...string) string { return strings.Join(l, "\n") + "\n" }

// run runs the case's probe as each of its users and checks the output.
func (c escapeCase) run(t *testing.T, sb *escapeSandbox) {
	t.Helper()
	if sb.rt == "gvisor" && c.gvisor != "" {
		t.Skip("not under gVisor: " + c.gvisor)
	}
	users := c.users
	if users == nil {
		users = []string{"user", "root"}
	}
	for _, u := range users {
		res := sh(t, sb.id, c.probe, map[string]any{"user": u, "timeout": 120})
		want := c.want(sb.rt, u)
		if res.Stdout != want {
			t.Errorf("%s as %s under %s: printed %q (exit %d, stderr %q); want %q", c.name, u, sb.rt, res.Stdout, res.ExitCode, res.Stderr, want)
		}
	}
}

// capsMask is the capability set of sandbox root (oci.capabilities):
// CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID SETPCAP
// NET_BIND_SERVICE SYS_CHROOT AUDIT_WRITE, and nothing that reaches the
// host (SYS_ADMIN, SYS_PTRACE, SYS_MODULE, DAC_READ_SEARCH, NET_ADMIN,
// NET_RAW, MKNOD, SYSLOG, BPF, PERFMON, SYS_RAWIO, SETFCAP).
const capsMask = "00000000200405fb"

// TestEscapeBattery runs the checks of container-escape tools inside
// sandboxes under runc and gVisor, as user and as sandbox root, and
// asserts that each attack is refused, finds nothing or reaches only the
// sandbox's own objects. Subtests name the attack class; each case's
// comment names the attack.
func TestEscapeBattery(t *testing.T) { eachRuntime(t, testEscapeBattery) }

func testEscapeBattery(t *testing.T, rt string) {
	if goruntime.GOARCH != "amd64" {
		t.Skip("the probes use x86_64 system call numbers")
	}
	digest := agentDigest(t)
	sb := newEscapeSandbox(t, rt, nil)
	other := newEscapeSandbox(t, rt, nil)
	groups := []struct {
		name  string
		cases []escapeCase
	}{
		{"privileges", privilegeCases()},
		{"sockets", socketCases(other.id)},
		{"kernel-interfaces", kernelInterfaceCases()},
		{"runtime-binary", runtimeBinaryCases()},
		{"devices", deviceCases()},
		{"syscalls", syscallCases()},
		{"host-visibility", visibilityCases()},
		{"userns", usernsCases()},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			for _, c := range g.cases {
				t.Run(c.name, func(t *testing.T) { c.run(t, sb) })
			}
		})
	}
	t.Run("host-side", func(t *testing.T) { testEscapeHostSide(t, sb) })
	t.Run("host-services", func(t *testing.T) { testEscapeHostServices(t, sb) })
	t.Run("network", func(t *testing.T) { testEscapeNetwork(t, rt) })
	t.Run("files", func(t *testing.T) { testEscapeFiles(t, sb) })
	t.Run("volumes", func(t *testing.T) { testEscapeVolumes(t, rt) })
	t.Run("resources", func(t *testing.T) { testEscapeResources(t, rt) })
	if agentDigest(t) != digest {
		t.Errorf("the agent binary sandboxes mount changed during the battery")
	}
}

// privilegeCases: what amicontained and CDK's evaluate report first.
func privilegeCases() []escapeCase {
	return []escapeCase{
		// Capabilities (amicontained, CDK "capabilities"): user code has
		// none, not even ambient or inheritable ones; sandbox root has the
		// minimal set and nothing that reaches the host.
		{name: "capabilities", probe: `grep -E '^Cap(Inh|Prm|Eff|Bnd):' /proc/self/status | awk '{print $1, $2}'
` + py(`print('ambient', sum(1 for c in range(64) if libc.prctl(47, 1, c, 0, 0) == 1))  # PR_CAP_AMBIENT_IS_SET`),
			want: func(rt, user string) string {
				eff := "0000000000000000"
				if user == "root" {
					eff = capsMask
				}
				return lines("CapInh: 0000000000000000", "CapPrm: "+eff, "CapEff: "+eff, "CapBnd: "+capsMask, "ambient 0")
			}},
		// Seccomp mode (amicontained "Seccomp: filtering"): every process,
		// the agent included, runs under a seccomp filter, under gVisor
		// too (there the filter runs in gVisor's kernel, a second wall
		// before the host's). no_new_privs is off so that sudo works;
		// what sudo gains is the capability set above (see "setuid").
		{name: "seccomp", probe: py(`
print('seccomp', libc.prctl(21, 0, 0, 0, 0))  # PR_GET_SECCOMP
print('no_new_privs', libc.prctl(39, 0, 0, 0, 0))  # PR_GET_NO_NEW_PRIVS
print('agent', [l.split()[1] for l in open('/proc/1/status') if l.startswith('Seccomp:')])`),
			want: same(lines("seccomp 2", "no_new_privs 0", "agent ['2']"))},
		// Setuid binaries (CDK, deepce "SUID"): sudo and any setuid-root
		// file (here a copy of python3 that sandbox root made setuid)
		// make the caller sandbox root with the minimal capability set
		// and no more; sandbox root is an unprivileged host uid (under
		// runc the user namespace maps 0 to the range's base; host-side
		// checks every sandbox process's host uid, under gVisor too).
		{name: "setuid", probe: `sudo -n sh -c 'cp /usr/bin/python3 /opt/escape/suid-py && chmod 4755 /opt/escape/suid-py'
sudo -n sh -c 'id -u; grep CapEff /proc/self/status | awk "{print \$2}"'
/opt/escape/suid-py -c "import os; print(os.geteuid()); print([l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0])"
test -r /proc/self/uid_map && awk 'NR==1 {print ($2 == 0) ? "host root" : "mapped"}' /proc/self/uid_map`,
			want: func(rt, user string) string {
				if rt == "gvisor" {
					// gVisor's kernel shows its own (identity) map;
					// host-side checks what the sandbox runs as.
					return lines("0", capsMask, "0", capsMask, "host root")
				}
				return lines("0", capsMask, "0", capsMask, "mapped")
			}},
	}
}

// socketCases: runtime and control-plane sockets (CDK, deepce, BOtB
// "docker.sock"), and service-account tokens.
func socketCases(otherID string) []escapeCase {
	otherSock := filepath.Join(env.dataDir, "sandboxes", otherID, "run", "agent.sock")
	apiPort := "0"
	if u, err := url.Parse(env.url); err == nil {
		apiPort = u.Port()
	}
	return []escapeCase{
		// Runtime sockets at their well-known paths: docker, containerd,
		// CRI-O, podman, buildkit, the kubelet's, and the runtimes' state
		// roots. None exists in a sandbox.
		{name: "runtime sockets", probe: py(`
paths = ['/var/run/docker.sock', '/run/docker.sock', '/run/containerd/containerd.sock',
    '/var/run/containerd/containerd.sock', '/run/k3s/containerd/containerd.sock',
    '/run/crio/crio.sock', '/var/run/crio/crio.sock', '/run/podman/podman.sock',
    '/run/buildkit/buildkitd.sock', '/run/dockershim.sock',
    '/var/lib/kubelet/pod-resources/kubelet.sock', '/var/lib/kubelet/kubeconfig',
    '/run/runc', '/run/containerd', '/var/run/secrets/kubernetes.io/serviceaccount/token',
    '/run/secrets/kubernetes.io/serviceaccount/token', '/var/lib/docker', '/etc/kubernetes']
print(sorted(p for p in paths if os.path.lexists(p)))`),
			want: same("[]\n")},
		// Every unix socket on the file systems a sandbox sees, and every
		// one its network namespace holds (abstract ones included): only
		// the sandbox's own agent socket.
		{name: "unix sockets", probe: py(`
import stat
found = []
for top in ('/', '/dev', '/run', '/tmp', '/var'):
    for d, dirs, files in os.walk(top):
        if d.startswith(('/proc', '/sys')):
            dirs[:] = []
            continue
        for f in files:
            p = os.path.join(d, f)
            try:
                if stat.S_ISSOCK(os.lstat(p).st_mode):
                    found.append(p)
            except OSError:
                pass
print(sorted(set(found)))
names = [l.split()[7] for l in open('/proc/net/unix').readlines()[1:] if len(l.split()) > 7]
print(sorted(set(n for n in names if not n.startswith('/run/corral/agent.sock'))))`),
			want: func(rt, user string) string {
				if user == "root" {
					return "['/run/corral/agent.sock']\n[]\n"
				}
				return "[]\n[]\n" // user cannot enter /run/corral
			}},
		// Another sandbox's agent socket (by its host path) and corral's
		// API (its port on the sandbox's 127.0.0.1, the only loopback a
		// sandbox has), docker's TCP API (2375, 2376) and the kubelet's
		// (10250): nothing answers.
		{name: "control plane and other sandboxes", probe: py(fmt.Sprintf(`
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(%q)
    print('other agent', 'connected')
except OSError as x:
    print('other agent', verdict(x.errno))
for port in (%s, 2375, 2376, 10250):
    s = socket.socket()
    s.settimeout(10)
    try:
        s.connect(('127.0.0.1', port))
        print(port, 'connected')
    except OSError as x:
        print(port, errno.errorcode.get(x.errno, x.errno))`, otherSock, apiPort)),
			want: same(lines("other agent absent", apiPort+" ECONNREFUSED", "2375 ECONNREFUSED", "2376 ECONNREFUSED", "10250 ECONNREFUSED"))},
		// Service-account tokens and cluster credentials in the
		// environment (BOtB, CDK "K8s service account").
		{name: "service account env", probe: `env | grep -cE '^(KUBERNETES_|DOCKER_HOST|CONTAINERD_ADDRESS)' || true`,
			want: same("0\n")},
	}
}

// kernelInterfaceCases: host kernel knobs that run a program as host root
// (cgroup v1 release_agent, core_pattern, modprobe, uevent_helper) or
// act on the host (sysrq), and cgroupfs (CDK "mount-cgroup",
// CVE-2022-0492).
func kernelInterfaceCases() []escapeCase {
	return []escapeCase{
		// CVE-2022-0492: unshare a user, mount and cgroup namespace to
		// gain CAP_SYS_ADMIN over a fresh cgroup v1 mount, then set its
		// release_agent. Unshare is refused, so is mounting cgroupfs as
		// sandbox root.
		{name: "release_agent via unshare", probe: py(`
say('unshare', sc('unshare', 0x10000000 | 0x00020000 | 0x02000000))  # NEWUSER|NEWNS|NEWCGROUP
os.makedirs('/tmp/cg', exist_ok=True)
for sub in ('rdma', 'memory', 'none,name=x'):
    say('mount ' + sub, mount('cgroup', '/tmp/cg', 'cgroup', sub))
say('mount cgroup2', mount('cgroup2', '/tmp/cg', 'cgroup2'))
print(os.listdir('/tmp/cg'))`),
			want: same(lines("unshare refused", "mount rdma refused", "mount memory refused", "mount none,name=x refused", "mount cgroup2 refused", "[]"))},
		// release_agent and notify_on_release in any cgroupfs already
		// mounted: there is none, and /sys/fs/cgroup takes no writes.
		{name: "release_agent in reachable cgroupfs", probe: py(`
found = []
for d, dirs, files in os.walk('/sys'):
    for f in files:
        if f in ('release_agent', 'notify_on_release', 'cgroup.procs', 'devices.allow'):
            found.append(os.path.join(d, f))
print(found)
print([l.split(' - ')[1].split()[0] for l in open('/proc/self/mountinfo') if l.split(' - ')[1].split()[0] in ('cgroup', 'cgroup2')])
try:
    os.mkdir('/sys/fs/cgroup/escape')
    print('mkdir allowed')
except OSError as x:
    print('mkdir refused')`),
			want: same(lines("[]", "[]", "mkdir refused"))},
		// core_pattern ("|/path" runs a program as host root on a crash),
		// modprobe and uevent_helper (run as host root by the kernel),
		// sysrq-trigger (reboots the host): not writable, or absent.
		{name: "kernel helpers", probe: py(`
for p in ('/proc/sys/kernel/core_pattern', '/proc/sys/kernel/modprobe', '/sys/kernel/uevent_helper',
          '/proc/sysrq-trigger', '/proc/sys/kernel/hotplug', '/proc/sys/fs/binfmt_misc/register'):
    print(p, 'allowed' if try_write(p, b'|/tmp/x') == 0 else 'refused')`),
			want: same(lines("/proc/sys/kernel/core_pattern refused", "/proc/sys/kernel/modprobe refused", "/sys/kernel/uevent_helper refused",
				"/proc/sysrq-trigger refused", "/proc/sys/kernel/hotplug refused", "/proc/sys/fs/binfmt_misc/register refused"))},
	}
}

// runtimeBinaryCases: CVE-2019-5736 (overwrite the runtime through
// /proc/PID/exe) and CVE-2024-21626 (a host directory leaked as a
// descriptor or working directory into the container).
func runtimeBinaryCases() []escapeCase {
	return []escapeCase{
		// CVE-2019-5736: open the binary behind /proc/PID/exe of every
		// process for writing (the agent as PID 1, and any runtime
		// process that might be in the sandbox's PID namespace), and the
		// agent binary by its path. Every open is refused; no runc or
		// runsc process is visible.
		{name: "proc exe overwrite", probe: py(`
print('pid 1', verdict(try_open('/proc/1/exe', os.O_WRONLY)), verdict(try_open('/proc/1/exe', os.O_RDWR)))
print('agent', verdict(try_open('/.corral/agent', os.O_WRONLY)), verdict(try_open('/.corral/agent', os.O_RDWR)))
print('agent stdio', verdict(try_open('/proc/1/fd/1', os.O_WRONLY | os.O_APPEND)), verdict(try_open('/proc/1/fd/2', os.O_WRONLY | os.O_APPEND)))
names = set()
for p in pids():
    for f in ('comm', 'cmdline'):
        try:
            names.add(os.path.basename(open('/proc/%d/%s' % (p, f)).read().split('\0')[0].strip()))
        except OSError:
            pass
print('runtime', sorted(n for n in names if n.startswith(('runc', 'runsc', 'containerd', 'crun', 'conmon'))))`),
			want: same(lines("pid 1 refused refused", "agent refused refused", "agent stdio refused refused", "runtime []"))},
		// CVE-2024-21626: every descriptor, working directory and root of
		// every process it can inspect names a file that the same path
		// inside the sandbox reaches (same device and inode). A host
		// directory leaked by the runtime would not be.
		{name: "leaked host fds", probe: py(`
import stat
bad = []
seen = 0
for p in pids():
    links = ['/proc/%d/cwd' % p, '/proc/%d/root' % p]
    try:
        links += ['/proc/%d/fd/%s' % (p, f) for f in os.listdir('/proc/%d/fd' % p)]
    except OSError:
        pass
    for l in links:
        try:
            target = os.readlink(l)
            st = os.stat(l)
        except OSError:
            continue
        seen += 1
        if not target.startswith('/'):
            continue  # pipe:, socket:, anon_inode:
        try:
            same = os.stat(target)
            ok = (same.st_dev, same.st_ino) == (st.st_dev, st.st_ino)
        except OSError:
            ok = False
        if not ok and not target.startswith('/proc/'):
            bad.append((l, target))
print('inspected', seen > 3)
print('leaked', bad)`),
			want: same(lines("inspected True", "leaked []"))},
	}
}

// deviceCases: device nodes (CDK "mount-disk", deepce), and the
// interfaces under /sys that expose the host kernel.
func deviceCases() []escapeCase {
	return []escapeCase{
		// mknod of a block device (the host disk, 8:0 and 254:0) or a
		// char device (/dev/mem 1:1, /dev/kmsg 1:11) is refused.
		{name: "mknod", probe: py(`
import stat
for name, mode, dev in (('sda', stat.S_IFBLK, os.makedev(8, 0)), ('vda', stat.S_IFBLK, os.makedev(254, 0)),
                        ('mem', stat.S_IFCHR, os.makedev(1, 1)), ('kmsg', stat.S_IFCHR, os.makedev(1, 11))):
    try:
        os.mknod('/tmp/dev-' + name, mode | 0o600, dev)
        print(name, 'allowed')
    except OSError as x:
        print(name, verdict(x.errno))`),
			want: same(lines("sda refused", "vda refused", "mem refused", "kmsg refused"))},
		// The device nodes a sandbox holds: no block device at all, and
		// only the harmless character devices (null, zero, full, random,
		// urandom, tty, ptmx, the sandbox's own ptys; gVisor adds its own
		// emulated fuse and tun, which need capabilities sandbox root
		// lacks). /dev/mem, /dev/kmsg, /dev/port and disks are absent.
		{name: "device nodes", probe: py(`
import stat
bad = []
for d, dirs, files in os.walk('/dev'):
    for f in files + dirs:
        p = os.path.join(d, f)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISBLK(st.st_mode):
            bad.append((p, 'block'))
        elif stat.S_ISCHR(st.st_mode):
            m = (os.major(st.st_rdev), os.minor(st.st_rdev))
            if not (m in ((1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 1), (5, 2), (10, 229), (10, 200)) or m[0] == 136):
                bad.append((p, m))
print(bad)
for p in ('/dev/mem', '/dev/kmem', '/dev/kmsg', '/dev/port', '/dev/sda', '/dev/vda', '/dev/nvme0n1', '/dev/kvm', '/dev/loop0', '/dev/disk'):
    print(p, verdict(try_open(p)))`),
			want: same(lines("[]", "/dev/mem absent", "/dev/kmem absent", "/dev/kmsg absent", "/dev/port absent", "/dev/sda absent",
				"/dev/vda absent", "/dev/nvme0n1 absent", "/dev/kvm absent", "/dev/loop0 absent", "/dev/disk absent"))},
		// debugfs, tracefs, securityfs and bpffs expose and change the
		// host kernel: none is mounted (their mount points hold nothing)
		// and mounting one is refused.
		{name: "debugfs tracefs securityfs bpffs", probe: py(`
for d in ('/sys/kernel/debug', '/sys/kernel/tracing', '/sys/kernel/security', '/sys/fs/bpf'):
    try:
        print(d, 'empty' if not os.listdir(d) else 'holds files')
    except OSError as x:
        print(d, 'absent' if verdict(x.errno) in ('absent', 'refused') else verdict(x.errno))
os.makedirs('/tmp/m', exist_ok=True)
for fs in ('debugfs', 'tracefs', 'securityfs', 'bpf'):
    say('mount ' + fs, mount(fs, '/tmp/m', fs))`),
			want: func(rt, user string) string {
				if rt == "gvisor" {
					// gVisor's sysfs has no such directories.
					return lines("/sys/kernel/debug absent", "/sys/kernel/tracing absent", "/sys/kernel/security absent", "/sys/fs/bpf absent",
						"mount debugfs refused", "mount tracefs refused", "mount securityfs refused", "mount bpf refused")
				}
				return lines("/sys/kernel/debug empty", "/sys/kernel/tracing empty", "/sys/kernel/security empty", "/sys/fs/bpf empty",
					"mount debugfs refused", "mount tracefs refused", "mount securityfs refused", "mount bpf refused")
			}},
	}
}

// syscallCases: the system calls amicontained lists as blocked and the
// ones CDK and BOtB use, each made with arguments that would do
// something if admitted. Every one is refused (EPERM or ENOSYS).
func syscallCases() []escapeCase {
	calls := []struct{ name, call string }{
		// shocker: open_by_handle_at with a guessed handle of the host's
		// root inode reads any host file (CAP_DAC_READ_SEARCH).
		{"open_by_handle_at", `h = ctypes.create_string_buffer(struct.pack('II', 8, 1) + struct.pack('Q', 2))
fd = os.open('/', os.O_RDONLY)
e = sc('open_by_handle_at', fd, h, 0)`},
		// bpf(2): BPF_MAP_CREATE of an array map.
		{"bpf", `attr = ctypes.create_string_buffer(struct.pack('IIII', 2, 4, 4, 1) + bytes(112))
e = sc('bpf', 0, attr, 120)`},
		// perf_event_open of a CPU-wide software counter.
		{"perf_event_open", `attr = ctypes.create_string_buffer(struct.pack('IIQ', 1, 128, 0) + bytes(112))
e = sc('perf_event_open', attr, -1, 0, -1, 0)`},
		// userfaultfd, the usual helper for kernel race exploits.
		{"userfaultfd", `e = sc('userfaultfd', os.O_CLOEXEC)`},
		// kexec_load and kexec_file_load (boot another kernel).
		{"kexec_load", `e = sc('kexec_load', 0, 0, 0, 0)`},
		{"kexec_file_load", `e = sc('kexec_file_load', os.open('/.corral/agent', os.O_RDONLY), -1, 1, b'', 2)`},
		// init_module, finit_module, delete_module (load kernel code).
		{"init_module", `e = sc('init_module', ctypes.create_string_buffer(64), 64, b'')`},
		{"finit_module", `e = sc('finit_module', os.open('/.corral/agent', os.O_RDONLY), b'', 0)`},
		{"delete_module", `e = sc('delete_module', b'ext4', 0x800)`},
		// ptrace and process_vm_readv of the agent (PID 1), which holds
		// the sandbox's access token.
		{"ptrace agent", `e = sc('ptrace', 16, 1, 0, 0)`}, // PTRACE_ATTACH
		{"process_vm_readv agent", `buf = ctypes.create_string_buffer(8)
iov = struct.pack('QQ', ctypes.addressof(buf), 8)
riov = struct.pack('QQ', 0x400000, 8)
e = sc('process_vm_readv', 1, ctypes.create_string_buffer(iov), 1, ctypes.create_string_buffer(riov), 1, 0)`},
		// The kernel keyring (BOtB reads host secrets with keyctl):
		// keyctl, add_key, request_key.
		{"keyctl", `e = sc('keyctl', 0, -3, 1)`}, // KEYCTL_GET_KEYRING_ID of the session keyring, create
		{"add_key", `e = sc('add_key', b'user', b'escape', b'secret', 6, -2)`},
		{"request_key", `e = sc('request_key', b'user', b'escape', 0, -2)`},
		// io_uring, whose kernel paths carried several escapes.
		{"io_uring_setup", `e = sc('io_uring_setup', 8, ctypes.create_string_buffer(120))`},
		// Namespaces and mounts (the first step of most escapes).
		{"unshare user", `e = sc('unshare', 0x10000000)`},
		{"unshare mount", `e = sc('unshare', 0x00020000)`},
		{"setns", `e = sc('setns', os.open('/proc/self/ns/mnt', os.O_RDONLY), 0)`},
		{"mount tmpfs", `e = mount('tmpfs', '/tmp', 'tmpfs')`},
		{"fsopen", `e = sc('fsopen', b'tmpfs', 0)`},
		{"pivot_root", `e = sc('pivot_root', b'/tmp', b'/tmp')`},
		// The rest of Docker's blocked list that acts on the host.
		{"syslog", `e = sc('syslog', 3, ctypes.create_string_buffer(64), 64)`}, // SYSLOG_ACTION_READ_ALL
		{"iopl", `e = sc('iopl', 3)`},
		{"ioperm", `e = sc('ioperm', 0x80, 1, 1)`},
		{"swapon", `e = sc('swapon', b'/tmp/swap', 0)`},
		{"reboot", `e = sc('reboot', 0xfee1dead, 672274793, 0)`}, // LINUX_REBOOT_CMD_CAD_OFF
		{"clock_settime", `e = sc('clock_settime', 0, ctypes.create_string_buffer(16))`},
	}
	var cs []escapeCase
	for _, c := range calls {
		cs = append(cs, escapeCase{name: c.name, probe: py(c.call + "\nsay('" + c.name + "', e)"), want: same(c.name + " refused\n")})
	}
	return cs
}

// visibilityCases: what deepce and CDK gather about the host.
func visibilityCases() []escapeCase {
	return []escapeCase{
		// Host processes: PID 1 is the agent and every process descends
		// from it.
		{name: "host pids", probe: py(`
ppid = {}
for p in pids():
    try:
        for l in open('/proc/%d/status' % p):
            if l.startswith('PPid:'):
                ppid[p] = int(l.split()[1])
    except OSError:
        pass
def rooted(p, n=0):
    return p == 1 or (n < 64 and p in ppid and rooted(ppid[p], n + 1))
print(open('/proc/1/cmdline').read().split('\0')[0])
print([p for p in ppid if not rooted(p)])`),
			want: same(lines("/.corral/agent", "[]"))},
		// Host mounts (CDK "mounts", deepce "interesting mounts"): the
		// sandbox's mount table holds its root, the kernel file systems
		// and the agent's files, nothing else: no host directory, no
		// host disk, no runtime socket.
		{name: "host mounts", probe: py(`
allowed = {'/', '/proc', '/dev', '/dev/pts', '/dev/shm', '/dev/mqueue', '/sys', '/.corral/agent', '/run/corral',
    '/etc/resolv.conf', '/tmp', '/sys/firmware', '/sys/devices/virtual/powercap'}
bad = []
for l in open('/proc/1/mountinfo'):
    f = l.split()
    mp = f[4]
    if mp in allowed or mp.startswith('/proc/') or mp in ('/dev/null', '/dev/zero', '/dev/full', '/dev/random', '/dev/urandom', '/dev/tty'):
        continue
    bad.append(mp)
print(bad)`),
			want: same("[]\n")},
		// Host network interfaces and routes: a sandbox without a
		// network has its own loopback and nothing else.
		{name: "host interfaces", probe: py(`
print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]))
print([l.split()[0] for l in open('/proc/net/route').readlines()[1:]])`),
			want: same(lines("['lo']", "[]"))},
		// Kernel addresses (/proc/kallsyms): zeroed (or absent), so that
		// a kernel exploit gets no KASLR leak; /proc/kcore is empty.
		{name: "kallsyms", probe: py(`
try:
    addrs = set(l.split()[0] for l in open('/proc/kallsyms'))
    print('kallsyms', 'zeroed' if addrs == {'0000000000000000'} else 'leaks %d addresses' % len(addrs))
except OSError as x:
    print('kallsyms', 'zeroed' if verdict(x.errno) in ('absent', 'refused') else verdict(x.errno))
try:
    print('kcore', len(open('/proc/kcore', 'rb').read(16)))
except OSError as x:
    print('kcore', 0 if verdict(x.errno) in ('absent', 'refused') else verdict(x.errno))`),
			want: same(lines("kallsyms zeroed", "kcore 0"))},
		// The host kernel's log (dmesg, syslog(2), /dev/kmsg): refused
		// or absent. (Under gVisor the log would be gVisor's own; the
		// seccomp filter refuses syslog(2) there too.)
		{name: "dmesg", probe: py(`
say('syslog', sc('syslog', 10, 0, 0))  # SYSLOG_ACTION_SIZE_BUFFER
say('kmsg', try_open('/dev/kmsg'))
import subprocess
out = subprocess.run(['dmesg'], capture_output=True).stdout
print('dmesg', len(out))`),
			want: same(lines("syslog refused", "kmsg absent", "dmesg 0"))},
	}
}

// usernsCases: nested user namespaces (CDK "abuse-unpriv-userns") and
// mounting proc, sysfs or overlay inside (CDK "procfs mount").
func usernsCases() []escapeCase {
	return []escapeCase{
		{name: "unshare tool", probe: `for f in -U -Ur -Urm -UrmC -Urmp; do unshare $f --fork true 2>/dev/null && echo "$f allowed" || echo "$f refused"; done`,
			want: same(lines("-U refused", "-Ur refused", "-Urm refused", "-UrmC refused", "-Urmp refused"))},
		// clone3 with CLONE_NEWUSER, which a seccomp filter cannot look
		// into (its flags are in memory): refused under runc (ENOSYS, so
		// glibc falls back to clone, whose flags are checked). gVisor's
		// seccomp answers EPERM to every refusal, which would break
		// glibc's threads, so there clone3 is admitted; in the user
		// namespace it makes, the filter still refuses every mount,
		// unshare, setns and keyctl.
		{name: "clone3 user namespace", probe: py(`
args = ctypes.create_string_buffer(struct.pack('QQQQQQQQ', 0x10000000 | 0x00020000, 0, 0, 0, 17, 0, 0, 0))  # NEWUSER|NEWNS, SIGCHLD
ctypes.set_errno(0)
pid = libc.syscall(ctypes.c_long(NR['clone3']), args, ctypes.c_long(64))
if pid == 0:
    os.makedirs('/tmp/c3', exist_ok=True)
    print('in ns:', ', '.join('%s %s' % (n, verdict(e)) for n, e in (
        ('mount proc', mount('proc', '/tmp/c3', 'proc')), ('mount cgroup', mount('cgroup', '/tmp/c3', 'cgroup', 'memory')),
        ('mount tmpfs', mount('tmpfs', '/tmp/c3', 'tmpfs')), ('unshare', sc('unshare', 0x00020000)),
        ('setns', sc('setns', os.open('/proc/self/ns/mnt', os.O_RDONLY), 0)), ('keyctl', sc('keyctl', 0, -3, 1)))))
    sys.stdout.flush()
    os._exit(0)
if pid < 0:
    say('clone3', ctypes.get_errno())
else:
    os.waitpid(pid, 0)
    print('clone3 allowed')`),
			want: func(rt, user string) string {
				if rt == "gvisor" {
					return lines("in ns: mount proc refused, mount cgroup refused, mount tmpfs refused, unshare refused, setns refused, keyctl refused", "clone3 allowed")
				}
				return lines("clone3 refused")
			}},
		// Threads still start (glibc's pthread_create tries clone3
		// first): the refusals above must not break threaded programs.
		{name: "threads start", probe: `python3 -c "
import threading
t = threading.Thread(target=print, args=('thread ran',))
t.start(); t.join()"`, want: same("thread ran\n")},
		{name: "mount proc sysfs overlay", probe: py(`
os.makedirs('/tmp/m/l', exist_ok=True); os.makedirs('/tmp/m/u', exist_ok=True); os.makedirs('/tmp/m/w', exist_ok=True)
say('proc', mount('proc', '/tmp/m', 'proc'))
say('sysfs', mount('sysfs', '/tmp/m', 'sysfs'))
say('overlay', mount('overlay', '/tmp/m', 'overlay', 'lowerdir=/tmp/m/l,upperdir=/tmp/m/u,workdir=/tmp/m/w'))
say('bind', sc('mount', b'/', b'/tmp/m', 0, 0x1000, 0))  # MS_BIND`),
			want: same(lines("proc refused", "sysfs refused", "overlay refused", "bind refused"))},
	}
}

// testEscapeHostSide checks from the host what the sandbox's processes
// are: no host root among them, and (runc) no descriptor of theirs names
// a host file outside the sandbox's own mounts (CVE-2024-21626's leaked
// host fd).
func testEscapeHostSide(t *testing.T, sb *escapeSandbox) {
	// A sleeper as user, with its working directory in /tmp, and one as
	// root via sudo, so that commands are in the picture too.
	mustSh(t, sb.id, "cd /tmp && setsid sleep 600 >/dev/null 2>&1 </dev/null & setsid sudo -n sleep 601 >/dev/null 2>&1 </dev/null & sleep 0.5")
	g := cgroups.Open("/corral/" + sb.id)
	pids, err := g.Procs()
	if err != nil || len(pids) < 2 {
		t.Fatalf("sandbox cgroup procs: %v %v", pids, err)
	}
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue // gone
		}
		nsInit := false // PID 1 of the sandbox: the agent
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[0] == "NSpid:" {
				nsInit = f[len(f)-1] == "1"
			}
			if f := strings.Fields(l); len(f) == 5 && f[0] == "Uid:" {
				for _, u := range f[1:] {
					if n, _ := strconv.Atoi(u); n < 65536 {
						t.Errorf("sandbox process %d runs as host uid %d (%s)", pid, n, l)
					}
				}
			}
		}
		if sb.rt == "gvisor" {
			// The host processes of a gVisor sandbox are its sentry and
			// gofer, which hold the host descriptors of the sandbox's
			// mounts by design; code inside sees only the sentry's own
			// descriptors, which "leaked host fds" checks.
			continue
		}
		// Each descriptor and the working directory name a path in the
		// process's own root (readlink shows it relative to that root);
		// resolved there, the path must reach the same file. A host
		// directory leaked into the sandbox (CVE-2024-21626) is reachable
		// by no path of the sandbox's root.
		root := fmt.Sprintf("/proc/%d/root", pid)
		links := []string{fmt.Sprintf("/proc/%d/cwd", pid)}
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			links = append(links, fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		}
		for _, l := range links {
			target, err := os.Readlink(l)
			if err != nil || !strings.HasPrefix(target, "/") {
				continue // gone, or a pipe, socket or anon inode
			}
			if nsInit && target == filepath.Join(env.dataDir, "sandboxes", sb.id, "agent.log") {
				// The agent's own stdout and stderr, opened by the
				// driver (append only): the one host file the sandbox
				// holds. The agent is non-dumpable, so no code in the
				// sandbox reaches it ("proc exe overwrite" and "leaked
				// host fds" check /proc/1 from inside); the agent's
				// children get their own pipes (TestHardening).
				continue
			}
			fi, err := os.Stat(l)
			if err != nil {
				continue
			}
			in, err := os.Stat(filepath.Join(root, target))
			if err != nil || !os.SameFile(fi, in) {
				t.Errorf("sandbox process %d holds %s -> %s, which is not that path of the sandbox's root (%v)", pid, l, target, err)
			}
		}
	}
	mustSh(t, sb.id, "pkill -x sleep; true", asRoot)
}

// testEscapeHostServices: the host's 127.0.0.1 services (deepce's port
// scan of the host) are not reachable from a sandbox, whose 127.0.0.1 is
// its own loopback: a listener on the host's 127.0.0.1 and one on every
// host address are both refused.
func testEscapeHostServices(t *testing.T, sb *escapeSandbox) {
	ports := []int{hostService(t, "127.0.0.1:0"), hostService(t, "0.0.0.0:0")}
	for _, port := range ports {
		for _, u := range []string{"user", "root"} {
			res := sh(t, sb.id, py(fmt.Sprintf(`
s = socket.socket()
s.settimeout(10)
try:
    s.connect(('127.0.0.1', %d))
    print('connected', s.recv(64))
except OSError as x:
    print(errno.errorcode.get(x.errno, x.errno))`, port)), map[string]any{"user": u})
			if res.Stdout != "ECONNREFUSED\n" {
				t.Errorf("host service on port %d from the sandbox as %s: %q %q; want ECONNREFUSED", port, u, res.Stdout, res.Stderr)
			}
		}
	}
}

// testEscapeNetwork: a sandbox with a network reaches the host only at
// the egress proxy and DNS filter: a host service on the gateway address
// (an address on the veth corral made) is not reachable, nor the host's
// 127.0.0.1 services, and the host side of its veth does not route
// 127.0.0.0/8 (route_localnet, CVE-2020-8558).
func testEscapeNetwork(t *testing.T, rt string) {
	if env.srv.Gateway == nil {
		t.Skip("the test server has no network gateway")
	}
	sb := newEscapeSandbox(t, rt, map[string]any{"network": "allow", "allow": []string{"allowed.test"}})
	proxy := strings.TrimSpace(mustSh(t, sb.id, "echo $http_proxy"))
	u, err := url.Parse(proxy)
	if err != nil || u.Hostname() == "" {
		t.Fatalf("http_proxy %q: %v", proxy, err)
	}
	gw := u.Hostname()
	port := hostService(t, "0.0.0.0:0")
	for _, u := range []string{"user", "root"} {
		res := sh(t, sb.id, py(fmt.Sprintf(`
for addr in (%q, '127.0.0.1'):
    s = socket.socket()
    s.settimeout(5)
    what = addr == '127.0.0.1' and 'loopback' or 'gateway'
    try:
        s.connect((addr, %d))
        # corral's transparent proxy may take the connection, then
        # refuses the host address: only the service's banner is reach.
        print(what, 'reached' if b'host service' in s.recv(64) else 'refused')
    except OSError as x:
        print(what, 'refused' if isinstance(x, socket.timeout) or x.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ETIMEDOUT, errno.ECONNRESET) else x)
print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]))`, gw, port)), map[string]any{"user": u})
		if res.Stdout != "gateway refused\nloopback refused\n['eth0', 'lo']\n" {
			t.Errorf("host service on the gateway %s:%d as %s: %q %q; want both refused and only eth0, lo", gw, port, u, res.Stdout, res.Stderr)
		}
	}
	ifs, _ := net.Interfaces()
	found := false
	for _, i := range ifs {
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.String() == gw {
				found = true
				b, err := os.ReadFile("/proc/sys/net/ipv4/conf/" + i.Name + "/route_localnet")
				if err != nil || strings.TrimSpace(string(b)) != "0" {
					t.Errorf("route_localnet on %s (the sandbox's veth) is %q (%v); want 0", i.Name, b, err)
				}
			}
		}
	}
	if !found {
		t.Errorf("no host interface holds the gateway address %s", gw)
	}
}

// hostMarker makes a host directory with a marker file that no sandbox
// may read or change, and returns the directory, the marker's content
// and a check that the directory is unchanged.
func hostMarker(t *testing.T) (string, string, func()) {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "corral-escape-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o777)
	content := "host marker " + randHex(8)
	if err := os.WriteFile(filepath.Join(dir, "marker"), []byte(content), 0o666); err != nil {
		t.Fatal(err)
	}
	return dir, content, func() {
		t.Helper()
		ents, _ := os.ReadDir(dir)
		if len(ents) != 1 || ents[0].Name() != "marker" {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("host dir %s now holds %v; want only marker", dir, names)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "marker")); string(b) != content {
			t.Errorf("host marker changed: %q", b)
		}
	}
}

// filesReq makes a request to the sandbox's /files endpoint as user.
func filesReq(t *testing.T, id, method, path, user string, body io.Reader) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, env.url+"/v1/sandboxes/"+id+"/files?path="+url.QueryEscape(path)+"&username="+user, body)
	req.Header.Set("X-API-Key", env.key)
	return doRequest(t, req)
}

// doRequest sends req and returns its status and the first MiB of its
// body; it fails t when the request cannot be sent.
func doRequest(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// linkSwapper is a background probe that swaps the link at path between
// a directory next to it (inside) and the host directory host (outside,
// absolute) as fast as it can until /tmp/swap.stop exists: an attacker
// racing a host-side path check (TOCTOU).
func linkSwapper(path, host string) string {
	return fmt.Sprintf(`mkdir -p %[1]s.real && rm -f /tmp/swap.stop && (setsid python3 -c "
import os
p = '%[1]s'
while not os.path.exists('/tmp/swap.stop'):
    for t in (os.path.basename(p) + '.real', '%[2]s'):
        try:
            os.symlink(t, p + '.tmp')
            os.rename(p + '.tmp', p)
        except OSError:
            pass
" >/dev/null 2>&1 </dev/null &)`, path, host)
}

// testEscapeFiles: symbolic and hard links through the files API. A
// link a sandbox plants (absolute, to a host path that exists on the
// host; relative, climbing with ..; to /) is followed inside the
// sandbox: a download through it never returns the host file and an
// upload never writes the host directory. Hard links to the agent
// binary or the agent socket (other mounts) are refused.
func testEscapeFiles(t *testing.T, sb *escapeSandbox) {
	dir, content, unchanged := hostMarker(t)
	mustSh(t, sb.id, fmt.Sprintf(`ln -sfn %[1]s/marker /tmp/abs && ln -sfn %[2]s/marker /tmp/rel && ln -sfn %[1]s /tmp/absdir && ln -sfn / /tmp/rootdir && ln -sfn %[1]s /home/user/absdir`,
		dir, strings.Repeat("../", 16)+strings.TrimPrefix(dir, "/")), asRoot)
	for _, u := range []string{"user", "root"} {
		for _, p := range []string{"/tmp/abs", "/tmp/rel", "/tmp/absdir/marker", "/tmp/rootdir" + dir + "/marker"} {
			if code, body := filesReq(t, sb.id, "GET", p, u, nil); strings.Contains(body, content) {
				t.Errorf("download of %s as %s returned the host marker (%d)", p, u, code)
			}
		}
		for _, p := range []string{"/tmp/absdir/new-" + u, "/tmp/rootdir" + dir + "/new2-" + u, "/tmp/abs", "/home/user/absdir/new3-" + u} {
			filesReq(t, sb.id, "POST", p, u, strings.NewReader("written through a link"))
		}
	}
	unchanged()
	// The race: the link at /tmp/race flips between a sandbox directory
	// and the host directory while uploads and downloads go through it.
	mustSh(t, sb.id, linkSwapper("/tmp/race", dir), asRoot)
	for i := 0; i < 100; i++ {
		filesReq(t, sb.id, "POST", fmt.Sprintf("/tmp/race/new%d", i), "root", strings.NewReader("raced"))
		if _, body := filesReq(t, sb.id, "GET", "/tmp/race/marker", "root", nil); strings.Contains(body, content) {
			t.Fatalf("a download through a swapped link returned the host marker")
		}
	}
	if out := mustSh(t, sb.id, "touch /tmp/swap.stop; test -L /tmp/race && echo swapped", asRoot); out != "swapped\n" {
		t.Fatalf("the link swapper did not run: %q", out)
	}
	unchanged()
	sh(t, sb.id, `ln /.corral/agent /tmp/agent-hl; ln /run/corral/agent.sock /tmp/sock-hl`, asRoot)
	for _, p := range []string{"/tmp/agent-hl", "/tmp/sock-hl"} {
		if out := mustSh(t, sb.id, "test -e "+p+" && echo exists || echo absent", asRoot); out != "absent\n" {
			t.Errorf("hard link %s: %s", p, out)
		}
	}
}

// testEscapeVolumes: links a sandbox plants in a volume (absolute to a
// host directory, relative climbing out, to /) and hard links (which
// stay on the volume's own file system) do not lead the host-side
// volume content API, or another sandbox that mounts the volume, to a
// host file: reads are refused or give the volume's or the sandbox's own
// file, writes land nowhere on the host.
func testEscapeVolumes(t *testing.T, rt string) {
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("volumes need loop devices: " + err.Error())
	}
	var v volumeJSON
	if code := call(t, "POST", "/v1/volumes", map[string]any{"name": "escape-" + randHex(3), "size_mb": 16}, &v); code != http.StatusCreated {
		t.Fatalf("create volume: %d", code)
	}
	t.Cleanup(func() { call(t, "DELETE", "/v1/volumes/"+v.ID, nil, nil) })
	dir, content, unchanged := hostMarker(t)
	mount := map[string]any{"volumes": []map[string]any{{"volume": v.ID, "path": "/data"}}}
	a := newEscapeSandbox(t, rt, mount)
	mustSh(t, a.id, fmt.Sprintf(`ln -s %[1]s /data/abs && ln -s %[2]s /data/rel && ln -s / /data/root && ln -s %[1]s/marker /data/absfile && (ln /etc/passwd /data/hl 2>/dev/null; true) && echo vol > /data/own && ln /data/own /data/own-hl`,
		dir, strings.Repeat("../", 16)+strings.TrimPrefix(dir, "/")), asRoot)
	content_ := func(method, p string, body io.Reader) (int, string) {
		req, _ := http.NewRequest(method, env.url+"/volumecontent/"+v.ID+"/file?path="+url.QueryEscape(p), body)
		req.Header.Set("Authorization", "Bearer "+v.Token)
		return doRequest(t, req)
	}
	for _, p := range []string{"/abs/marker", "/rel/marker", "/root" + dir + "/marker", "/absfile"} {
		if code, body := content_("GET", p, nil); code == http.StatusOK || strings.Contains(body, content) {
			t.Errorf("volume content API GET %s through a planted link: %d %q; want a refusal", p, code, body)
		}
	}
	for _, p := range []string{"/abs/new", "/rel/new", "/root" + dir + "/new", "/absfile"} {
		if code, _ := content_("PUT", p, strings.NewReader("through a link")); code/100 == 2 {
			t.Errorf("volume content API PUT %s through a planted link: %d; want a refusal", p, code)
		}
	}
	if code, body := content_("GET", "/own-hl", nil); code != http.StatusOK || body != "vol\n" {
		t.Errorf("hard link inside the volume: %d %q", code, body)
	}
	unchanged()
	// The race: the sandbox flips /data/race between a directory of the
	// volume and the host directory while the host-side content API
	// writes and reads through it.
	mustSh(t, a.id, linkSwapper("/data/race", dir), asRoot)
	inside := 0
	for i := 0; i < 100; i++ {
		if code, _ := content_("PUT", fmt.Sprintf("/race/new%d", i), strings.NewReader("raced")); code/100 == 2 {
			inside++
		}
		if _, body := content_("GET", "/race/marker", nil); strings.Contains(body, content) {
			t.Fatalf("a volume content API read through a swapped link returned the host marker")
		}
	}
	if out := mustSh(t, a.id, "touch /tmp/swap.stop; test -L /data/race && echo swapped", asRoot); out != "swapped\n" {
		t.Fatalf("the link swapper did not run: %q", out)
	}
	t.Logf("volume race: %d of 100 writes landed inside the volume", inside)
	unchanged()
	// Another sandbox mounting the volume follows the links inside
	// itself.
	b := newEscapeSandbox(t, rt, mount)
	if res := sh(t, b.id, "cat /data/abs/marker /data/absfile /data/rel/marker /data/root"+dir+"/marker 2>/dev/null; echo > /data/abs/new 2>/dev/null; true", asRoot); strings.Contains(res.Stdout, content) {
		t.Errorf("a second sandbox read the host marker through the volume's links: %q", res.Stdout)
	}
	unchanged()
}

// testEscapeResources: writes that try to get around the disk cap go to
// places that are each bounded: the root file system, /tmp, /run and
// /var/tmp (the capped writable layer), the agent's run dir (64 KiB),
// /dev/mqueue (RLIMIT_MSGQUEUE), /dev/shm and, for root, /dev (64 MiB
// tmpfs under runc, charged to the sandbox's memory), a memfd and pipes
// (charged to the sandbox's memory). Under gVisor /dev is gVisor's own
// in-memory file system without a size of its own: the sandbox's memory
// limit bounds it, and reaching it ends the sandbox as any gVisor OOM
// does.
func testEscapeResources(t *testing.T, rt string) {
	const diskMB, memMB = 20, 256
	res := map[string]any{"resources": map[string]any{"disk_mb": diskMB, "memory_mb": memMB}}
	sb := newEscapeSandbox(t, rt, res)
	// fill writes up to 300 MiB to path and prints the MiB it wrote.
	fill := func(path string) string {
		return py(fmt.Sprintf(`
n = 0
try:
    with open(%q, 'wb') as f:
        chunk = bytes(1 << 20)
        while n < 300:
            f.write(chunk)
            f.flush()
            n += 1
except OSError as x:
    pass
print(n)`, path))
	}
	cases := []struct {
		path, user string
		maxMB      int
	}{
		{"/tmp/fill", "user", diskMB},
		{"/home/user/fill", "user", diskMB},
		{"/run/fill", "root", diskMB},
		{"/var/tmp/fill", "root", diskMB},
		{"/run/corral/fill", "root", 1},
		{"/dev/mqueue/fill", "root", 1},
		{"/dev/shm/fill", "user", 64},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(strings.TrimPrefix(c.path, "/"), "/", "_")+"_"+c.user, func(t *testing.T) {
			r := sh(t, sb.id, fill(c.path), map[string]any{"user": c.user, "timeout": 120})
			n, err := strconv.Atoi(strings.TrimSpace(r.Stdout))
			if err != nil || n > c.maxMB {
				t.Errorf("wrote %q MiB to %s as %s (stderr %q); want at most %d", r.Stdout, c.path, c.user, r.Stderr, c.maxMB)
			}
			sh(t, sb.id, "rm -f "+c.path, asRoot)
		})
	}
	// Memory-bound places, each in a sandbox of its own: the probe holds
	// up to 600 MiB there and prints how much it held. Bounded means it
	// held less than the memory limit, or was killed at it (under gVisor
	// an OOM kill ends the sandbox: its record says oom).
	memoryBound := []struct{ name, user, probe string }{
		{"dev", "root", fill("/dev/fill")},
		{"memfd", "user", py(`
fd = os.memfd_create('escape')
n = 0
try:
    while n < 600:
        os.write(fd, bytes(1 << 20))
        n += 1
except OSError:
    pass
print(n)`)},
		{"pipes", "user", py(`
import fcntl
held, ps = 0, []
try:
    while held < 600 << 20:
        r, w = os.pipe()
        ps.append((r, w))
        try:
            fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
        except OSError:
            pass
        os.set_blocking(w, False)
        try:
            while True:
                held += os.write(w, bytes(65536))
        except BlockingIOError:
            pass
except OSError:
    pass
print(held >> 20)`)},
	}
	for _, c := range memoryBound {
		t.Run(c.name, func(t *testing.T) {
			maxMB := memMB
			if c.name == "dev" && rt == "runc" {
				maxMB = 64 // runc's /dev is a tmpfs of 64 MiB
			}
			box := newEscapeSandbox(t, rt, res)
			r := sh(t, box.id, c.probe, map[string]any{"user": c.user, "timeout": 120})
			var rec sandboxJSON
			call(t, "GET", "/v1/sandboxes/"+box.id, nil, &rec)
			n, err := strconv.Atoi(strings.TrimSpace(r.Stdout))
			switch {
			case r.ExitCode == 0 && err == nil && n <= maxMB:
			case rt == "gvisor" && rec.State == "ended" && rec.EndReason == "oom":
			case r.ExitCode == 137 && oomKills(t, box.id) > 0:
			default:
				t.Errorf("%s held %q MiB (exit %d, end reason %q, sandbox %s %s, stderr %q); want less than %d MiB or an OOM kill",
					c.name, r.Stdout, r.ExitCode, r.EndReason, rec.State, rec.EndReason, r.Stderr, maxMB)
			}
			t.Logf("%s: held %q MiB, exit %d, end reason %q, sandbox %s %s", c.name, strings.TrimSpace(r.Stdout), r.ExitCode, r.EndReason, rec.State, rec.EndReason)
		})
	}
}

// oomKills is how many OOM kills the sandbox's memory cgroup counted.
func oomKills(t *testing.T, id string) uint64 {
	t.Helper()
	n, err := cgroups.Open("/corral/" + id).OOMKills()
	if err != nil {
		t.Logf("OOM kills of %s: %v", id, err)
	}
	return n
}

// agentDigest is the SHA-256 of the agent binary sandboxes mount: the
// battery checks that nothing it ran changed it (CVE-2019-5736).
func agentDigest(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(env.dataDir, "bin", "corral-agent"))
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))
}
