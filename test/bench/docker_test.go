package bench

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// dockerImage is the base template imported into the benchmark's Docker.
const dockerImage = "corral-bench-base:latest"

// BenchmarkDockerRun is what a user would run instead of corral: `docker
// run --rm --network none` of /bin/true in the same rootfs (the base
// template, imported with `docker import`, its files owned by the ids they
// have inside corral's sandboxes), to completion. The benchmark starts its
// own dockerd (Debian's docker.io) with its data, exec root, socket,
// config and key under a temp dir, no iptables, no bridge, no IP forwarding
// or masquerading, and the cgroup parent corral-bench-docker, so it
// changes nothing on the host and touches no network; it is stopped after
// the run. Docker runs its containers as host root without a user
// namespace (its default), with its default seccomp profile and
// capabilities.
func BenchmarkDockerRun(b *testing.B) {
	need(b)
	d := startDocker(b)
	s := newSamples(b)
	for i := 0; i < b.N; i++ {
		timeCmd(b, s, d.runCmd())
	}
	s.report()
}

// runCmd is `docker run --rm --network none` of /bin/true in the image.
func (d *dockerd) runCmd() *exec.Cmd {
	return d.cmd("run", "--rm", "--network", "none", dockerImage, "/bin/true")
}

// dockerd is the benchmark's own Docker daemon.
type dockerd struct {
	dir    string // data, exec root, socket, config, log
	client string // docker CLI
	proc   *exec.Cmd
	done   chan struct{}
	// madeRunDocker: /run/docker did not exist before (dockerd makes
	// /run/docker/plugins whatever its exec root); removed after.
	madeRunDocker bool
}

var docker struct {
	once sync.Once
	d    *dockerd
	err  error // why Docker cannot run here (the benchmark skips)
}

// startDocker starts the daemon and imports the image once, or skips b
// with the reason.
func startDocker(b *testing.B) *dockerd {
	docker.once.Do(func() { docker.d, docker.err = launchDocker() })
	if docker.err != nil {
		skip(b, "docker: "+docker.err.Error())
	}
	return docker.d
}

func launchDocker() (*dockerd, error) {
	bin, err := exec.LookPath("dockerd")
	if err != nil {
		return nil, errors.New("dockerd is not installed (apt-get install docker.io; make bench installs it)")
	}
	// Debian's client beside its daemon; another docker CLI earlier in
	// PATH may be of another version.
	client := "/usr/bin/docker"
	if _, err := os.Stat(client); err != nil {
		if client, err = exec.LookPath("docker"); err != nil {
			return nil, errors.New("the docker CLI is not installed")
		}
	}
	dir, err := os.MkdirTemp("", "corral-bench-docker-")
	if err != nil {
		return nil, err
	}
	d := &dockerd{dir: dir, client: client, done: make(chan struct{})}
	if _, err := os.Stat("/run/docker"); errors.Is(err, fs.ErrNotExist) {
		d.madeRunDocker = true
	}
	conf := fmt.Sprintf(`{"deprecated-key-path": %q}`, filepath.Join(dir, "key.json"))
	if err := os.WriteFile(filepath.Join(dir, "daemon.json"), []byte(conf), 0o600); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "dockerd.log"))
	if err != nil {
		return nil, err
	}
	d.proc = exec.Command(bin,
		"--config-file", filepath.Join(dir, "daemon.json"),
		"--data-root", filepath.Join(dir, "data"),
		"--exec-root", filepath.Join(dir, "exec"),
		"--pidfile", filepath.Join(dir, "dockerd.pid"),
		"--host", "unix://"+d.sock(),
		"--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false",
		"--bridge=none", "--userland-proxy=false",
		"--storage-driver=overlay2", "--exec-opt", "native.cgroupdriver=cgroupfs",
		"--cgroup-parent", "/corral-bench-docker")
	d.proc.Stdout, d.proc.Stderr = logf, logf
	d.proc.Dir = dir
	d.proc.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.proc.Start(); err != nil {
		logf.Close()
		d.cleanup()
		return nil, fmt.Errorf("start dockerd: %w", err)
	}
	go func() { _ = d.proc.Wait(); logf.Close(); close(d.done) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := d.cmd0("version"); err == nil {
			break
		}
		select {
		case <-d.done:
			err := fmt.Errorf("dockerd exited: %s", d.logTail())
			d.cleanup()
			return nil, err
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			err := fmt.Errorf("dockerd did not answer within 60 s: %s", d.logTail())
			d.stop()
			return nil, err
		}
	}
	if err := d.importTemplate(); err != nil {
		d.stop()
		return nil, err
	}
	return d, nil
}

func (d *dockerd) sock() string { return filepath.Join(d.dir, "docker.sock") }

func (d *dockerd) cmd(args ...string) *exec.Cmd {
	return exec.Command(d.client, append([]string{"--host", "unix://" + d.sock()}, args...)...)
}

func (d *dockerd) cmd0(args ...string) error {
	out, err := d.cmd(args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("docker %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// version returns the daemon's version.
func (d *dockerd) version() string {
	out, err := d.cmd("version", "--format", "{{.Server.Version}}").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

func (d *dockerd) logTail() string {
	b, _ := os.ReadFile(filepath.Join(d.dir, "dockerd.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// importTemplate streams the base template's rootfs into `docker import`
// as a tar whose files are owned by the ids they have inside a corral
// sandbox (the cache stores them shifted into the server's uid range).
func (d *dockerd) importTemplate() error {
	lower, err := env.srv.TemplateRootFS("base")
	if err != nil {
		return fmt.Errorf("base template: %w", err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(lower, &st); err != nil {
		return err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, lower, st.Uid)) }()
	cmd := d.cmd("import", "-", dockerImage)
	cmd.Stdin = pr
	out, err := cmd.CombinedOutput()
	pr.Close()
	if err != nil {
		return fmt.Errorf("docker import: %v: %s", err, out)
	}
	return nil
}

// writeTar writes the tree at root as a tar to w, shifting owners down by
// base (ids below base are kept).
func writeTar(w io.Writer, root string, base uint32) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil || rel == "." {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		h.Name = rel
		if info.IsDir() {
			h.Name += "/"
		}
		h.Uname, h.Gname = "", ""
		if sys, ok := info.Sys().(*syscall.Stat_t); ok {
			h.Uid, h.Gid = unshift(sys.Uid, base), unshift(sys.Gid, base)
			if info.Mode()&(fs.ModeDevice|fs.ModeCharDevice) != 0 {
				h.Devmajor, h.Devminor = int64(unix.Major(sys.Rdev)), int64(unix.Minor(sys.Rdev))
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func unshift(id, base uint32) int {
	if id >= base {
		return int(id - base)
	}
	return int(id)
}

// stopDocker stops the benchmark's daemon if it started.
func stopDocker() {
	if docker.d != nil {
		docker.d.stop()
	}
}

// stop removes the image, stops the daemon (SIGTERM, then SIGKILL after
// 30 s) and removes everything it made.
func (d *dockerd) stop() {
	_ = d.cmd0("rmi", "-f", dockerImage)
	_ = d.proc.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-d.proc.Process.Pid, syscall.SIGKILL)
		<-d.done
	}
	d.cleanup()
}

// cleanup unmounts what the daemon left mounted under its dir and removes
// the dir, its cgroups and /run/docker when the daemon made it.
func (d *dockerd) cleanup() {
	if b, err := os.ReadFile("/proc/self/mounts"); err == nil {
		var mps []string
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], d.dir+"/") {
				mps = append(mps, f[1])
			}
		}
		for i := len(mps) - 1; i >= 0; i-- {
			_ = unix.Unmount(mps[i], unix.MNT_DETACH)
		}
	}
	_ = os.RemoveAll(d.dir)
	removeCgroups("corral-bench-docker")
	if d.madeRunDocker {
		_ = os.Remove("/run/docker/plugins")
		_ = os.Remove("/run/docker")
	}
}
