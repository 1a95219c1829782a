package template

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corralhq/corral/internal/idrange"
)

// ShiftOwnership adds offset to the uid and gid of every file under root,
// root included, without following symbolic links, so that a tree owned by
// container ids 0..65535 becomes owned by the host ids a user namespace maps
// them to (offset: the base of the server's uid range, see package idrange).
//
// Security: this is what makes "root inside is nobody outside" hold for the
// template's files. chown(2) clears the setuid and setgid bits and drops file
// capabilities; ShiftOwnership re-applies the mode of every setuid/setgid
// file (so sudo keeps working inside the sandbox) and rewrites a file
// capability as a v3 (namespaced) capability whose root is offset, so it is
// honoured in the sandbox's user namespace and nowhere else. A hardlinked
// inode is shifted once. An id outside 0..65535 is refused rather than
// shifted past the mapped range: it is most likely a tree shifted twice, and
// such a file would show up as the overflow id inside the sandbox.
func ShiftOwnership(root string, offset int) error {
	if offset < 0 || offset > 1<<31 {
		return fmt.Errorf("shift ownership of %s: invalid offset %d", root, offset)
	}
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(path, &st); err != nil {
			return &fs.PathError{Op: "lstat", Path: path, Err: err}
		}
		if st.Nlink > 1 && st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			key := inode{uint64(st.Dev), st.Ino}
			if seen[key] {
				return nil
			}
			seen[key] = true
		}
		if st.Uid >= idrange.Count || st.Gid >= idrange.Count {
			return fmt.Errorf("%s: owner %d:%d is outside the container id range 0-%d (already shifted?)", path, st.Uid, st.Gid, idrange.Count-1)
		}
		isLink := st.Mode&syscall.S_IFMT == syscall.S_IFLNK
		var capXattr []byte
		if !isLink {
			capXattr, err = getCapXattr(path)
			if err != nil {
				return err
			}
		}
		if err := os.Lchown(path, int(st.Uid)+offset, int(st.Gid)+offset); err != nil {
			return err
		}
		if isLink {
			return nil
		}
		if st.Mode&(syscall.S_ISUID|syscall.S_ISGID) != 0 {
			if err := syscall.Chmod(path, st.Mode&0o7777); err != nil {
				return &fs.PathError{Op: "chmod", Path: path, Err: err}
			}
		}
		if capXattr != nil {
			v3, err := namespacedCaps(capXattr, uint32(offset))
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if err := unix.Lsetxattr(path, capXattrName, v3, 0); err != nil {
				return &fs.PathError{Op: "setxattr " + capXattrName, Path: path, Err: err}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("shift ownership of %s by %d: %w", root, offset, err)
	}
	return nil
}

const capXattrName = "security.capability"

// getCapXattr returns the file capability xattr of path, or nil.
func getCapXattr(path string) ([]byte, error) {
	buf := make([]byte, 64)
	n, err := unix.Lgetxattr(path, capXattrName, buf)
	if err != nil {
		if errors.Is(err, unix.ENODATA) || errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, &fs.PathError{Op: "getxattr " + capXattrName, Path: path, Err: err}
	}
	return buf[:n], nil
}

// Layout of struct vfs_ns_cap_data (linux/capability.h).
const (
	vfsCapRevisionMask = 0xFF000000
	vfsCapRevision2    = 0x02000000
	vfsCapRevision3    = 0x03000000
	vfsCapV2Size       = 4 + 2*8
	vfsCapV3Size       = vfsCapV2Size + 4
)

// namespacedCaps converts a v2 or v3 file capability xattr to a v3 one whose
// root id is shifted by offset (a v2 xattr has root id 0): the capabilities
// then apply only to processes in a user namespace whose root maps to it.
func namespacedCaps(b []byte, offset uint32) ([]byte, error) {
	if len(b) < vfsCapV2Size {
		return nil, fmt.Errorf("file capability xattr too short (%d bytes)", len(b))
	}
	magic := binary.LittleEndian.Uint32(b)
	switch magic & vfsCapRevisionMask {
	case vfsCapRevision2, vfsCapRevision3:
	default:
		return nil, fmt.Errorf("unsupported file capability revision %#x", magic&vfsCapRevisionMask)
	}
	var rootID uint32
	if magic&vfsCapRevisionMask == vfsCapRevision3 {
		if len(b) < vfsCapV3Size {
			return nil, fmt.Errorf("v3 file capability xattr too short (%d bytes)", len(b))
		}
		rootID = binary.LittleEndian.Uint32(b[vfsCapV2Size:])
	}
	out := make([]byte, vfsCapV3Size)
	copy(out, b[:vfsCapV2Size])
	binary.LittleEndian.PutUint32(out, magic&^vfsCapRevisionMask|vfsCapRevision3)
	binary.LittleEndian.PutUint32(out[vfsCapV2Size:], rootID+offset)
	return out, nil
}
