package template

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestShiftOwnership checks that every file of a tree, symlinks and the root
// included, ends up owned by its old ids plus the offset; that setuid and
// setgid bits survive the chown (so sudo still works inside a sandbox); that
// a symlink's target outside the tree is not touched (Lchown, no following);
// and that a hardlinked inode is shifted once, not twice.
func TestShiftOwnership(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: chown to arbitrary ids needs root")
	}
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	type entry struct {
		path     string
		kind     string // file, dir, symlink, hardlink
		target   string // symlink or hardlink target
		uid, gid int
		perm     os.FileMode // with os.ModeSetuid etc.
	}
	tree := []entry{
		{path: "etc", kind: "dir", perm: 0o755},
		{path: "etc/passwd", kind: "file", perm: 0o644},
		{path: "home/user", kind: "dir", uid: 1000, gid: 1000, perm: 0o700},
		{path: "home/user/.bashrc", kind: "file", uid: 1000, gid: 1000, perm: 0o644},
		{path: "usr/bin/sudo", kind: "file", perm: 0o755 | os.ModeSetuid},
		{path: "usr/bin/wall", kind: "file", gid: 5, perm: 0o755 | os.ModeSetgid},
		{path: "usr/bin/both", kind: "file", gid: 42, perm: 0o750 | os.ModeSetuid | os.ModeSetgid},
		{path: "tmp", kind: "dir", perm: 0o777 | os.ModeSticky},
		{path: "var/mail", kind: "dir", gid: 8, perm: 0o775 | os.ModeSetgid},
		{path: "usr/bin/python", kind: "symlink", target: "python3"},
		{path: "escape", kind: "symlink", target: outside},
		{path: "usr/bin/hard", kind: "hardlink", target: "usr/bin/sudo"},
		{path: "nobody", kind: "file", uid: 65534, gid: 65534, perm: 0o600},
	}
	for _, e := range tree {
		p := filepath.Join(root, e.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch e.kind {
		case "dir":
			err = os.Mkdir(p, 0o700)
		case "file":
			err = os.WriteFile(p, []byte(e.path), 0o600)
		case "symlink":
			err = os.Symlink(e.target, p)
		case "hardlink":
			err = os.Link(filepath.Join(root, e.target), p)
		}
		if err != nil {
			t.Fatal(err)
		}
		if e.kind == "dir" || e.kind == "file" {
			if err := os.Lchown(p, e.uid, e.gid); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, e.perm); err != nil {
				t.Fatal(err)
			}
		}
	}

	const off = 100000
	if err := ShiftOwnership(root, off); err != nil {
		t.Fatalf("ShiftOwnership: %v", err)
	}

	for _, e := range tree {
		p := filepath.Join(root, e.path)
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		wantUID, wantGID := uint32(e.uid+off), uint32(e.gid+off)
		wantPerm := e.perm
		if e.kind == "hardlink" {
			wantPerm = 0o755 | os.ModeSetuid // same inode as sudo
		}
		if st.Uid != wantUID || st.Gid != wantGID {
			t.Errorf("%s (%s): owner %d:%d, want %d:%d", e.path, e.kind, st.Uid, st.Gid, wantUID, wantGID)
		}
		if e.kind != "symlink" {
			if got := fi.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky); got != wantPerm {
				t.Errorf("%s: mode %v, want %v", e.path, got, wantPerm)
			}
		}
	}
	st := statT(t, root)
	if st.Uid != off || st.Gid != off {
		t.Errorf("root owned by %d:%d, want %d:%d", st.Uid, st.Gid, off, off)
	}
	if st := statT(t, outside); st.Uid != 0 {
		t.Errorf("symlink target outside the tree was chowned to %d", st.Uid)
	}

	// A second shift would push ids out of the mapped range: refused.
	err := ShiftOwnership(root, off)
	if err == nil || !strings.Contains(err.Error(), "already shifted") {
		t.Errorf("second ShiftOwnership: err = %v, want an 'already shifted' error", err)
	}
}

// TestShiftOwnershipFileCaps checks that a file capability, which chown
// drops, comes back as a v3 capability rooted at the offset: honoured for the
// sandbox's root only, never for the host's.
func TestShiftOwnershipFileCaps(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: chown and setcap need root")
	}
	setcap, err := exec.LookPath("setcap")
	if err != nil {
		t.Skip("skipping: setcap not installed")
	}
	root := t.TempDir()
	p := filepath.Join(root, "ping")
	if err := os.WriteFile(p, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(setcap, "cap_net_raw+ep", p).CombinedOutput(); err != nil {
		t.Skipf("skipping: setcap fails here (filesystem without xattrs?): %v %s", err, out)
	}
	if err := ShiftOwnership(root, 100000); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := unix.Lgetxattr(p, capXattrName, buf)
	if err != nil {
		t.Fatalf("capability lost: %v", err)
	}
	if n != vfsCapV3Size {
		t.Fatalf("capability xattr has %d bytes, want a v3 one (%d)", n, vfsCapV3Size)
	}
	if rev := binary.LittleEndian.Uint32(buf) & vfsCapRevisionMask; rev != vfsCapRevision3 {
		t.Errorf("revision %#x, want v3", rev)
	}
	if rootid := binary.LittleEndian.Uint32(buf[vfsCapV2Size:]); rootid != 100000 {
		t.Errorf("rootid %d, want 100000", rootid)
	}
	if perm := binary.LittleEndian.Uint32(buf[4:]); perm&(1<<unix.CAP_NET_RAW) == 0 {
		t.Errorf("permitted set %#x lost CAP_NET_RAW", perm)
	}
}

func TestNamespacedCaps(t *testing.T) {
	v2 := make([]byte, vfsCapV2Size)
	binary.LittleEndian.PutUint32(v2, vfsCapRevision2|1) // effective flag
	binary.LittleEndian.PutUint32(v2[4:], 1<<13)
	v3 := make([]byte, vfsCapV3Size)
	binary.LittleEndian.PutUint32(v3, vfsCapRevision3)
	binary.LittleEndian.PutUint32(v3[vfsCapV2Size:], 7)
	bad := make([]byte, vfsCapV2Size)
	binary.LittleEndian.PutUint32(bad, 0x01000000)
	tests := []struct {
		name     string
		in       []byte
		wantRoot uint32
		wantErr  bool
	}{
		{"v2 becomes v3 rooted at offset", v2, 100000, false},
		{"v3 root shifted", v3, 100007, false},
		{"v1 refused", bad, 0, true},
		{"short refused", v2[:8], 0, true},
		{"short v3 refused", append([]byte(nil), v3[:vfsCapV2Size]...), 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := namespacedCaps(tt.in, 100000)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if got := binary.LittleEndian.Uint32(out[vfsCapV2Size:]); got != tt.wantRoot {
				t.Errorf("rootid = %d, want %d", got, tt.wantRoot)
			}
			if got := binary.LittleEndian.Uint32(out); got&vfsCapRevisionMask != vfsCapRevision3 || got&1 != binary.LittleEndian.Uint32(tt.in)&1 {
				t.Errorf("magic = %#x", got)
			}
		})
	}
}
