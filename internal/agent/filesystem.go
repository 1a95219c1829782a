package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"connectrpc.com/connect"

	fspb "github.com/corralhq/corral/proto/filesystem"
)

// filesystemService implements filesystemconnect.FilesystemHandler.
type filesystemService struct{ s *Server }

// fsError maps an OS error to a Connect error.
func fsError(err error, path string) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("path '%s' does not exist", path))
	case errors.Is(err, fs.ErrPermission):
		return connect.NewError(connect.CodePermissionDenied, err)
	default:
		return connect.NewError(connect.CodeInternal, err)
	}
}

// Stat describes a path without following a final symlink.
func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[fspb.StatRequest]) (*connect.Response[fspb.StatResponse], error) {
	u, db, err := f.s.rpcUser(req.Header())
	if err != nil {
		return nil, err
	}
	p, err := rpcPath(req.Msg.GetPath(), u)
	if err != nil {
		return nil, err
	}
	e, err := entryInfo(p, p, db)
	if err != nil {
		return nil, fsError(err, p)
	}
	return connect.NewResponse(&fspb.StatResponse{Entry: e}), nil
}

// MakeDir creates a directory and its parents, owned by the user.
func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[fspb.MakeDirRequest]) (*connect.Response[fspb.MakeDirResponse], error) {
	u, db, err := f.s.rpcUser(req.Header())
	if err != nil {
		return nil, err
	}
	p, err := rpcPath(req.Msg.GetPath(), u)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(p); err == nil {
		if fi.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory '%s' already exists", p))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' already exists and is not a directory", p))
	}
	if err := mkdirAllOwned(p, u); err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("error creating directory '%s': %w", p, err))
		}
		return nil, fsError(err, p)
	}
	e, err := entryInfo(p, p, db)
	if err != nil {
		return nil, fsError(err, p)
	}
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: e}), nil
}

// Move renames source to destination, creating destination's parents.
func (f *filesystemService) Move(ctx context.Context, req *connect.Request[fspb.MoveRequest]) (*connect.Response[fspb.MoveResponse], error) {
	u, db, err := f.s.rpcUser(req.Header())
	if err != nil {
		return nil, err
	}
	src, err := rpcPath(req.Msg.GetSource(), u)
	if err != nil {
		return nil, err
	}
	dst, err := rpcPath(req.Msg.GetDestination(), u)
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(src); err != nil {
		return nil, fsError(err, src)
	}
	if err := mkdirAllOwned(filepath.Dir(dst), u); err != nil {
		return nil, fsError(err, filepath.Dir(dst))
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, fsError(err, src)
	}
	e, err := entryInfo(dst, dst, db)
	if err != nil {
		return nil, fsError(err, dst)
	}
	return connect.NewResponse(&fspb.MoveResponse{Entry: e}), nil
}

// ListDir lists the descendants of a directory up to depth (0 means 1), in
// filepath.WalkDir order, the directory itself excluded.
func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	u, db, err := f.s.rpcUser(req.Header())
	if err != nil {
		return nil, err
	}
	p, err := rpcPath(req.Msg.GetPath(), u)
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	root, err := filepath.EvalSymlinks(p)
	if err != nil {
		return nil, fsError(err, p)
	}
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fsError(err, p)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' is not a directory", p))
	}
	resp := &fspb.ListDirResponse{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if path == root {
			return err // a root that cannot be read is an error
		}
		rel, rerr := filepath.Rel(root, path)
		if rerr != nil {
			return rerr
		}
		level := strings.Count(rel, string(filepath.Separator)) + 1
		if err != nil {
			// Unreadable subdirectory: skip it, keep listing.
			if d != nil && d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		info, ierr := d.Info()
		if ierr != nil {
			return nil // vanished meanwhile
		}
		resp.Entries = append(resp.Entries, entryFromInfo(path, filepath.Join(p, rel), info, db))
		if d.IsDir() && level >= depth {
			return fs.SkipDir
		}
		return nil
	})
	if err != nil {
		return nil, fsError(err, p)
	}
	return connect.NewResponse(resp), nil
}

// Remove deletes a path recursively; a missing path is not an error.
func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[fspb.RemoveRequest]) (*connect.Response[fspb.RemoveResponse], error) {
	u, _, err := f.s.rpcUser(req.Header())
	if err != nil {
		return nil, err
	}
	p, err := rpcPath(req.Msg.GetPath(), u)
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(p); err != nil {
		return nil, fsError(err, p)
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}
