package template

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/corralhq/corral/internal/idrange"
)

// BuildBase builds the base template (Debian bookworm minbase plus
// opts.Packages, user "user" with passwordless sudo, ownership shifted by
// opts.IDBase) into cacheDir, or returns the cached build.
//
// The build dir is <cacheDir>/base-<first 16 hex digits of opts.Digest()>.
// If it already holds a complete manifest, BuildBase returns it at once
// without running anything. Otherwise it builds into a temporary directory
// next to it and renames that into place at the end; on any failure,
// including a cancelled ctx, the temporary directory is removed, so a failed
// build leaves nothing behind. Concurrent builds of the same recipe, in this
// process or others, are serialized by a lock file: the second waits and
// then returns the first one's result. An empty cacheDir means
// DefaultCacheDir(). Building needs root and debootstrap.
func BuildBase(ctx context.Context, cacheDir string, opts BaseOptions) (Template, error) {
	return build(ctx, cacheDir, opts.recipe())
}

// BuildCodeInterpreter builds the code-interpreter template (the base
// template's recipe plus CodeInterpreterPackages from Debian and the
// interpreter server) into cacheDir, or returns the cached build, exactly
// as BuildBase does: the build dir is
// <cacheDir>/code-interpreter-<first 16 hex digits of opts.Digest()>, a
// failed or cancelled build leaves nothing behind and concurrent builds
// of one recipe are serialized.
func BuildCodeInterpreter(ctx context.Context, cacheDir string, opts CodeInterpreterOptions) (Template, error) {
	return build(ctx, cacheDir, opts.recipe())
}

// build builds recipe r into cacheDir (see BuildBase).
func build(ctx context.Context, cacheDir string, r recipe) (Template, error) {
	what := "build " + r.name + " template"
	if cacheDir == "" {
		cacheDir = DefaultCacheDir()
	}
	opts := r.opts
	if err := (idrange.Range{Base: opts.IDBase, Count: idrange.Count}).Validate(); err != nil {
		return Template{}, fmt.Errorf("%s: %w", what, err)
	}
	if err := validatePackages(r.allPackages()); err != nil {
		return Template{}, fmt.Errorf("%s: %w", what, err)
	}
	digest := r.digest
	name := r.dirName
	cacheDir, err := filepath.Abs(cacheDir)
	if err != nil {
		return Template{}, fmt.Errorf("%s: cache dir: %w", what, err)
	}
	final := filepath.Join(cacheDir, name)

	if t, err := openBuild(final, digest); err == nil {
		return t, nil
	}
	if os.Geteuid() != 0 {
		return Template{}, fmt.Errorf("%s %s: building needs root (debootstrap, chroot, chown)", what, name)
	}
	if err := PrivateDir(cacheDir); err != nil {
		return Template{}, fmt.Errorf("%s: %w", what, err)
	}
	prog := newProgress(opts.Progress, r.name)
	unlock, err := lockFile(ctx, filepath.Join(cacheDir, "."+name+".lock"), func() {
		prog.step("waiting for another build of %s", name)
	})
	if err != nil {
		return Template{}, fmt.Errorf("%s %s: %w", what, name, err)
	}
	defer unlock()

	// Another process may have finished the build while we waited.
	if _, err := os.Lstat(final); err == nil {
		t, err := openBuild(final, digest)
		if err != nil {
			return Template{}, fmt.Errorf("%s: %s exists but is not a complete build (remove it to rebuild): %w", what, final, err)
		}
		return t, nil
	}
	// Leftovers of builds of this recipe killed before they could clean up.
	// We hold the lock, so none of them is still running.
	stale, _ := filepath.Glob(filepath.Join(cacheDir, ".tmp-"+name+"-*"))
	for _, d := range stale {
		if err := removeTree(d); err != nil {
			return Template{}, fmt.Errorf("%s %s: remove stale build: %w", what, name, err)
		}
	}

	tmp, err := os.MkdirTemp(cacheDir, ".tmp-"+name+"-")
	if err != nil {
		return Template{}, fmt.Errorf("%s %s: %w", what, name, err)
	}
	t, err := buildInto(ctx, tmp, final, r, prog)
	if err != nil {
		if rerr := removeTree(tmp); rerr != nil {
			err = fmt.Errorf("%w (and removing the partial build failed: %v)", err, rerr)
		}
		prog.fail(err)
		return Template{}, fmt.Errorf("%s %s: %w", what, name, err)
	}
	return t, nil
}

// buildInto builds recipe r in tmp and renames tmp to final.
func buildInto(ctx context.Context, tmp, final string, r recipe, prog *progress) (Template, error) {
	opts, pkgs, digest := r.opts, r.packages, r.digest
	start := time.Now()
	logf, err := os.OpenFile(filepath.Join(tmp, BuildLogFile), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return Template{}, fmt.Errorf("create build log: %w", err)
	}
	defer logf.Close()
	rootfs := filepath.Join(tmp, RootFSDir)

	bin, err := findDebootstrap(opts.Debootstrap)
	if err != nil {
		return Template{}, err
	}
	args := []string{"--variant=minbase", "--include=" + strings.Join(pkgs, ","), BaseSuite, rootfs, opts.mirror()}
	fmt.Fprintf(logf, "# corral %s template, recipe %d, digest %s\n# %s %s\n", r.name, r.recipeVersion, digest, bin, strings.Join(args, " "))
	prog.step("debootstrap %s (%d packages asked for) from %s", BaseSuite, len(pkgs), opts.mirror())
	cmd := exec.CommandContext(ctx, bin, args...)
	if err := runLogged(cmd, logf, prog.line); err != nil {
		return Template{}, fmt.Errorf("debootstrap: %w", err)
	}
	// debootstrap unmounts what it mounted on exit; make sure, so that
	// nothing below can reach the host's /proc or /sys.
	if err := unmountUnder(tmp); err != nil {
		return Template{}, err
	}

	if len(r.extra) > 0 {
		prog.step("apt-get install %d packages: %s", len(r.extra), strings.Join(r.extra, " "))
		script := "set -eu\napt-get update -q\napt-get install -y -q --no-install-recommends " + strings.Join(r.extra, " ") + "\n"
		if err := runChroot(ctx, rootfs, tmp, script, logf, prog.aptLine); err != nil {
			return Template{}, fmt.Errorf("install packages: %w", err)
		}
	}
	prog.step("setting up user, sudo, hostname; removing caches")
	if err := runChroot(ctx, rootfs, tmp, baseSetupScript, logf, nil); err != nil {
		return Template{}, fmt.Errorf("setup script: %w", err)
	}
	if r.script != "" {
		prog.step("setting up the %s template", r.name)
		if err := runChroot(ctx, rootfs, tmp, r.script, logf, prog.line); err != nil {
			return Template{}, fmt.Errorf("%s setup script: %w", r.name, err)
		}
	}
	for _, f := range r.files {
		fmt.Fprintf(logf, "# write %s (mode %o, %d bytes)\n", f.Path, f.Mode, len(f.Content))
		if err := writeRootFile(rootfs, f); err != nil {
			return Template{}, err
		}
	}
	if err := ctx.Err(); err != nil {
		return Template{}, err
	}

	prog.step("shifting ownership by %d", opts.IDBase)
	fmt.Fprintf(logf, "# shift ownership by %d\n", opts.IDBase)
	if err := ShiftOwnership(rootfs, int(opts.IDBase)); err != nil {
		return Template{}, err
	}
	size, err := diskUsage(rootfs)
	if err != nil {
		return Template{}, err
	}
	if err := syncFS(tmp); err != nil {
		return Template{}, err
	}
	m := Manifest{
		Name:          r.name,
		Version:       r.version,
		Digest:        digest,
		Size:          size,
		Created:       time.Now().UTC(),
		Packages:      r.allPackages(),
		Suite:         BaseSuite,
		Mirror:        opts.mirror(),
		RecipeVersion: r.recipeVersion,
		IDBase:        opts.IDBase,
	}
	m.BuildSeconds = m.Created.Sub(start).Seconds()
	fmt.Fprintf(logf, "# done in %.1fs, %d bytes\n", m.BuildSeconds, size)
	if err := logf.Close(); err != nil {
		return Template{}, fmt.Errorf("close build log: %w", err)
	}
	if err := installBuildDir(ctx, tmp, final, m); err != nil {
		return Template{}, err
	}
	prog.done("built %s in %s, %d MB", filepath.Base(final), time.Since(start).Round(time.Second), size>>20)
	return Open(final)
}

// runChroot runs script with /bin/sh in the chroot rootfs, logged, and
// then makes sure nothing it mounted stays mounted under tmp.
func runChroot(ctx context.Context, rootfs, tmp, script string, logf io.Writer, onLine func(string)) error {
	fmt.Fprintf(logf, "# in chroot\n%s", script)
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", script)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs}
	if err := runLogged(cmd, logf, onLine); err != nil {
		return err
	}
	return unmountUnder(tmp)
}

// writeRootFile writes f into the freshly built rootfs, owned by root,
// creating its parent directories (mode 0755). The tree is the build's
// own (Debian's packages, nothing a sandbox wrote), yet the file is
// written through os.Root so that no link in it leads the write out.
func writeRootFile(rootfs string, f File) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return fmt.Errorf("write %s: %w", f.Path, err)
	}
	defer root.Close()
	rel := strings.TrimPrefix(filepath.Clean(f.Path), "/")
	if dir := filepath.Dir(rel); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("write %s: %w", f.Path, err)
		}
	}
	if err := root.WriteFile(rel, f.Content, fs.FileMode(f.Mode)); err != nil {
		return fmt.Errorf("write %s: %w", f.Path, err)
	}
	if err := root.Chmod(rel, fs.FileMode(f.Mode)); err != nil {
		return fmt.Errorf("write %s: %w", f.Path, err)
	}
	return nil
}

// findDebootstrap returns the debootstrap program to run.
func findDebootstrap(prog string) (string, error) {
	if prog != "" {
		p, err := exec.LookPath(prog)
		if err != nil {
			return "", fmt.Errorf("find debootstrap: %w", err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("debootstrap"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/debootstrap", "/sbin/debootstrap"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("debootstrap not found (apt-get install debootstrap)")
}

// buildEnv is the environment of debootstrap and the setup script: a fixed
// one, plus the host's proxy settings so a mirror behind a proxy works.
func buildEnv() []string {
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root",
		"LC_ALL=C",
		"LANG=C",
		"DEBIAN_FRONTEND=noninteractive",
		"DEBCONF_NONINTERACTIVE_SEEN=true",
	}
	for _, k := range []string{"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// runLogged runs cmd in its own process group with stdout and stderr copied
// to log and, line by line, to onLine. Cancelling cmd's context kills the
// whole group (debootstrap runs dpkg, wget, chroot). A failure's error ends
// with the last lines of output.
func runLogged(cmd *exec.Cmd, log io.Writer, onLine func(string)) error {
	lw := &lineWriter{w: log, onLine: onLine}
	cmd.Stdout = lw
	cmd.Stderr = lw
	cmd.Env = buildEnv()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	cmd.Cancel = func() error {
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	lw.flush()
	if cmd.Process != nil {
		// Reap stragglers of the group (a daemon a maintainer script left).
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if err != nil {
		if tail := lw.tail(); tail != "" {
			return fmt.Errorf("%w; last output:\n%s", err, tail)
		}
		return err
	}
	return nil
}

// lineWriter copies output to w and calls onLine for each complete line,
// remembering the last few lines for error messages.
type lineWriter struct {
	mu     sync.Mutex
	w      io.Writer
	onLine func(string)
	buf    []byte   // incomplete last line; guarded by mu
	last   []string // last lines; guarded by mu
}

const tailLines = 8

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.w.Write(p); err != nil {
		return 0, err
	}
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.handle(string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
	return len(p), nil
}

// handle processes one line; l.mu is held.
func (l *lineWriter) handle(line string) {
	if l.onLine != nil {
		l.onLine(line)
	}
	l.last = append(l.last, line)
	if len(l.last) > tailLines {
		l.last = l.last[len(l.last)-tailLines:]
	}
}

func (l *lineWriter) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.handle(string(l.buf))
		l.buf = nil
	}
}

func (l *lineWriter) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.last, "\n")
}

// lockFile takes an exclusive flock on path, waiting until ctx is done.
// waiting is called once if the lock is held by someone else.
func lockFile(ctx context.Context, path string, waiting func()) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	told := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() {
				_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !told && waiting != nil {
			waiting()
			told = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// mountsUnder returns the mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	out := make([]string, 0, len(infos))
	for _, m := range infos {
		out = append(out, m.Mountpoint)
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

// unmountUnder detaches every mount at or below dir and fails if any is
// left.
func unmountUnder(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("unmount under %s: %w", dir, err)
	}
	// mountinfo lists resolved paths.
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	mps, err := mountsUnder(abs)
	if err != nil {
		return err
	}
	for _, mp := range mps {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmount %s: %w", mp, err)
		}
	}
	if len(mps) == 0 {
		return nil
	}
	left, err := mountsUnder(abs)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("mounts left under %s: %s", abs, strings.Join(left, ", "))
	}
	return nil
}

// removeTree removes a (partial) build dir. It first detaches any mount
// below it (debootstrap mounts /proc and /sys in the target and a killed
// debootstrap leaves them) and refuses to remove anything if a mount stays,
// so that removing a build can never delete host files through a mount.
func removeTree(dir string) error {
	if err := unmountUnder(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// diskUsage returns the disk space used by the tree at root, counting each
// hardlinked inode once.
func diskUsage(root string) (int64, error) {
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	var total int64
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(path, &st); err != nil {
			return &fs.PathError{Op: "lstat", Path: path, Err: err}
		}
		if st.Nlink > 1 {
			k := inode{uint64(st.Dev), st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		total += st.Blocks * 512
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("disk usage of %s: %w", root, err)
	}
	return total, nil
}

// syncFS flushes the filesystem holding dir to disk, so that a crash after
// the rename cannot leave a registered template with missing data.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// syncDir fsyncs a directory so a rename in it is durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// installBuildDir writes the manifest (last, so that a build dir with a
// manifest is complete), opens the dir to everyone and renames it into
// place atomically, then syncs the parent directory.
func installBuildDir(ctx context.Context, tmp, final string, m Manifest) error {
	if err := writeManifest(tmp, m); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("chmod build dir: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("install %s: %w", filepath.Base(final), err)
	}
	return syncDir(filepath.Dir(final))
}

// PrivateDir creates dir (and its parents) and makes it accessible to
// root only. Template trees hold setuid binaries owned by the shifted
// sandbox root (sudo is setuid to the uid range's base): a host user who
// could reach them could become that uid and change the templates every
// sandbox mounts.
// Sandboxes never need the path: their overlay is mounted by root.
func PrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}
