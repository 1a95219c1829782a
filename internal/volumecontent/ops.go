package volumecontent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/http"
	"net/url"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corralhq/corral/internal/idgen"
)

// entryStat is the VolumeEntryStat schema of the volume content API.
type entryStat struct {
	Name   string    `json:"name"`
	Type   string    `json:"type"` // unknown, file, directory, symlink
	Path   string    `json:"path"`
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"` // permission bits incl. setuid/setgid/sticky
	UID    uint32    `json:"uid"`
	GID    uint32    `json:"gid"`
	Atime  time.Time `json:"atime"`
	Mtime  time.Time `json:"mtime"`
	Ctime  time.Time `json:"ctime"`
	Target string    `json:"target,omitempty"` // symlinks only, as written
}

// entry describes fi, found at volume path apiPath.
func (h *handler) entry(apiPath string, fi fs.FileInfo, target string) entryStat {
	e := entryStat{
		Name:   path.Base(apiPath),
		Type:   "unknown",
		Path:   apiPath,
		Size:   fi.Size(),
		Mode:   unixMode(fi.Mode()),
		UID:    OverflowID,
		GID:    OverflowID,
		Mtime:  fi.ModTime().UTC(),
		Target: target,
	}
	switch {
	case fi.Mode().IsRegular():
		e.Type = "file"
	case fi.IsDir():
		e.Type = "directory"
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = "symlink"
	}
	e.Atime, e.Ctime = e.Mtime, e.Mtime
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Mode = st.Mode & 0o7777
		e.UID = h.sandboxID(st.Uid)
		e.GID = h.sandboxID(st.Gid)
		e.Atime = time.Unix(int64(st.Atim.Sec), int64(st.Atim.Nsec)).UTC()
		e.Ctime = time.Unix(int64(st.Ctim.Sec), int64(st.Ctim.Nsec)).UTC()
	}
	return e
}

// lstatEntry describes the entry at rel itself, not following a final
// symbolic link.
func (h *handler) lstatEntry(root *os.Root, rel, apiPath string) (entryStat, fs.FileInfo, error) {
	fi, err := root.Lstat(rel)
	if err != nil {
		return entryStat{}, nil, fmt.Errorf("lstat: %w", err)
	}
	var target string
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, _ = root.Readlink(rel) // best effort: the link may be gone already
	}
	return h.entry(apiPath, fi, target), fi, nil
}

// sandboxID maps a host uid or gid to the sandbox id the API shows.
func (h *handler) sandboxID(host uint32) uint32 {
	id := int64(host) - int64(h.opts.HostBase)
	if id < 0 || id > MaxID {
		return OverflowID
	}
	return uint32(id)
}

// unixMode turns a Go file mode into unix permission bits.
func unixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}

// goMode turns unix permission bits into a Go file mode.
func goMode(u uint32) fs.FileMode {
	m := fs.FileMode(u & 0o777)
	if u&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if u&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if u&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// setOwnerMode gives the open file f sandbox owner uid:gid and mode. It
// works on the descriptor, so it acts on exactly the file opened.
func (h *handler) setOwnerMode(f *os.File, uid, gid int, mode uint32) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("fstat: %w", err)
	}
	hu, hg := h.opts.HostBase+uid, h.opts.HostBase+gid
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != hu || int(st.Gid) != hg {
		if err := f.Chown(hu, hg); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	// After chown, which clears setuid and setgid bits.
	if err := f.Chmod(goMode(mode)); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	return nil
}

// escapes reports whether err is os.Root refusing a path that leads
// outside the root (through "..", an absolute symlink, or a symlink
// pointing out). The os package does not export that error.
func escapes(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if e.Error() == "path escapes from parent" {
			return true
		}
	}
	return false
}

// fsError answers a failed file system operation on apiPath. Messages name
// the volume path only: the errors themselves carry host paths.
func fsError(w http.ResponseWriter, err error, apiPath string) {
	status, msg := classify(err, apiPath)
	writeError(w, status, msg)
}

// errNotRegular is an entry that should be a regular file and is not.
var errNotRegular = errors.New("not a regular file")

func classify(err error, apiPath string) (int, string) {
	if errors.Is(err, errNotRegular) {
		return http.StatusConflict, fmt.Sprintf("path %s is not a regular file", apiPath)
	}
	if escapes(err) {
		return http.StatusForbidden, fmt.Sprintf("path %s leads outside the volume", apiPath)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return http.StatusNotFound, fmt.Sprintf("path %s not found", apiPath)
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return http.StatusInternalServerError, fmt.Sprintf("file system error on path %s", apiPath)
	}
	switch errno {
	case syscall.EOPNOTSUPP:
		// chmod of a symbolic link (links are never followed for it).
		return http.StatusConflict, fmt.Sprintf("path %s is a symbolic link; its mode cannot be changed", apiPath)
	case syscall.ENOTDIR:
		return http.StatusNotFound, fmt.Sprintf("path %s not found: a parent is not a directory", apiPath)
	case syscall.EEXIST:
		return http.StatusConflict, fmt.Sprintf("path %s already exists", apiPath)
	case syscall.ENOTEMPTY:
		return http.StatusConflict, fmt.Sprintf("directory %s is not empty", apiPath)
	case syscall.EISDIR:
		return http.StatusConflict, fmt.Sprintf("path %s is a directory", apiPath)
	case syscall.ELOOP:
		return http.StatusBadRequest, fmt.Sprintf("path %s has too many levels of symbolic links", apiPath)
	case syscall.ENAMETOOLONG:
		return http.StatusBadRequest, fmt.Sprintf("path %s is too long", apiPath)
	case syscall.EINVAL:
		return http.StatusBadRequest, fmt.Sprintf("invalid operation on path %s", apiPath)
	case syscall.EACCES, syscall.EPERM, syscall.EROFS:
		return http.StatusForbidden, fmt.Sprintf("path %s: %v", apiPath, errno)
	case syscall.ENOSPC, syscall.EDQUOT:
		return http.StatusInsufficientStorage, "no space left on the volume"
	}
	return http.StatusInternalServerError, fmt.Sprintf("path %s: %v", apiPath, errno)
}

// openDir opens directory rel for reading. O_NONBLOCK and O_DIRECTORY keep
// a FIFO planted in place of the directory from blocking the open.
func openDir(root *os.Root, rel string) (*os.File, error) {
	f, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open directory: %w", err)
	}
	return f, nil
}

// readNames returns the sorted names in directory rel.
func readNames(root *os.Root, rel string) ([]string, error) {
	f, err := openDir(root, rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("read directory: %w", err)
	}
	sort.Strings(names)
	return names, nil
}

func joinRel(dir, name string) string {
	if dir == "." {
		return name
	}
	return dir + "/" + name
}

func joinAPI(dir, name string) string {
	if dir == "/" {
		return "/" + name
	}
	return dir + "/" + name
}

// listDir answers GET dir: the entries below the directory, depth levels
// deep, depth first in name order. Symbolic links are listed, not entered.
func (h *handler) listDir(w http.ResponseWriter, r *http.Request, req *request) {
	depth, err := queryUint(req.query, "depth", 1, math.MaxUint32)
	if err == nil && depth < 1 {
		err = errors.New("query parameter depth must be at least 1")
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	depth = min(depth, MaxDepth)

	fi, err := req.root.Stat(req.rel)
	if err != nil {
		fsError(w, err, req.apiPath)
		return
	}
	if !fi.IsDir() {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("path %s is not a directory", req.apiPath))
		return
	}
	names, err := readNames(req.root, req.rel)
	if err != nil {
		fsError(w, err, req.apiPath)
		return
	}

	// Stream: a deep listing of a big volume need not fit in memory.
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 32<<10)
	sep := byte('[')
	emit := func(e entryStat) error {
		b, err := json.Marshal(e)
		if err != nil {
			return fmt.Errorf("encode entry: %w", err)
		}
		if err := bw.WriteByte(sep); err != nil {
			return fmt.Errorf("write entry: %w", err)
		}
		sep = ','
		if _, err := bw.Write(b); err != nil {
			return fmt.Errorf("write entry: %w", err)
		}
		return nil
	}
	if err := h.walk(r.Context(), req.root, req.rel, req.apiPath, names, int(depth), emit); err != nil {
		return // the client is gone, or the status is sent already: nothing to add
	}
	if sep == '[' {
		_, _ = bw.WriteString("[")
	}
	_, _ = bw.WriteString("]\n")
	_ = bw.Flush()
}

// walk emits the entries names of directory rel (volume path apiDir), and
// below them up to depth levels. Entries that vanish or change while the
// walk runs are skipped: the sandbox may be writing meanwhile.
func (h *handler) walk(ctx context.Context, root *os.Root, rel, apiDir string, names []string, depth int, emit func(entryStat) error) error {
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("list: %w", err)
		}
		childRel, childAPI := joinRel(rel, name), joinAPI(apiDir, name)
		e, fi, err := h.lstatEntry(root, childRel, childAPI)
		if err != nil {
			continue
		}
		if err := emit(e); err != nil {
			return err
		}
		if depth <= 1 || !fi.IsDir() {
			continue
		}
		sub, err := readNames(root, childRel)
		if err != nil {
			continue
		}
		if err := h.walk(ctx, root, childRel, childAPI, sub, depth-1, emit); err != nil {
			return err
		}
	}
	return nil
}

// createParams reads the uid, gid, mode (defaultMode when absent) and
// force parameters of a create.
func createParams(q url.Values, defaultMode uint32) (uid, gid int, mode uint32, force bool, err error) {
	if uid, gid, mode, err = ids(q, defaultMode); err != nil {
		return 0, 0, 0, false, err
	}
	force, err = queryBool(q, "force")
	return uid, gid, mode, force, err
}

// makeDir answers POST dir. Without force the parent must exist and the
// directory must not; with force missing parents are created (owned like
// the directory, mode 0755) and an existing directory is not an error.
func (h *handler) makeDir(w http.ResponseWriter, req *request) {
	uid, gid, mode, force, err := createParams(req.query, DefaultDirMode)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}

	var parts []string
	if req.rel != "." {
		parts = strings.Split(req.rel, "/")
	}
	if len(parts) == 0 && !force {
		writeError(w, http.StatusConflict, "path / already exists")
		return
	}
	for i := range parts {
		cur := strings.Join(parts[:i+1], "/")
		curAPI, last := "/"+cur, i == len(parts)-1
		fi, err := req.root.Stat(cur) // follows links that stay inside
		switch {
		case err == nil && fi.IsDir():
			if last && !force {
				writeError(w, http.StatusConflict, fmt.Sprintf("path %s already exists", curAPI))
				return
			}
			continue
		case err == nil:
			writeError(w, http.StatusConflict, fmt.Sprintf("path %s already exists and is not a directory", curAPI))
			return
		case !errors.Is(err, fs.ErrNotExist):
			fsError(w, err, curAPI)
			return
		case !last && !force:
			writeError(w, http.StatusNotFound, fmt.Sprintf("parent directory %s does not exist", curAPI))
			return
		}
		m := uint32(DefaultDirMode)
		if last {
			m = mode
		}
		if err := h.mkdirOwned(req.root, cur, uid, gid, m); err != nil {
			fsError(w, err, curAPI)
			return
		}
	}
	e, _, err := h.lstatEntry(req.root, req.rel, req.apiPath)
	if err != nil {
		fsError(w, err, req.apiPath)
		return
	}
	writeJSON(w, http.StatusCreated, e)
}

// mkdirOwned creates directory rel (never through a final symlink:
// mkdirat does not follow one) and sets its owner and mode.
func (h *handler) mkdirOwned(root *os.Root, rel string, uid, gid int, mode uint32) error {
	if err := root.Mkdir(rel, 0o700); err != nil {
		return fmt.Errorf("mkdir: %w", err)
	}
	f, err := openDir(root, rel)
	if err != nil {
		return err
	}
	defer f.Close()
	return h.setOwnerMode(f, uid, gid, mode)
}

// getInfo answers GET path.
func (h *handler) getInfo(w http.ResponseWriter, req *request) {
	e, _, err := h.lstatEntry(req.root, req.rel, req.apiPath)
	if err != nil {
		fsError(w, err, req.apiPath)
		return
	}
	writeJSON(w, http.StatusOK, e)
}

// metadata is the body of PATCH path.
type metadata struct {
	UID  *int64 `json:"uid"`
	GID  *int64 `json:"gid"`
	Mode *int64 `json:"mode"`
}

// updateMetadata answers PATCH path: chown and chmod. A symbolic link is
// followed while it stays inside the volume; one leading outside is
// refused.
func (h *handler) updateMetadata(w http.ResponseWriter, r *http.Request, req *request) {
	var m metadata
	err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxMetadataBody)).Decode(&m)
	if err != nil && !errors.Is(err, io.EOF) {
		writeError(w, http.StatusBadRequest, "request body must be a JSON object with optional uid, gid and mode")
		return
	}
	for _, f := range []struct {
		name string
		v    *int64
		max  int64
	}{{"uid", m.UID, MaxID}, {"gid", m.GID, MaxID}, {"mode", m.Mode, 0o7777}} {
		if f.v != nil && (*f.v < 0 || *f.v > f.max) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("%s must be an integer between 0 and %d", f.name, f.max))
			return
		}
	}

	if _, err := req.root.Lstat(req.rel); err != nil {
		fsError(w, err, req.apiPath)
		return
	}
	if m.UID != nil || m.GID != nil {
		hu, hg := -1, -1 // unchanged
		if m.UID != nil {
			hu = h.opts.HostBase + int(*m.UID)
		}
		if m.GID != nil {
			hg = h.opts.HostBase + int(*m.GID)
		}
		if err := req.root.Chown(req.rel, hu, hg); err != nil {
			fsError(w, fmt.Errorf("chown: %w", err), req.apiPath)
			return
		}
	}
	if m.Mode != nil {
		if err := req.root.Chmod(req.rel, goMode(uint32(*m.Mode))); err != nil {
			fsError(w, fmt.Errorf("chmod: %w", err), req.apiPath)
			return
		}
	}
	h.getInfo(w, req)
}

// remove answers DELETE path: the entry itself goes, recursively for a
// directory; a symbolic link is removed, not what it points to.
func (h *handler) remove(w http.ResponseWriter, req *request) {
	if req.rel == "." {
		writeError(w, http.StatusBadRequest, "the volume root cannot be removed")
		return
	}
	if _, err := req.root.Lstat(req.rel); err != nil {
		fsError(w, err, req.apiPath)
		return
	}
	if err := req.root.RemoveAll(req.rel); err != nil {
		fsError(w, err, req.apiPath)
		return
	}
	if h.opts.OnDelete != nil {
		h.opts.OnDelete(req.volumeID, req.apiPath)
	}
	w.WriteHeader(http.StatusNoContent)
}

// readFile answers GET file with the file's bytes, streamed.
func (h *handler) readFile(w http.ResponseWriter, r *http.Request, req *request) {
	fi, err := req.root.Stat(req.rel)
	if err != nil {
		fsError(w, err, req.apiPath)
		return
	}
	if !fi.Mode().IsRegular() {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("path %s is not a regular file", req.apiPath))
		return
	}
	// O_NONBLOCK: should a FIFO be swapped in after the check, the open
	// does not hang; the descriptor is checked again below.
	f, err := req.root.OpenFile(req.rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		fsError(w, err, req.apiPath)
		return
	}
	defer f.Close()
	fi, err = f.Stat()
	if err != nil {
		fsError(w, err, req.apiPath)
		return
	}
	if !fi.Mode().IsRegular() {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("path %s is not a regular file", req.apiPath))
		return
	}
	size := fi.Size()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.Header().Set("Last-Modified", fi.ModTime().UTC().Format(http.TimeFormat))
	w.WriteHeader(http.StatusOK)
	// A file the sandbox shrinks meanwhile ends the response short, which
	// the client sees as a broken transfer rather than as wrong content.
	_, _ = io.CopyN(w, f, size)
}

// bodyReader remembers the error reading the request body, to tell it from
// errors writing the file.
type bodyReader struct {
	r   io.Reader
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

// writeFile answers PUT file. Without force the path must not exist; with
// force an existing file is replaced. The body is staged in a new file
// next to the target, then hard-linked into place (new file: the link
// fails if the name appeared meanwhile) or renamed over the old entry
// (force), so readers never see a partial file and a failed or oversized
// upload leaves the old content. Neither link nor rename follows a final
// symbolic link. An existing symbolic link is written through only with
// force and only when it leads to a regular file inside the volume; the
// target is then overwritten in place from the staged copy.
func (h *handler) writeFile(w http.ResponseWriter, r *http.Request, req *request) {
	uid, gid, mode, force, err := createParams(req.query, DefaultFileMode)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if req.rel == "." {
		writeError(w, http.StatusConflict, "path / is a directory")
		return
	}
	limit := h.opts.MaxFileBytes
	if r.ContentLength > limit {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("file is larger than %d bytes", limit))
		return
	}

	fi, err := req.root.Lstat(req.rel)
	exists := err == nil
	switch {
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		fsError(w, err, req.apiPath)
		return
	case exists && !force:
		writeError(w, http.StatusConflict, fmt.Sprintf("path %s already exists", req.apiPath))
		return
	case exists && fi.IsDir():
		writeError(w, http.StatusConflict, fmt.Sprintf("path %s is a directory", req.apiPath))
		return
	case exists && fi.Mode()&fs.ModeSymlink != 0:
		// Check where the link leads before reading the body.
		ti, err := req.root.Stat(req.rel)
		if err != nil {
			fsError(w, err, req.apiPath)
			return
		}
		if !ti.Mode().IsRegular() {
			writeError(w, http.StatusConflict, fmt.Sprintf("path %s is a symbolic link to something other than a regular file", req.apiPath))
			return
		}
	}

	body := &bodyReader{r: http.MaxBytesReader(w, r.Body, limit)}
	tmp, n, err := h.stage(req, body, uid, gid, mode)
	if err != nil {
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(body.err, &tooBig):
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("file is larger than %d bytes", limit))
		case body.err != nil:
			writeError(w, http.StatusBadRequest, "could not read the request body")
		default:
			fsError(w, err, req.apiPath)
		}
		return
	}
	defer tmp.discard()

	var st fs.FileInfo
	switch {
	case exists && fi.Mode()&fs.ModeSymlink != 0:
		st, err = h.overwriteThrough(req, tmp, uid, gid, mode)
	case force:
		err = req.root.Rename(tmp.rel, req.rel)
		st = tmp.info
	default:
		err = req.root.Link(tmp.rel, req.rel) // fails if the path was created meanwhile
		st = tmp.info
	}
	if err != nil {
		fsError(w, err, req.apiPath)
		return
	}
	if h.opts.OnWrite != nil {
		h.opts.OnWrite(req.volumeID, req.apiPath, n)
	}
	writeJSON(w, http.StatusCreated, h.entry(req.apiPath, st, ""))
}

// staged is an upload written to a temporary file in the target's
// directory.
type staged struct {
	root *os.Root
	rel  string
	info fs.FileInfo // of the descriptor, after owner and mode were set
	f    *os.File    // open for reading, for overwriteThrough
}

// discard closes the staged file and removes its name, if it still has
// one (a rename moved it).
func (s *staged) discard() {
	_ = s.f.Close()
	if fi, err := s.root.Lstat(s.rel); err == nil && os.SameFile(fi, s.info) {
		_ = s.root.Remove(s.rel)
	}
}

// stage copies body into a new file next to req.rel, owned and moded as
// asked.
func (h *handler) stage(req *request, body io.Reader, uid, gid int, mode uint32) (*staged, int64, error) {
	rel := joinRel(path.Dir(req.rel), ".corral-upload-"+idgen.Hex(8))
	f, err := req.root.OpenFile(rel, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("create: %w", err)
	}
	n, err := io.Copy(f, body)
	if err == nil {
		err = h.setOwnerMode(f, uid, gid, mode)
	}
	var fi fs.FileInfo
	if err == nil {
		fi, err = f.Stat()
	}
	if err != nil {
		_ = f.Close()
		_ = req.root.Remove(rel)
		return nil, 0, fmt.Errorf("write: %w", err)
	}
	return &staged{root: req.root, rel: rel, info: fi, f: f}, n, nil
}

// overwriteThrough copies the staged upload into the regular file a
// symbolic link at req.rel leads to. os.Root follows the link only while it
// stays inside the volume.
func (h *handler) overwriteThrough(req *request, tmp *staged, uid, gid int, mode uint32) (fs.FileInfo, error) {
	f, err := req.root.OpenFile(req.rel, os.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("fstat: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, errNotRegular
	}
	if err := f.Truncate(0); err != nil {
		return nil, fmt.Errorf("truncate: %w", err)
	}
	if _, err := tmp.f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("rewind: %w", err)
	}
	if _, err := io.Copy(f, tmp.f); err != nil {
		return nil, fmt.Errorf("write: %w", err)
	}
	if err := h.setOwnerMode(f, uid, gid, mode); err != nil {
		return nil, err
	}
	fi, err = f.Stat()
	if err != nil {
		return nil, fmt.Errorf("fstat: %w", err)
	}
	return fi, nil
}
