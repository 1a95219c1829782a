package oci

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/corralhq/corral/internal/cgroups"
)

// TestSandboxInitRefusesForeignPid: NetNS takes a sandbox's init pid
// from the runtime's pid file only while that pid is a process of the
// sandbox's cgroup. A pid file naming any other process (the init died
// and its pid went to a host process) is refused, so the sandbox's veth
// pair can never be put into that process's (the host's) network
// namespace; as root, a process moved into the sandbox's cgroup is
// accepted.
func TestSandboxInitRefusesForeignPid(t *testing.T) {
	d := &Driver{opts: Options{StateDir: t.TempDir()}}
	id := "latency-initpid-" + strconv.Itoa(os.Getpid())
	if err := os.Mkdir(d.dir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	writePid := func(pid int) {
		if err := os.WriteFile(filepath.Join(d.dir(id), pidFileName), []byte(strconv.Itoa(pid)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := d.sandboxInit(id); ok {
		t.Fatal("accepted a sandbox without a pid file")
	}
	writePid(os.Getpid()) // a host process: not in the sandbox's cgroup
	if pid, ok := d.sandboxInit(id); ok {
		t.Fatalf("accepted pid %d of a host process as the sandbox's init", pid)
	}
	if os.Geteuid() != 0 {
		t.Skip("the accepted case needs root (a cgroup of the sandbox)")
	}
	g := cgroups.Open(d.cgroupPath(id))
	dir := filepath.Join(cgroups.Root, d.cgroupPath(id))
	if !cgroups.Unified() {
		dir = filepath.Join(cgroups.Root, "pids", d.cgroupPath(id))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		for _, p := range g.Dirs() {
			_ = os.Remove(p)
		}
	})
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	writePid(cmd.Process.Pid)
	if pid, ok := d.sandboxInit(id); !ok || pid != cmd.Process.Pid {
		t.Fatalf("sandboxInit = %d, %v; want %d, true for a process of the sandbox's cgroup", pid, ok, cmd.Process.Pid)
	}
}
