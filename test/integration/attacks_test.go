package integration

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/cgroups"
	"github.com/corralhq/corral/internal/template"
)

// TestMemoryBomb (threat-model.md #2): a process that allocates without bound is
// killed at the sandbox's memory limit; the command reports end reason
// "oom" and the sandbox keeps answering.
func TestMemoryBomb(t *testing.T) { eachRuntime(t, testMemoryBomb) }

func testMemoryBomb(t *testing.T, rt string) {
	id := create(t, map[string]any{"runtime": rt, "resources": map[string]any{"memory_mb": 64}})
	res := sh(t, id, "python3 -c 'a=[]\nwhile True: a.append(bytearray(1<<20))'")
	if res.ExitCode != 137 || res.EndReason != "oom" {
		t.Fatalf("memory bomb: exit %d reason %q (stderr %q); want 137 oom", res.ExitCode, res.EndReason, res.Stderr)
	}
	if rt == "gvisor" {
		// gVisor's kernel is one host process: the host cgroup kills the
		// whole sandbox at the limit, and the record says so.
		var sb sandboxJSON
		call(t, "GET", "/v1/sandboxes/"+id, nil, &sb)
		if sb.State != "ended" || sb.EndReason != "oom" {
			t.Fatalf("gVisor sandbox after memory bomb: %+v, want ended oom", sb)
		}
		assertNoTrace(t, id)
		return
	}
	if out := mustSh(t, id, "echo alive"); out != "alive\n" {
		t.Fatalf("sandbox after OOM printed %q", out)
	}
	var cmds struct {
		Commands []struct {
			Command   string `json:"command"`
			EndReason string `json:"end_reason"`
		} `json:"commands"`
	}
	call(t, "GET", "/v1/sandboxes/"+id+"/commands", nil, &cmds)
	if len(cmds.Commands) < 1 || cmds.Commands[0].EndReason != "oom" {
		t.Fatalf("command record does not say oom: %+v", cmds.Commands)
	}
}

// TestForkBomb (threat-model.md #1): a fork bomb hits the pids limit (fork fails
// with EAGAIN inside) while the host keeps spawning processes, and the
// sandbox survives it. Under gVisor the pinned runsc enforces
// RLIMIT_NPROC inside (Debian's 2022 runsc did not: the bomb reached the
// host pids limit and ended the sandbox, which this test used to allow).
func TestForkBomb(t *testing.T) { eachRuntime(t, testForkBomb) }

func testForkBomb(t *testing.T, rt string) {
	id := create(t, map[string]any{"runtime": rt, "resources": map[string]any{"pids": 64}})
	g := cgroups.Open("/corral/" + id)
	pidsDir := filepath.Join(cgroups.Root, "pids", g.Path)
	if cgroups.Unified() {
		pidsDir = filepath.Join(cgroups.Root, g.Path)
	}
	if b, err := os.ReadFile(filepath.Join(pidsDir, "pids.max")); err != nil || strings.TrimSpace(string(b)) == "max" {
		t.Fatalf("pids.max = %q (%v): no limit", b, err)
	}
	done := make(chan execResult, 1)
	go func() {
		var res execResult
		call(t, "POST", "/v1/sandboxes/"+id+"/exec", map[string]any{
			"command": `bomb() { bomb | bomb & }; bomb; sleep 3`, "timeout": 8}, &res)
		done <- res
	}()
	// While the bomb runs, the host must still be able to start processes.
	for i := 0; i < 20; i++ {
		if err := exec.Command("true").Run(); err != nil {
			t.Fatalf("host could not spawn a process during the fork bomb: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	res := <-done
	if !strings.Contains(res.Stderr, "Resource temporarily unavailable") {
		t.Errorf("forks inside did not fail with EAGAIN: exit %d stderr tail %q", res.ExitCode, res.Stderr[max(0, len(res.Stderr)-200):])
	}
	// The sandbox survives its fork bomb and still answers.
	mustSh(t, id, "pkill -KILL -u user bash; true", map[string]any{"user": "root"})
	if out := mustSh(t, id, "echo alive"); out != "alive\n" {
		t.Fatalf("sandbox after fork bomb printed %q", out)
	}
}

// TestDiskFill (threat-model.md #3): writing past the disk cap fails with ENOSPC
// inside the sandbox and nothing reaches the host or the template.
func TestDiskFill(t *testing.T) { eachRuntime(t, testDiskFill) }

func testDiskFill(t *testing.T, rt string) {
	id := create(t, map[string]any{"runtime": rt, "resources": map[string]any{"disk_mb": 20, "memory_mb": 256}})
	for _, path := range []string{"/tmp/fill", "/home/user/fill"} {
		res := sh(t, id, "dd if=/dev/zero of="+path+" bs=1M count=100")
		if res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left on device") {
			t.Fatalf("dd to %s: exit %d stderr %q; want ENOSPC", path, res.ExitCode, res.Stderr)
		}
		mustSh(t, id, "rm -f "+path)
	}
	// Inode exhaustion is capped too: empty files run out of inodes.
	res := sh(t, id, `python3 -c "
import os
i = 0
try:
    while i < 200000:
        open('/tmp/f%d' % i, 'w').close()
        i += 1
except OSError as e:
    print(i, e.errno)
"`, map[string]any{"timeout": 120})
	var n, errno int
	fmt.Sscan(res.Stdout, &n, &errno)
	if n == 0 || errno != 28 {
		t.Fatalf("inode fill: %q (stderr %q); want ENOSPC (28) before 200000 files", res.Stdout, res.Stderr)
	}
	tpl, err := env.srv.TemplateRootFS("base")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"tmp/fill", "home/user/fill", "tmp/f0"} {
		if _, err := os.Lstat(filepath.Join(tpl, p)); err == nil {
			t.Fatalf("sandbox write reached the template at %s", p)
		}
	}
}

// TestCommandTimeout: a busy loop is killed at its command timeout with a
// timeout result (exit 124), its whole process group is gone, and the
// sandbox keeps answering.
func TestCommandTimeout(t *testing.T) { eachRuntime(t, testCommandTimeout) }

func testCommandTimeout(t *testing.T, rt string) {
	id := create(t, map[string]any{"runtime": rt})
	res := sh(t, id, "sh -c 'while :; do :; done' & python3 -c 'while True: pass'", map[string]any{"timeout": 1})
	if res.ExitCode != 124 || !res.TimedOut || res.EndReason != "timeout" {
		t.Fatalf("busy loop: exit %d timed_out %v reason %q; want 124 true timeout", res.ExitCode, res.TimedOut, res.EndReason)
	}
	if out := mustSh(t, id, "echo alive"); out != "alive\n" {
		t.Fatalf("sandbox after timeout printed %q", out)
	}
	if res := sh(t, id, "pgrep -f 'while|python3' | grep -v $$ || true"); strings.TrimSpace(res.Stdout) != "" {
		t.Fatalf("processes of the timed-out command survive: %q", res.Stdout)
	}
}

// TestKillIsTotal (threat-model.md #14, #15): a process that ignores SIGTERM,
// calls setsid and double-forks is gone after kill, and so is everything
// else the sandbox held on the host.
func TestKillIsTotal(t *testing.T) { eachRuntime(t, testKillIsTotal) }

func testKillIsTotal(t *testing.T, rt string) {
	id := create(t, map[string]any{"runtime": rt})
	// Waits (up to 30 s: gVisor's ptrace platform forks slowly) until both
	// sleepers run.
	mustSh(t, id, `setsid sh -c 'trap "" TERM; (trap "" TERM; sleep 100000 &) ; sleep 100000' >/dev/null 2>&1 </dev/null &
i=0; while [ "$(pgrep -c -x sleep)" -lt 2 ]; do i=$((i+1)); [ $i -gt 300 ] && exit 1; sleep 0.1; done`, map[string]any{"timeout": 60})
	g := cgroups.Open("/corral/" + id)
	pids, err := g.Procs()
	if err != nil || len(pids) < 3 {
		t.Fatalf("expected the agent and the escaped sleepers in the sandbox cgroup, got %v (%v)", pids, err)
	}
	if code := call(t, "DELETE", "/v1/sandboxes/"+id, nil, nil); code != 200 {
		t.Fatalf("kill: status %d", code)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
			stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
			t.Errorf("pid %d of the sandbox still exists after kill (%v): %s %s", pid, err, stat, cg)
		}
	}
	assertNoTrace(t, id)
	var sb sandboxJSON
	call(t, "GET", "/v1/sandboxes/"+id, nil, &sb)
	if sb.State != "ended" || sb.EndReason != "killed" {
		t.Fatalf("record after kill: %+v", sb)
	}
}

// assertNoTrace fails if anything of sandbox id is left on the host.
func assertNoTrace(t *testing.T, id string) {
	t.Helper()
	if cgroups.Open("/corral/" + id).Exists() {
		t.Errorf("cgroup of %s still exists", id)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), id) {
		t.Errorf("a mount of %s is still there", id)
	}
	if _, err := os.Stat(filepath.Join(env.dataDir, "sandboxes", id)); !os.IsNotExist(err) {
		t.Errorf("state dir of %s still exists (%v)", id, err)
	}
	if out, _ := exec.Command("runc", "--root", runcRoot(env.dataDir), "list", "-q").Output(); strings.Contains(string(out), id) {
		t.Errorf("runc still lists %s", id)
	}
}

// TestNoNetwork: a sandbox without networking has loopback only: no
// other interface, no route, no DNS server, and a host service listening
// on every host address is not reachable through its 127.0.0.1. Nothing
// is sent off this machine: routes are inspected, not probed.
func TestNoNetwork(t *testing.T) { eachRuntime(t, testNoNetwork) }

func testNoNetwork(t *testing.T, rt string) {
	port := hostService(t, "0.0.0.0:0")
	id := create(t, map[string]any{"runtime": rt})
	if out := mustSh(t, id, "ip -o link | awk -F': ' '{print $2}'"); out != "lo\n" {
		t.Fatalf("interfaces: %q, want only lo", out)
	}
	if out := mustSh(t, id, "(ip route; ip -6 route) | grep -v ' dev lo ' | grep -v '^$' || true"); strings.TrimSpace(out) != "" {
		t.Fatalf("routes inside the sandbox: %q", out)
	}
	if res := sh(t, id, "ip route get 10.1.2.3"); res.ExitCode == 0 || rt == "runc" && !strings.Contains(res.Stderr, "unreachable") {
		t.Fatalf("ip route get 10.1.2.3: exit %d %q; want unreachable", res.ExitCode, res.Stderr)
	}
	// resolv.conf names corral's DNS filter (so that a network added later
	// works), but without a network nothing answers: resolution fails at
	// once with no route.
	if res := sh(t, id, `python3 -c "import socket; socket.getaddrinfo('example.com', 80)"`); res.ExitCode == 0 {
		t.Fatalf("name resolution works without a network: %q", res.Stdout)
	}
	res := sh(t, id, fmt.Sprintf(`python3 -c "import socket; socket.create_connection(('127.0.0.1', %d), timeout=3)"`, port))
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "Connection refused") {
		t.Fatalf("host listener reachable from the sandbox? exit %d stderr %q", res.ExitCode, res.Stderr)
	}
}

// TestHardening (threat-model.md #4, #5, #7, #17, #18, #19): seccomp is on
// and admits only the host's own system call ABI (no i386 or x32 compat
// entry, whose kernel paths had their own bugs), user code has no
// capabilities, root lacks NET_RAW and cannot write sysrq,
// mount or create user namespaces; every command leads its own session
// without a controlling terminal (no TIOCSTI into another terminal) and
// holds no descriptor but its stdio; no runtime socket is visible.
func TestHardening(t *testing.T) {
	need(t)
	id := create(t, nil)
	root := map[string]any{"user": "root"}
	tests := []struct {
		name, cmd string
		opts      map[string]any
		wantOK    bool
		wantOut   string
	}{
		{"seccomp filter on", "grep -E '^Seccomp:' /proc/self/status | awk '{print $2}'", nil, true, "2\n"},
		{"user has no capabilities", "grep CapEff /proc/self/status | awk '{print $2}'", nil, true, "0000000000000000\n"},
		{"no_new_privs off for sudo", "grep NoNewPrivs /proc/self/status | awk '{print $2}'", nil, true, "0\n"},
		{"sysrq-trigger not writable", "echo h > /proc/sysrq-trigger", root, false, ""},
		{"kcore masked", "test -s /proc/kcore && head -c1 /proc/kcore | wc -c", root, false, ""},
		{"no raw sockets", `python3 -c "import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)"`, root, false, ""},
		{"no packet sockets", `python3 -c "import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)"`, root, false, ""},
		{"no mount", "mount -t tmpfs none /mnt", root, false, ""},
		{"no new user namespace", "unshare -U true", root, false, ""},
		{"no keyctl", `python3 -c "import ctypes; l=ctypes.CDLL(None); r=l.syscall(250, 0, 0, 0, 0, 0); import sys; sys.exit(0 if r>=0 else 1)"`, root, false, ""},
		// int 0x80 getpid from a 64-bit process: the compat (i386) entry
		// is not admitted by the seccomp filter, the thread dies of SIGSYS.
		{"no 32-bit system calls", `python3 -c "
import ctypes, mmap
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(bytes([0xb8, 0x14, 0, 0, 0, 0xcd, 0x80, 0xc3]))
print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))())"; echo $?`, root, true, "159\n"},
		{"no x32 system calls", `python3 -c "import ctypes; ctypes.CDLL(None).syscall(0x40000000 | 39)"; echo $?`, root, true, "159\n"},
		{"no host runtime socket", "ls /var/run/docker.sock /run/containerd/containerd.sock", root, false, ""},
		{"own session", `test "$(ps -o sid= -p $$ | tr -d ' ')" = "$$" && echo leader`, nil, true, "leader\n"},
		{"no controlling terminal", `python3 -c "
try:
    open('/dev/tty')
except OSError as e:
    print(e.errno)"`, nil, true, "6\n"}, // ENXIO
		{"TIOCSTI refused", `python3 -c "
import fcntl, termios
try:
    fcntl.ioctl(0, termios.TIOCSTI, b'x')
except OSError as e:
    print(e.errno)"`, nil, true, "25\n"}, // ENOTTY: stdin is no terminal
		{"only stdio descriptors", `python3 -c "import os; print(sorted(int(f) for f in os.listdir('/proc/self/fd')))"`, nil, true, "[0, 1, 2, 3]\n"}, // 3: the listing itself
		{"only stdio descriptors as root", `python3 -c "import os; print(sorted(int(f) for f in os.listdir('/proc/self/fd')))"`, root, true, "[0, 1, 2, 3]\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := sh(t, id, tc.cmd, tc.opts)
			if (res.ExitCode == 0) != tc.wantOK {
				t.Fatalf("%q: exit %d (stdout %q stderr %q)", tc.cmd, res.ExitCode, res.Stdout, res.Stderr)
			}
			if tc.wantOut != "" && res.Stdout != tc.wantOut {
				t.Fatalf("%q printed %q, want %q", tc.cmd, res.Stdout, tc.wantOut)
			}
		})
	}
}

// TestZombiesReaped (threat-model.md #13): the agent, as PID 1, reaps orphans.
func TestZombiesReaped(t *testing.T) { eachRuntime(t, testZombiesReaped) }

func testZombiesReaped(t *testing.T, rt string) {
	id := create(t, map[string]any{"runtime": rt})
	// 100 orphans are plenty to show reaping; the generous timeout is for
	// gVisor's ptrace platform on a loaded CI machine, where each fork
	// costs tens of milliseconds (300 forks once took over 30 s there).
	mustSh(t, id, "for i in $(seq 100); do (sleep 0.01 &) ; done; sleep 1", map[string]any{"timeout": 300})
	out := mustSh(t, id, "ps -eo stat= | grep -c '^Z' || true")
	if strings.TrimSpace(out) != "0" {
		t.Fatalf("%s zombies left in the sandbox", out)
	}
}

// TestOutputBounded (threat-model.md #16): a flood of output returns only the
// configured tail with the full byte count and truncated=true.
func TestOutputBounded(t *testing.T) { eachRuntime(t, testOutputBounded) }

func testOutputBounded(t *testing.T, rt string) {
	id := create(t, map[string]any{"runtime": rt})
	res := sh(t, id, "yes | head -c 5000000; echo -n END")
	if !res.Truncated || res.StdoutBytes != 5000003 || len(res.Stdout) != 64<<10 || !strings.HasSuffix(res.Stdout, "y\nEND") {
		t.Fatalf("truncated=%v bytes=%d len=%d tail=%q", res.Truncated, res.StdoutBytes, len(res.Stdout), res.Stdout[max(0, len(res.Stdout)-10):])
	}
}

// TestHostUsersCannotReachSandboxFiles: template trees and each sandbox's
// files hold setuid binaries owned by the shifted sandbox root (sudo is
// setuid to the uid range's base); an unprivileged host user must not
// reach them, or they could become that uid and change the templates every
// sandbox mounts.
// Volumes hold the agents' data: host users cannot read them either.
func TestHostUsersCannotReachSandboxFiles(t *testing.T) {
	need(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("needs setpriv (util-linux)")
	}
	var vol struct{ ID string }
	if code := call(t, "POST", "/v1/volumes", map[string]any{"name": "hostusers-" + randHex(3), "size_mb": 16}, &vol); code != http.StatusCreated {
		t.Fatalf("create volume: %d", code)
	}
	t.Cleanup(func() { call(t, "DELETE", "/v1/volumes/"+vol.ID, nil, nil) })
	id := create(t, map[string]any{"volumes": []map[string]any{{"volume": vol.ID, "path": "/data"}}})
	mustSh(t, id, "echo inside > /tmp/x; echo secret > /data/v")
	cache := template.DefaultCacheDir()
	builds, _ := filepath.Glob(filepath.Join(cache, "base-*", "rootfs", "usr", "bin", "sudo"))
	paths := append([]string{
		filepath.Join(env.dataDir, "sandboxes", id, "rootfs", "usr", "bin", "sudo"),
		filepath.Join(env.dataDir, "sandboxes", id, "disk", "upper", "tmp", "x"),
		filepath.Join(env.dataDir, "volumes", vol.ID, "mnt", "v"),
		filepath.Join(env.dataDir, "volumes", vol.ID, "image.ext4"),
	}, builds...)
	if len(builds) == 0 {
		t.Fatalf("no base template build under %s", cache)
	}
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s does not exist for root: %v", p, err)
		}
		out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "test", "-e", p).CombinedOutput()
		if err == nil {
			t.Errorf("host user nobody can reach %s (%s)", p, out)
		}
	}
	// The sandbox itself still works, sudo included.
	if got := mustSh(t, id, "sudo id -u"); got != "0\n" {
		t.Fatalf("sudo inside the sandbox: %q", got)
	}
}

// hostService listens on the host at addr, answers every connection with
// "host service\n" and closes it, until the test ends; it returns the
// port. A sandbox reaching it has reached a host service it must not.
func hostService(t *testing.T, addr string) int {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("host service\n"))
			c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}
