//go:build linux

package inroot

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// inRoot resolves like the sandbox does, without leaving the root: an
// absolute link target and ".." at the top both mean the root.
const inRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// resolveAt opens name inside the directory root with openat2(2). It
// retries EAGAIN, which RESOLVE_IN_ROOT returns when a rename raced the
// lookup of "..". Errors name name, never root.
func resolveAt(root, name string, flags int, resolve uint64) (int, error) {
	if name == "" || strings.IndexByte(name, 0) >= 0 {
		return -1, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open root of %s: %w", name, err)
	}
	defer unix.Close(rfd)
	how := &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: resolve}
	for range 64 {
		fd, err := unix.Openat2(rfd, name, how)
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ELOOP):
			if resolve&unix.RESOLVE_NO_SYMLINKS != 0 {
				return -1, refused(name, "is a symbolic link or lies under one")
			}
			return -1, refused(name, "has too many levels of symbolic links")
		case errors.Is(err, unix.EXDEV):
			return -1, refused(name, "crosses a mount point")
		default:
			return -1, &fs.PathError{Op: "open", Path: name, Err: err}
		}
	}
	return -1, &fs.PathError{Op: "open", Path: name, Err: unix.EAGAIN}
}

// ReadFile returns the content of the regular file name inside root (name
// resolved as the sandbox resolves it, see the package doc). Something
// other than a regular file, or a file over max bytes, is a RefusedError;
// a path that resolves to nothing inside root satisfies
// errors.Is(err, fs.ErrNotExist). A device, FIFO or socket is never opened
// for reading: the file is looked up with O_PATH and reopened only once
// fstat(2) says it is regular.
func ReadFile(root, name string, max int64) ([]byte, error) {
	fd, err := resolveAt(root, name, unix.O_PATH, inRoot)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &fs.PathError{Op: "stat", Path: name, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, refused(name, "is not a regular file")
	}
	if st.Size > max {
		return nil, refused(name, "is larger than %d bytes", max)
	}
	// Reopening the O_PATH descriptor through /proc reads exactly the
	// inode checked above, with no second path lookup.
	f, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(fd), os.O_RDONLY|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "reopen", Path: name, Err: cause(err)}
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: name, Err: cause(err)}
	}
	if int64(len(b)) > max {
		return nil, refused(name, "is larger than %d bytes", max)
	}
	return b, nil
}

// StatMode returns the type and permission bits of what name resolves to
// inside root (following links as the sandbox would, never out of root).
// A path that resolves to nothing satisfies errors.Is(err, fs.ErrNotExist).
func StatMode(root, name string) (fs.FileMode, error) {
	fd, err := resolveAt(root, name, unix.O_PATH, inRoot)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, &fs.PathError{Op: "stat", Path: name, Err: err}
	}
	return fileMode(st.Mode), nil
}

// RealDir checks that name is a directory inside root reached through no
// symbolic link at all, not even one that stays inside root. It is for a
// path that corral hands to a runtime as a host path (a bind-mount
// source): the runtime resolves that path on the host, where a link the
// content planted would name a host directory. Anything else is a
// RefusedError. The answer holds while nothing but corral can change the
// directories on the way, as before a sandbox starts.
func RealDir(root, name string) error {
	fd, err := resolveAt(root, name, unix.O_PATH|unix.O_DIRECTORY,
		unix.RESOLVE_IN_ROOT|unix.RESOLVE_NO_SYMLINKS|unix.RESOLVE_NO_XDEV)
	switch {
	case errors.Is(err, unix.ENOTDIR):
		return refused(name, "is not a directory")
	case errors.Is(err, unix.ENOENT):
		return refused(name, "does not exist")
	case err != nil:
		return err
	}
	return unix.Close(fd)
}

// cause strips the /proc path off an error of the reopened file.
func cause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// fileMode converts a stat(2) mode to an fs.FileMode.
func fileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	}
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}
