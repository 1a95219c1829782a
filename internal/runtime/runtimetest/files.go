package runtimetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/corralhq/corral/internal/runtime"
)

// LayerMarker is the file at the root of every layer the fake driver's
// Snapshot writes: JSON naming the sandbox and the paths it removed
// (the fake's whiteouts). It is not part of the sandbox's files.
const LayerMarker = ".corral-fake-layer"

// Bounds on what a fake sandbox loads from its rootfs and layers, so that
// a test pointing the fake at a real root filesystem fails clearly
// instead of reading gigabytes into memory.
const (
	maxLoadEntries = 4096
	maxLoadBytes   = 64 << 20
)

// layerMarker is LayerMarker's content.
type layerMarker struct {
	Sandbox string   `json:"sandbox"`
	Removed []string `json:"removed,omitempty"`
}

// entry is one file or directory of a fake sandbox.
type entry struct {
	dir   bool
	data  []byte
	mode  fs.FileMode
	owner string
	mtime time.Time
}

// memFS is a fake sandbox's filesystem: what it started with (rootfs and
// layers) plus what changed since, which Snapshot writes out.
type memFS struct {
	mu sync.Mutex
	// all is the current view by clean absolute path; guarded by mu.
	all map[string]*entry
	// changed are paths created or written since start, removed paths
	// that existed at start; guarded by mu.
	changed, removed map[string]bool
}

func newMemFS() *memFS {
	f := &memFS{all: map[string]*entry{}, changed: map[string]bool{}, removed: map[string]bool{}}
	now := time.Now()
	for _, d := range []string{"/", "/home", "/home/user", "/root", "/tmp"} {
		owner := "root"
		if d == "/home/user" {
			owner = "user"
		}
		f.all[d] = &entry{dir: true, mode: fs.ModeDir | 0o755, owner: owner, mtime: now}
	}
	f.all["/tmp"].mode = fs.ModeDir | fs.ModeSticky | 0o777
	return f
}

// resolve turns a request path into a clean absolute one, as the real
// agent does: "" and "~" are the user's home, "~/x" and relative paths
// are under it.
func resolve(p, user string) string {
	home := homeOf(user)
	switch {
	case p == "" || p == "~":
		return home
	case strings.HasPrefix(p, "~/"):
		return path.Join(home, p[2:])
	case path.IsAbs(p):
		return path.Clean(p)
	default:
		return path.Join(home, p)
	}
}

func (f *memFS) read(p string) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.all[path.Clean(p)]
	if !ok || e.dir {
		return nil, false
	}
	return append([]byte(nil), e.data...), true
}

func (f *memFS) stat(p string) (entry, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.all[path.Clean(p)]
	if !ok {
		return entry{}, false
	}
	return *e, true
}

// errIsDir and errNotDir are the fake's write refusals.
var (
	errIsDir  = errors.New("is a directory")
	errNotDir = errors.New("not a directory")
)

// write creates or replaces the file p (and its missing parents, owned
// by owner).
func (f *memFS) write(p string, data []byte, owner string) error {
	p = path.Clean(p)
	f.mu.Lock()
	defer f.mu.Unlock()
	if e, ok := f.all[p]; ok && e.dir {
		return errIsDir
	}
	if err := f.mkdirAllLocked(path.Dir(p), owner); err != nil {
		return err
	}
	f.all[p] = &entry{data: append([]byte(nil), data...), mode: 0o644, owner: owner, mtime: time.Now()}
	f.changed[p] = true
	delete(f.removed, p)
	return nil
}

// mkdirAllLocked creates the directory p and its parents; f.mu must be held.
func (f *memFS) mkdirAllLocked(p, owner string) error {
	var missing []string
	for q := p; ; q = path.Dir(q) {
		if e, ok := f.all[q]; ok {
			if !e.dir {
				return errNotDir
			}
			break
		}
		missing = append(missing, q)
		if q == "/" {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		f.all[missing[i]] = &entry{dir: true, mode: fs.ModeDir | 0o755, owner: owner, mtime: time.Now()}
		f.changed[missing[i]] = true
		delete(f.removed, missing[i])
	}
	return nil
}

func (f *memFS) mkdirAll(p, owner string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mkdirAllLocked(path.Clean(p), owner)
}

// remove removes p and everything under it; false if p does not exist.
func (f *memFS) remove(p string) bool {
	p = path.Clean(p)
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.all[p]; !ok || p == "/" {
		return false
	}
	for q := range f.all {
		if q == p || strings.HasPrefix(q, p+"/") {
			delete(f.all, q)
			if !f.changed[q] {
				f.removed[q] = true
			}
			delete(f.changed, q)
		}
	}
	return true
}

// move renames src (and what is under it) to dst.
func (f *memFS) move(src, dst string, owner string) error {
	src, dst = path.Clean(src), path.Clean(dst)
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.all[src]; !ok {
		return fs.ErrNotExist
	}
	if dst == src || strings.HasPrefix(dst, src+"/") {
		return errors.New("cannot move a directory into itself")
	}
	if err := f.mkdirAllLocked(path.Dir(dst), owner); err != nil {
		return err
	}
	moved := map[string]*entry{}
	for q, e := range f.all {
		if q == src || strings.HasPrefix(q, src+"/") {
			moved[dst+strings.TrimPrefix(q, src)] = e
			delete(f.all, q)
			if !f.changed[q] {
				f.removed[q] = true
			}
			delete(f.changed, q)
		}
	}
	for q, e := range moved {
		f.all[q] = e
		f.changed[q] = true
		delete(f.removed, q)
	}
	return nil
}

// list returns the entries under dir down to depth levels (1: children).
func (f *memFS) list(dir string, depth int) ([]string, bool) {
	dir = path.Clean(dir)
	f.mu.Lock()
	defer f.mu.Unlock()
	if e, ok := f.all[dir]; !ok || !e.dir {
		return nil, false
	}
	var out []string
	for q := range f.all {
		rel, ok := strings.CutPrefix(q, strings.TrimSuffix(dir, "/")+"/")
		if !ok || q == dir || rel == "" {
			continue
		}
		if strings.Count(rel, "/") < depth {
			out = append(out, q)
		}
	}
	sort.Strings(out)
	return out, true
}

// writeLayer writes the changed files and directories to the new
// directory dst with a LayerMarker, and returns the bytes of file data.
func (f *memFS) writeLayer(id, dst string) (int64, error) {
	if _, err := os.Lstat(dst); err == nil {
		return 0, fmt.Errorf("snapshot destination %s exists", dst)
	}
	f.mu.Lock()
	changed := map[string]entry{}
	for p := range f.changed {
		changed[p] = *f.all[p]
	}
	marker := layerMarker{Sandbox: id}
	for p := range f.removed {
		marker.Removed = append(marker.Removed, p)
	}
	f.mu.Unlock()
	sort.Strings(marker.Removed)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return 0, err
	}
	tmp := dst + ".partial"
	_ = os.RemoveAll(tmp)
	size, err := writeTree(tmp, changed, marker)
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		_ = os.RemoveAll(tmp)
		return 0, fmt.Errorf("fake snapshot of %s: %w", id, err)
	}
	return size, nil
}

// writeTree writes entries (by absolute sandbox path) under dir through
// an os.Root, so that no sandbox path can name a host file outside dir.
func writeTree(dir string, entries map[string]entry, marker layerMarker) (int64, error) {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return 0, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	paths := make([]string, 0, len(entries))
	for p := range entries {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var size int64
	for _, p := range paths {
		rel := strings.TrimPrefix(p, "/")
		if rel == "" || rel == LayerMarker {
			continue
		}
		e := entries[p]
		if e.dir {
			if err := root.MkdirAll(rel, 0o755); err != nil {
				return 0, err
			}
			continue
		}
		if err := root.MkdirAll(path.Dir(rel), 0o755); err != nil {
			return 0, err
		}
		if err := root.WriteFile(rel, e.data, 0o644); err != nil {
			return 0, err
		}
		size += int64(len(e.data))
	}
	data, err := json.Marshal(marker)
	if err != nil {
		return 0, err
	}
	return size, root.WriteFile(LayerMarker, data, 0o600)
}

// loadLayers builds a new sandbox's files from its rootfs and layers
// (bottom first), applying each layer's removals, within the load bounds.
// Links and special files are skipped.
func loadLayers(cfg runtime.Config) (*memFS, error) {
	f := newMemFS()
	dirs := []string{cfg.RootFS}
	for i := len(cfg.Layers) - 1; i >= 0; i-- {
		dirs = append(dirs, cfg.Layers[i])
	}
	n, total := 0, int64(0)
	for i, dir := range dirs {
		if dir == "" {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(dir, LayerMarker)); err == nil {
			var m layerMarker
			if err := json.Unmarshal(b, &m); err != nil {
				return nil, fmt.Errorf("layer marker of %s: %w", dir, err)
			}
			for _, p := range m.Removed {
				f.remove(p)
			}
		}
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			if rel == "." || rel == LayerMarker {
				return nil
			}
			if n++; n > maxLoadEntries {
				return fmt.Errorf("more than %d entries in the rootfs and layers", maxLoadEntries)
			}
			sp := "/" + filepath.ToSlash(rel)
			switch {
			case d.IsDir():
				return f.mkdirAll(sp, "root")
			case d.Type().IsRegular():
				data, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				if total += int64(len(data)); total > maxLoadBytes {
					return fmt.Errorf("more than %d bytes in the rootfs and layers", maxLoadBytes)
				}
				return f.write(sp, data, "root")
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", dir, err)
		}
		if i == 0 {
			// The rootfs is the lower layer: nothing of it has changed.
			f.mu.Lock()
			clear(f.changed)
			f.mu.Unlock()
		}
	}
	// Layers are what earlier sandboxes wrote: the new sandbox starts with
	// them and has changed nothing yet.
	f.mu.Lock()
	clear(f.changed)
	clear(f.removed)
	f.mu.Unlock()
	return f, nil
}
