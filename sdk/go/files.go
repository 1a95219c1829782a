package corral

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	"connectrpc.com/connect"

	"github.com/corralhq/corral/proto/filesystem"
	"github.com/corralhq/corral/proto/filesystem/filesystemconnect"
)

// DefaultMaxReadSize bounds [Files.Read] when Files.MaxReadSize is 0.
const DefaultMaxReadSize = 64 << 20

// Files accesses a sandbox's filesystem through its agent. Relative paths
// are resolved against the user's home directory. Get one with
// [Sandbox.Files].
type Files struct {
	// User is the sandbox user the operations run as ("" = the default
	// user, "user"); files created belong to it.
	User string
	// MaxReadSize bounds Read (default DefaultMaxReadSize).
	MaxReadSize int64

	sb *Sandbox
}

// Files returns the sandbox's filesystem, used as the default user.
func (s *Sandbox) Files() *Files { return &Files{sb: s} }

// WithUser returns a copy of f that acts as user.
func (f *Files) WithUser(user string) *Files {
	g := *f
	g.User = user
	return &g
}

// FileType is the type of a filesystem entry.
type FileType string

// File types.
const (
	FileTypeFile    FileType = "file"
	FileTypeDir     FileType = "dir"
	FileTypeSymlink FileType = "symlink"
	FileTypeUnknown FileType = ""
)

// EntryInfo describes a file or directory in a sandbox.
type EntryInfo struct {
	Name string
	// Type is the entry's type; for a symlink, the type of its target.
	Type FileType
	Path string
	Size int64
	// Mode holds the permission bits.
	Mode os.FileMode
	// Permissions is the mode as text, e.g. "-rw-r--r--".
	Permissions  string
	Owner, Group string
	ModifiedTime time.Time
	// SymlinkTarget is the resolved target of a symlink, else "".
	SymlinkTarget string
	Metadata      map[string]string
}

func entryFromProto(e *filesystem.EntryInfo) *EntryInfo {
	if e == nil {
		return nil
	}
	out := &EntryInfo{
		Name: e.GetName(), Path: e.GetPath(), Size: e.GetSize(), Mode: os.FileMode(e.GetMode()),
		Permissions: e.GetPermissions(), Owner: e.GetOwner(), Group: e.GetGroup(),
		SymlinkTarget: e.GetSymlinkTarget(), Metadata: e.GetMetadata(),
	}
	switch e.GetType() {
	case filesystem.FileType_FILE_TYPE_FILE:
		out.Type = FileTypeFile
	case filesystem.FileType_FILE_TYPE_DIRECTORY:
		out.Type = FileTypeDir
	case filesystem.FileType_FILE_TYPE_SYMLINK:
		out.Type = FileTypeSymlink
	}
	if t := e.GetModifiedTime(); t != nil {
		out.ModifiedTime = t.AsTime()
	}
	return out
}

func (f *Files) client() filesystemconnect.FilesystemClient {
	return filesystemconnect.NewFilesystemClient(f.sb.client.http, f.sb.agentURL())
}

func (f *Files) filesURL(path string) string {
	q := url.Values{"path": {path}}
	if f.User != "" {
		q.Set("username", f.User)
	}
	return f.sb.agentURL() + "/files?" + q.Encode()
}

// Read returns a file's content. Files larger than MaxReadSize fail with
// an error wrapping ErrTooLarge.
func (f *Files) Read(ctx context.Context, path string) ([]byte, error) {
	limit := f.MaxReadSize
	if limit <= 0 {
		limit = DefaultMaxReadSize
	}
	var buf bytes.Buffer
	n, err := f.download(ctx, path, &buf, limit)
	if err != nil {
		return nil, err
	}
	if n > limit {
		return nil, fmt.Errorf("%w: %s is over %d bytes", ErrTooLarge, path, limit)
	}
	return buf.Bytes(), nil
}

// Download copies a file's content to w and returns the number of bytes
// written.
func (f *Files) Download(ctx context.Context, path string, w io.Writer) (int64, error) {
	return f.download(ctx, path, w, -1)
}

// download copies at most limit+1 bytes (all if limit < 0).
func (f *Files) download(ctx context.Context, path string, w io.Writer, limit int64) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", f.filesURL(path), nil)
	if err != nil {
		return 0, err
	}
	resp, err := f.sb.client.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, errorFromResponse(resp)
	}
	if limit >= 0 {
		if resp.ContentLength > limit {
			return resp.ContentLength, nil
		}
		return io.Copy(w, io.LimitReader(resp.Body, limit+1))
	}
	return io.Copy(w, resp.Body)
}

// Write creates or overwrites a file with data, creating parent
// directories.
func (f *Files) Write(ctx context.Context, path string, data []byte) error {
	return f.Upload(ctx, path, bytes.NewReader(data))
}

// Upload creates or overwrites a file with the content of r, streamed
// (at most 100 MiB per upload), creating parent directories.
func (f *Files) Upload(ctx context.Context, path string, r io.Reader) error {
	req, err := http.NewRequestWithContext(ctx, "POST", f.filesURL(path), r)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := f.sb.client.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return errorFromResponse(resp)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return nil
}

func (f *Files) rpcCtx(ctx context.Context) (context.Context, *callInfo) {
	ci := &callInfo{}
	return withCallInfo(ctx, ci), ci
}

// List lists the entries under the directory path, down to depth levels
// (depth < 1 means 1), depth first in lexical order.
func (f *Files) List(ctx context.Context, path string, depth int) ([]*EntryInfo, error) {
	if depth < 1 {
		depth = 1
	}
	req := connect.NewRequest(&filesystem.ListDirRequest{Path: path, Depth: uint32(depth)})
	setUser(req.Header(), f.User)
	cctx, ci := f.rpcCtx(ctx)
	resp, err := f.client().ListDir(cctx, req)
	if err != nil {
		return nil, fromConnect(err, ci)
	}
	out := make([]*EntryInfo, 0, len(resp.Msg.GetEntries()))
	for _, e := range resp.Msg.GetEntries() {
		out = append(out, entryFromProto(e))
	}
	return out, nil
}

// Stat describes path (a symlink is not followed; its Type is its
// target's). A missing path is a not_found error (see IsNotFound).
func (f *Files) Stat(ctx context.Context, path string) (*EntryInfo, error) {
	req := connect.NewRequest(&filesystem.StatRequest{Path: path})
	setUser(req.Header(), f.User)
	cctx, ci := f.rpcCtx(ctx)
	resp, err := f.client().Stat(cctx, req)
	if err != nil {
		return nil, fromConnect(err, ci)
	}
	return entryFromProto(resp.Msg.GetEntry()), nil
}

// Exists reports whether path exists.
func (f *Files) Exists(ctx context.Context, path string) (bool, error) {
	_, err := f.Stat(ctx, path)
	if IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// MakeDir creates the directory path and its parents. It returns false
// (and no error) if the directory already exists.
func (f *Files) MakeDir(ctx context.Context, path string) (bool, error) {
	req := connect.NewRequest(&filesystem.MakeDirRequest{Path: path})
	setUser(req.Header(), f.User)
	cctx, ci := f.rpcCtx(ctx)
	_, err := f.client().MakeDir(cctx, req)
	if err != nil {
		err = fromConnect(err, ci)
		if IsAlreadyExists(err) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// Rename moves from to to, creating to's parent directories, and returns
// the moved entry.
func (f *Files) Rename(ctx context.Context, from, to string) (*EntryInfo, error) {
	req := connect.NewRequest(&filesystem.MoveRequest{Source: from, Destination: to})
	setUser(req.Header(), f.User)
	cctx, ci := f.rpcCtx(ctx)
	resp, err := f.client().Move(cctx, req)
	if err != nil {
		return nil, fromConnect(err, ci)
	}
	return entryFromProto(resp.Msg.GetEntry()), nil
}

// Remove removes path recursively; a missing path is not an error.
func (f *Files) Remove(ctx context.Context, path string) error {
	req := connect.NewRequest(&filesystem.RemoveRequest{Path: path})
	setUser(req.Header(), f.User)
	cctx, ci := f.rpcCtx(ctx)
	_, err := f.client().Remove(cctx, req)
	return fromConnect(err, ci)
}
