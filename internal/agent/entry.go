package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	fspb "github.com/corralhq/corral/proto/filesystem"
)

// xattrPrefix namespaces file metadata set through X-Metadata-* headers.
const xattrPrefix = "user.e2b."

// entryInfo describes path (not following a final symlink), named as
// reported: reportPath is the path the client asked for.
func entryInfo(path, reportPath string, db *userDB) (*fspb.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	return entryFromInfo(path, reportPath, fi, db), nil
}

func entryFromInfo(path, reportPath string, fi os.FileInfo, db *userDB) *fspb.EntryInfo {
	e := &fspb.EntryInfo{
		Name:         filepath.Base(reportPath),
		Path:         reportPath,
		Size:         fi.Size(),
		Mode:         uint32(fi.Mode().Perm()),
		Permissions:  fi.Mode().String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
		Type:         fileType(fi.Mode()),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = db.userName(st.Uid)
		e.Group = db.groupName(st.Gid)
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		e.Type = fspb.FileType_FILE_TYPE_UNSPECIFIED
		if target, err := filepath.EvalSymlinks(path); err == nil {
			if abs, err := filepath.Abs(target); err == nil {
				e.SymlinkTarget = &abs
			}
			if tfi, err := os.Stat(target); err == nil {
				e.Type = fileType(tfi.Mode())
			}
		} else if link, err := os.Readlink(path); err == nil {
			if !filepath.IsAbs(link) {
				link = filepath.Join(filepath.Dir(path), link)
			}
			e.SymlinkTarget = &link
		}
	} else if md := readMetadata(path); len(md) > 0 {
		e.Metadata = md
	}
	return e
}

func fileType(m os.FileMode) fspb.FileType {
	switch {
	case m.IsRegular():
		return fspb.FileType_FILE_TYPE_FILE
	case m.IsDir():
		return fspb.FileType_FILE_TYPE_DIRECTORY
	case m&os.ModeSymlink != 0:
		return fspb.FileType_FILE_TYPE_SYMLINK
	}
	return fspb.FileType_FILE_TYPE_UNSPECIFIED
}

// readMetadata returns the user.e2b.* extended attributes of path.
func readMetadata(path string) map[string]string {
	names := listXattrs(path)
	var md map[string]string
	for _, n := range names {
		key, ok := strings.CutPrefix(n, xattrPrefix)
		if !ok || key == "" {
			continue
		}
		buf := make([]byte, 4096)
		sz, err := unix.Lgetxattr(path, n, buf)
		if err != nil {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = string(buf[:sz])
	}
	return md
}

func listXattrs(path string) []string {
	sz, err := unix.Llistxattr(path, nil)
	if err != nil || sz <= 0 {
		return nil
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(path, buf)
	if err != nil {
		return nil
	}
	var out []string
	for _, b := range bytes.Split(buf[:sz], []byte{0}) {
		if len(b) > 0 {
			out = append(out, string(b))
		}
	}
	return out
}

// writeMetadata replaces path's user.e2b.* attributes with md.
func writeMetadata(path string, md map[string]string) error {
	for _, n := range listXattrs(path) {
		if strings.HasPrefix(n, xattrPrefix) {
			_ = unix.Lremovexattr(path, n)
		}
	}
	for k, v := range md {
		if err := unix.Lsetxattr(path, xattrPrefix+k, []byte(v), 0); err != nil {
			return err
		}
	}
	return nil
}

// mkdirAllOwned creates dir and missing parents with mode 0755, owned by u.
// Existing directories are left alone.
func mkdirAllOwned(dir string, u *user) error {
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return &os.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOTDIR}
		}
		return nil
	}
	if !os.IsNotExist(err) {
		return err
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := mkdirAllOwned(parent, u); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		if os.IsExist(err) {
			return nil
		}
		return err
	}
	_ = os.Chmod(dir, 0o755)
	return os.Lchown(dir, int(u.UID), int(u.GID))
}
