package template

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// requireBuilder skips the test when the machine cannot build templates:
// -short, no debootstrap, or not root.
func requireBuilder(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping debootstrap build in -short mode")
	}
	if _, err := findDebootstrap(""); err != nil {
		t.Skipf("skipping: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("skipping: building a template needs root (debootstrap, chroot, chown)")
	}
}

func statT(t *testing.T, path string) syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatalf("lstat %s: %v", path, err)
	}
	return st
}

// TestBuildBase builds the real base template with debootstrap (or reuses
// the one cached in $CORRAL_TEMPLATE_CACHE / DefaultCacheDir) and checks the
// properties sandboxes rely on: user "user" uid 1000 with a home owned by
// host uid testBase+1000, a setuid sudo owned by host uid testBase (root
// inside is nobody outside, and sudo still works), python3, and no file
// owned by a host id below testBase. A second call must return the cached
// build without running debootstrap.
func TestBuildBase(t *testing.T) {
	requireBuilder(t)
	cacheDir := DefaultCacheDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	var out bytes.Buffer
	start := time.Now()
	tpl, err := BuildBase(ctx, cacheDir, BaseOptions{Progress: &out, IDBase: testBase})
	if err != nil {
		t.Fatalf("BuildBase: %v\nprogress:\n%s", err, out.String())
	}
	t.Logf("BuildBase took %s, size %d MB, dir %s", time.Since(start).Round(time.Second), tpl.Size>>20, tpl.Dir)
	if out.Len() > 0 {
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		t.Logf("progress: %d lines, last: %q", len(lines), lines[len(lines)-1])
	}

	digest := BaseOptions{IDBase: testBase}.Digest()
	if tpl.Digest != digest {
		t.Errorf("digest = %s, want %s", tpl.Digest, digest)
	}
	if want := filepath.Join(cacheDir, "base-"+digest[:16]); tpl.Dir != want {
		t.Errorf("dir = %s, want %s", tpl.Dir, want)
	}
	if tpl.RootFS != filepath.Join(tpl.Dir, "rootfs") || !filepath.IsAbs(tpl.RootFS) {
		t.Errorf("rootfs = %s", tpl.RootFS)
	}
	if tpl.Size < 100<<20 {
		t.Errorf("size = %d, want > 100 MB", tpl.Size)
	}
	m, err := ReadManifest(tpl.Dir)
	if err != nil {
		t.Fatalf("manifest: %v", err)
	}
	if m.Name != "base" || len(m.Packages) != len(DefaultBasePackages()) || m.Created.IsZero() {
		t.Errorf("manifest = %+v", m)
	}
	if fi, err := os.Stat(filepath.Join(tpl.Dir, BuildLogFile)); err != nil || fi.Size() == 0 {
		t.Errorf("build log missing or empty: %v", err)
	}

	root := tpl.RootFS
	passwd, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(passwd), "\nuser:x:1000:1000:") || !strings.Contains(string(passwd), ":/home/user:/bin/bash\n") {
		t.Errorf("/etc/passwd has no user 1000 with home /home/user and bash:\n%s", passwd)
	}
	group, _ := os.ReadFile(filepath.Join(root, "etc/group"))
	if !strings.Contains(string(group), "\nuser:x:1000:") {
		t.Errorf("/etc/group has no group user 1000")
	}

	checks := []struct {
		path     string
		uid, gid uint32
		perm     uint32 // mode & 07777; 0 means do not check
	}{
		{"home/user", testBase + 1000, testBase + 1000, 0o755},
		{"home/user/.bashrc", testBase + 1000, testBase + 1000, 0},
		{"home/user/.profile", testBase + 1000, testBase + 1000, 0},
		{"usr/bin/sudo", testBase, testBase, 0o4755},
		{"etc/sudoers.d/user", testBase, testBase, 0o440},
		{"run/corral", testBase, testBase, 0o700},
		{".corral", testBase, testBase, 0o755},
		{".", testBase, testBase, 0o755},
	}
	for _, c := range checks {
		st := statT(t, filepath.Join(root, c.path))
		if st.Uid != c.uid || st.Gid != c.gid {
			t.Errorf("%s owned by %d:%d, want %d:%d", c.path, st.Uid, st.Gid, c.uid, c.gid)
		}
		if c.perm != 0 && st.Mode&0o7777 != c.perm {
			t.Errorf("%s mode %#o, want %#o", c.path, st.Mode&0o7777, c.perm)
		}
	}
	sudoers, _ := os.ReadFile(filepath.Join(root, "etc/sudoers.d/user"))
	if strings.TrimSpace(string(sudoers)) != "user ALL=(ALL:ALL) NOPASSWD: ALL" {
		t.Errorf("sudoers.d/user = %q", sudoers)
	}
	for _, f := range []string{"usr/bin/python3", "usr/bin/python", "usr/bin/git", "usr/bin/curl", "usr/bin/tput", "usr/bin/ps", "usr/bin/ip", "bin/bash"} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("missing %s: %v", f, err)
		}
	}
	if h, _ := os.ReadFile(filepath.Join(root, "etc/hostname")); string(h) != "corral\n" {
		t.Errorf("hostname = %q", h)
	}
	if fi, err := os.Stat(filepath.Join(root, "etc/resolv.conf")); err != nil || fi.Size() != 0 {
		t.Errorf("resolv.conf not empty: %v", err)
	}
	if lists, _ := filepath.Glob(filepath.Join(root, "var/lib/apt/lists/*_Packages")); len(lists) > 0 {
		t.Errorf("apt lists left: %v", lists)
	}
	if debs, _ := filepath.Glob(filepath.Join(root, "var/cache/apt/archives/*.deb")); len(debs) > 0 {
		t.Errorf("%d debs left in apt cache", len(debs))
	}
	var low []string
	_ = filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		st := statT(t, p)
		if st.Uid < testBase || st.Gid < testBase {
			low = append(low, p)
		}
		return nil
	})
	if len(low) > 0 {
		t.Errorf("%d files not shifted, e.g. %v", len(low), low[:min(5, len(low))])
	}

	// Cached: must not run debootstrap (the program given does not exist)
	// and must return the same build.
	again, err := BuildBase(ctx, cacheDir, BaseOptions{Debootstrap: "/nonexistent/debootstrap", IDBase: testBase})
	if err != nil {
		t.Fatalf("second BuildBase: %v", err)
	}
	if again.Dir != tpl.Dir || !again.Created.Equal(tpl.Created) {
		t.Errorf("second BuildBase rebuilt: %+v, first %+v", again, tpl)
	}

	got, err := Open(tpl.Dir)
	if err != nil || got.RootFS != tpl.RootFS || got.Version != tpl.Version {
		t.Errorf("Open(%s) = %+v, %v", tpl.Dir, got, err)
	}
}

// TestBuildBaseFailureLeavesNothing checks that a failed build leaves no
// partial template behind: debootstrap fails at once on a mirror that
// refuses connections (on 127.0.0.1, no traffic leaves the machine).
func TestBuildBaseFailureLeavesNothing(t *testing.T) {
	requireBuilder(t)
	cacheDir := t.TempDir()
	var out bytes.Buffer
	_, err := BuildBase(context.Background(), cacheDir, BaseOptions{Mirror: "http://127.0.0.1:1/debian", Progress: &out, IDBase: testBase})
	if err == nil {
		t.Fatal("BuildBase with an unreachable mirror succeeded")
	}
	if !strings.Contains(err.Error(), "debootstrap") {
		t.Errorf("error does not name debootstrap: %v", err)
	}
	ents, _ := os.ReadDir(cacheDir)
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".lock") {
			t.Errorf("failed build left %s", e.Name())
		}
	}
	if !strings.Contains(out.String(), "build failed") {
		t.Errorf("progress does not report the failure:\n%s", out.String())
	}
}

// TestBuildBaseCancel checks that cancelling a build kills debootstrap and
// its children (here a wget stuck on a mirror that never answers, on
// 127.0.0.1) and removes the partial build.
func TestBuildBaseCancel(t *testing.T) {
	requireBuilder(t)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)

	cacheDir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	go func() {
		// Cancel once debootstrap is waiting for the mirror.
		for !strings.Contains(out.String(), "debootstrap") {
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(time.Second)
		cancel()
	}()
	_, err := BuildBase(ctx, cacheDir, BaseOptions{Mirror: srv.URL + "/debian", Progress: &out, IDBase: testBase})
	if err == nil {
		t.Fatal("cancelled BuildBase succeeded")
	}
	ents, _ := os.ReadDir(cacheDir)
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".lock") {
			t.Errorf("cancelled build left %s", e.Name())
		}
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestBuildBaseConcurrent checks that two concurrent cached lookups agree.
// (Concurrent cold builds are serialized by the lock file; they are not
// run here to keep the test to one debootstrap.)
func TestBuildBaseConcurrent(t *testing.T) {
	requireBuilder(t)
	var wg sync.WaitGroup
	res := make([]Template, 2)
	errs := make([]error, 2)
	for i := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = BuildBase(context.Background(), DefaultCacheDir(), BaseOptions{IDBase: testBase})
		}()
	}
	wg.Wait()
	for i := range res {
		if errs[i] != nil {
			t.Fatalf("BuildBase %d: %v", i, errs[i])
		}
	}
	if res[0].Dir != res[1].Dir || !res[0].Created.Equal(res[1].Created) {
		t.Errorf("concurrent BuildBase disagree: %+v vs %+v", res[0], res[1])
	}
}

// TestRemoveTreeSparesMounts checks the safety property of removeTree: a
// partial build with a host directory still mounted inside (as a killed
// debootstrap leaves /proc and /sys) is removed without deleting anything
// of the host directory.
func TestRemoveTreeSparesMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: mount needs root")
	}
	host := t.TempDir()
	sentinel := filepath.Join(host, "precious")
	if err := os.WriteFile(sentinel, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	build := filepath.Join(t.TempDir(), ".tmp-base-x")
	mp := filepath.Join(build, "rootfs", "proc")
	if err := os.MkdirAll(mp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(host, mp, "", syscall.MS_BIND, ""); err != nil {
		t.Skipf("skipping: bind mount not permitted here: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(mp, syscall.MNT_DETACH) })
	if err := removeTree(build); err != nil {
		t.Fatalf("removeTree: %v", err)
	}
	if _, err := os.Stat(build); !os.IsNotExist(err) {
		t.Errorf("build dir still there: %v", err)
	}
	if b, err := os.ReadFile(sentinel); err != nil || string(b) != "keep" {
		t.Errorf("host file behind the mount was touched: %q, %v", b, err)
	}
	if left, _ := mountsUnder(build); len(left) > 0 {
		t.Errorf("mounts left: %v", left)
	}
}
