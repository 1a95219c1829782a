package oci

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/corralhq/corral/internal/cgroups"
	"github.com/corralhq/corral/internal/idrange"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/runtime/drivertest"
	"github.com/corralhq/corral/internal/template"
	"golang.org/x/sys/unix"
)

// TestConformance runs the driver conformance suite (package drivertest)
// against this driver under runc and under runsc (gVisor), with the
// cached base template and the static corral binary of this checkout as
// the agent. It needs root and the runtime; without them it skips and
// says what is missing.
func TestConformance(t *testing.T) {
	for _, rt := range []runtime.Runtime{runtime.Runc, runtime.GVisor} {
		t.Run(string(rt), func(t *testing.T) {
			env := conformanceEnv(t, rt)
			drivertest.Run(t, func(t *testing.T) drivertest.Setup { return env.setup(t, rt) })
		})
	}
}

// confEnv is what every setup of the suite shares: the agent binary, the
// base template and the uid range it is shifted to.
type confEnv struct {
	agent  string
	rootfs string
	base   uint32
}

var (
	confOnce sync.Once
	confVal  confEnv
	confErr  error
	// confTmp holds the agent binary and the id files; TestMain removes it.
	confTmp string
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(startHelper())
	}
	// This process stands for a host init that does not reap: orphans
	// that escape corral's supervisor are reparented here and stay
	// zombies, which TestNoZombies looks for.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "set child subreaper:", err)
		os.Exit(1)
	}
	code := m.Run()
	if confTmp != "" {
		os.RemoveAll(confTmp)
	}
	os.Exit(code)
}

// conformanceEnv skips unless this host can run sandboxes of rt, and
// builds (once) what the suite's setups share.
func conformanceEnv(t *testing.T, rt runtime.Runtime) confEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the driver conformance suite needs root (namespaces, mounts, cgroups)")
	}
	if rt == runtime.GVisor {
		// The runsc a server would choose: the pinned build when cached.
		r, err := FindRunsc("", "")
		if err != nil {
			t.Skipf("gVisor: %v", err)
		}
		t.Logf("gVisor: %s", r.Note)
	} else if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("runc is not installed (apt-get install runc)")
	}
	confOnce.Do(func() { confVal, confErr = buildConfEnv() })
	if confErr != nil {
		t.Fatal(confErr)
	}
	return confVal
}

func buildConfEnv() (confEnv, error) {
	tmp, err := os.MkdirTemp("", "corral-drivertest-")
	if err != nil {
		return confEnv{}, err
	}
	confTmp = tmp
	// Sandbox root (an unprivileged host uid) must reach the agent binary.
	if err := os.Chmod(tmp, 0o711); err != nil {
		return confEnv{}, err
	}
	// The lean agent binary, as a server installed by make runs.
	agent := filepath.Join(tmp, "corral-agent")
	cmd := exec.Command("go", "build", "-o", agent, "../../../cmd/corral-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return confEnv{}, fmt.Errorf("build the agent: %v: %s", err, out)
	}
	// The uid range a server on this host would choose, checked against
	// copies of the host's id files (never recorded in /etc).
	ids := filepath.Join(tmp, "etc")
	if err := os.Mkdir(ids, 0o755); err != nil {
		return confEnv{}, err
	}
	files := idrange.InDir(ids)
	for src, dst := range map[string]string{"/etc/subuid": files.SubUID, "/etc/subgid": files.SubGID, "/etc/passwd": files.Passwd, "/etc/group": files.Group} {
		b, err := os.ReadFile(src)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return confEnv{}, err
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			return confEnv{}, err
		}
	}
	r, err := idrange.Ensure(files, idrange.Range{})
	if err != nil {
		return confEnv{}, err
	}
	// The server's code path: the cached build for this range, built on
	// first use.
	tpl, err := template.BuildBase(context.Background(), "", template.BaseOptions{Progress: os.Stderr, IDBase: r.Base})
	if err != nil {
		return confEnv{}, fmt.Errorf("base template: %w", err)
	}
	return confEnv{agent: agent, rootfs: tpl.RootFS, base: r.Base}, nil
}

// setup makes a driver over a fresh state dir.
func (e confEnv) setup(t *testing.T, rt runtime.Runtime) drivertest.Setup {
	s, _ := e.setupOpts(t, rt)
	return s
}

// setupOpts is setup, also returning the driver's options.
func (e confEnv) setupOpts(t *testing.T, rt runtime.Runtime) (drivertest.Setup, Options) {
	state, err := os.MkdirTemp("", "corral-dt-state-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(state, 0o711); err != nil {
		t.Fatal(err)
	}
	opts := Options{StateDir: state, AgentBinary: e.agent, UIDBase: e.base}
	t.Cleanup(func() {
		// Runs after the suite's own Stops (cleanups run last-in first).
		// Never remove a tree a mount is still under.
		if mounts := mountsUnder(state); len(mounts) > 0 {
			t.Errorf("state dir %s left with mounts %v; not removed", state, mounts)
			return
		}
		os.RemoveAll(state)
		for _, r := range []runtime.Runtime{runtime.Runc, runtime.GVisor} {
			os.Remove(RuntimeRoot(state, r))
		}
		os.Remove(filepath.Dir(RuntimeRoot(state, rt)))
	})
	newDriver := func(t *testing.T) runtime.Driver {
		d, err := New(opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := d.Close(); err != nil {
				t.Errorf("close driver: %v", err)
			}
		})
		return d
	}
	return drivertest.Setup{
		Driver:    newDriver(t),
		Runtime:   rt,
		RootFS:    e.rootfs,
		Restart:   newDriver,
		Leftovers: func(id string) []string { return leftovers(state, id) },
	}, opts
}

// leftovers lists what the host holds of sandbox id of the driver over
// state: its directory, mounts under it, its cgroup directories, its
// state in either runtime's root, and processes in its cgroup or whose
// command line names it (the shim, runsc's sandbox and gofer).
func leftovers(state, id string) []string {
	var left []string
	dir := filepath.Join(state, id)
	if _, err := os.Lstat(dir); err == nil {
		left = append(left, "state dir "+dir)
	}
	for _, m := range mountsUnder(dir) {
		left = append(left, "mount "+m)
	}
	for _, cg := range cgroups.Open(CgroupParent + "/" + id).Dirs() {
		if _, err := os.Stat(cg); err == nil {
			left = append(left, "cgroup "+cg)
		}
	}
	for _, rt := range []runtime.Runtime{runtime.Runc, runtime.GVisor} {
		matches, _ := filepath.Glob(filepath.Join(RuntimeRoot(state, rt), "*"+id+"*"))
		for _, m := range matches {
			left = append(left, string(rt)+" state "+m)
		}
	}
	left = append(left, processesOf(dir, id)...)
	return left
}

// mountsUnder returns the mount points at or below dir in this mount
// namespace.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return []string{"cannot read mountinfo: " + err.Error()}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := fields[4]
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out
}

// processesOf lists processes in the sandbox's cgroup or whose command
// line has the sandbox id as an argument or names its directory.
func processesOf(dir, id string) []string {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return []string{"cannot list /proc: " + err.Error()}
	}
	self := os.Getpid()
	cg := CgroupParent + "/" + id
	var out []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		why := ""
		if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup")); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if p := line[strings.LastIndex(line, ":")+1:]; p == cg || strings.HasPrefix(p, cg+"/") {
					why = "in cgroup " + cg
					break
				}
			}
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00")
		for _, a := range args {
			if a == id || strings.Contains(a, dir) {
				why = "command line names the sandbox"
				break
			}
		}
		if why != "" {
			out = append(out, fmt.Sprintf("pid %d (%s): %s", pid, strings.Join(args, " "), why))
		}
	}
	return out
}
