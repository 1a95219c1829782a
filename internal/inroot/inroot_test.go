//go:build linux

package inroot

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// hostTree makes a host directory holding a secret file (what a template
// must never reach) and a root directory (the template's rootfs) beside
// it, and returns both.
func hostTree(t *testing.T) (host, root string) {
	t.Helper()
	base := t.TempDir()
	host = filepath.Join(base, "data")
	root = filepath.Join(base, "templates", "x", "rootfs")
	for _, d := range []string{host, filepath.Join(root, "etc", "ssl", "certs"), filepath.Join(root, "usr", "bin"), filepath.Join(root, "srv")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(host, "admin.key"), []byte("HOST-SECRET"), 0o600); err != nil {
		t.Fatal(err)
	}
	return host, root
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// TestReadFileStaysInRoot defends against a template whose file is a link
// to a host file (the egress CA key, the admin key): an absolute target
// and a relative one climbing out with ".." both resolve inside the root,
// as the sandbox resolves them, so the host file's content is never
// returned; a link to /dev/zero resolves to the root's /dev/zero (absent
// here) instead of an endless host device; a FIFO or a directory is
// refused without blocking; a file over the bound is refused.
func TestReadFileStaysInRoot(t *testing.T) {
	host, root := hostTree(t)
	bundle := "/etc/ssl/certs/ca-certificates.crt"
	in := func(p string) string { return filepath.Join(root, filepath.FromSlash(p)) }
	up := strings.Repeat("../", 20) + strings.TrimPrefix(host, "/") + "/admin.key"
	if err := os.MkdirAll(in("/"+strings.TrimPrefix(host, "/")), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(in("/srv/inside.pem"), []byte("INSIDE"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		setup   func(link string)
		want    string // content; "" with wantErr
		wantErr error
	}{
		{"regular file", func(l string) { os.WriteFile(l, []byte("BUNDLE"), 0o644) }, "BUNDLE", nil},
		{"absolute link to a host file", func(l string) { symlink(t, host+"/admin.key", l) }, "", fs.ErrNotExist},
		{"relative link climbing out", func(l string) { symlink(t, up, l) }, "", fs.ErrNotExist},
		{"absolute link inside the root", func(l string) { symlink(t, "/srv/inside.pem", l) }, "INSIDE", nil},
		{"relative link inside the root", func(l string) { symlink(t, "../../../srv/inside.pem", l) }, "INSIDE", nil},
		{"link to /dev/zero", func(l string) { symlink(t, "/dev/zero", l) }, "", fs.ErrNotExist},
		{"link through /proc/self/root", func(l string) { symlink(t, "/proc/self/root"+host+"/admin.key", l) }, "", fs.ErrNotExist},
		{"fifo", func(l string) {
			if err := unix.Mkfifo(l, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "", ErrRefused},
		{"directory", func(l string) { os.Mkdir(l, 0o755) }, "", ErrRefused},
		{"over the bound", func(l string) { os.WriteFile(l, make([]byte, 65), 0o644) }, "", ErrRefused},
		{"link loop", func(l string) { symlink(t, bundle, l) }, "", ErrRefused},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			link := in(bundle)
			os.RemoveAll(link)
			c.setup(link)
			got, err := ReadFile(root, bundle, 64)
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("ReadFile = %q, %v; want an error matching %v", got, err, c.wantErr)
				}
				if strings.Contains(err.Error(), root) || strings.Contains(err.Error(), host) {
					t.Fatalf("error %q names a host path", err)
				}
				return
			}
			if err != nil || string(got) != c.want {
				t.Fatalf("ReadFile = %q, %v; want %q", got, err, c.want)
			}
		})
	}
	// The host file is where it was, unread by anything above.
	if b, err := os.ReadFile(filepath.Join(host, "admin.key")); err != nil || string(b) != "HOST-SECRET" {
		t.Fatalf("host file: %q %v", b, err)
	}
}

// TestStatModeStaysInRoot defends against a template whose /usr/bin/sudo
// links to a host file: its existence on the host must not decide what
// the sandbox gets (no_new_privs off).
func TestStatModeStaysInRoot(t *testing.T) {
	host, root := hostTree(t)
	sudo := filepath.Join(root, "usr", "bin", "sudo")
	symlink(t, host+"/admin.key", sudo)
	if m, err := StatMode(root, "/usr/bin/sudo"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("StatMode of a link to a host file = %v, %v; want not exist", m, err)
	}
	os.Remove(sudo)
	symlink(t, "/srv/sudo", sudo)
	if err := os.WriteFile(filepath.Join(root, "srv", "sudo"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, "srv", "sudo"), os.ModeSetuid|0o755); err != nil {
		t.Fatal(err)
	}
	if m, err := StatMode(root, "/usr/bin/sudo"); err != nil || !m.IsRegular() || m&fs.ModeSetuid == 0 {
		t.Fatalf("StatMode of a link inside the root = %v, %v; want a setuid regular file", m, err)
	}
}

// TestRealDir defends against a bind-mount source named by a host path
// through content of the root: gVisor binds /tmp from the sandbox's root
// file system, and a /tmp that is a link (to /etc, say) would make the
// runtime mount that host directory read-write. Only a directory reached
// through no link at all passes.
func TestRealDir(t *testing.T) {
	host, root := hostTree(t)
	in := func(p string) string { return filepath.Join(root, p) }
	os.Mkdir(in("realtmp"), 0o1777)
	symlink(t, host, in("hostlink"))
	symlink(t, "/realtmp", in("innerlink"))
	symlink(t, "/srv", in("srvlink"))
	os.Mkdir(in("srv/sub"), 0o755)
	os.WriteFile(in("file"), nil, 0o644)
	cases := []struct {
		name string
		ok   bool
	}{
		{"/realtmp", true},
		{"realtmp", true},
		{"/hostlink", false},
		{"/innerlink", false}, // even a link that stays inside: the runtime resolves it on the host
		{"/srvlink/sub", false},
		{"/srv/sub", true},
		{"/missing", false},
		{"/file", false},
	}
	for _, c := range cases {
		err := RealDir(root, c.name)
		if c.ok != (err == nil) || (err != nil && !errors.Is(err, ErrRefused)) {
			t.Errorf("RealDir(%s) = %v; want ok %v (or a RefusedError)", c.name, err, c.ok)
		}
		if err != nil && strings.Contains(err.Error(), root) {
			t.Errorf("error %q names a host path", err)
		}
	}
}
