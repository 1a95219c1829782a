package template

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/corralhq/corral/internal/idrange"
)

// ImportImage imports an OCI or Docker image as a build dir in cacheDir,
// or returns the existing import of the same image.
//
// The image comes from exactly one of src.Tarball, src.Layout and src.Ref;
// from a multi-platform index the linux image for the host's architecture
// (linux/amd64 on amd64) is picked. The build dir is
// <cacheDir>/import-<first 16 hex digits of the image's manifest digest>
// and holds rootfs/ (the layers flattened in order, OCI whiteouts applied,
// ownership shifted by idBase, the base of the server's uid range),
// layers.json (digest, source,
// image config and per-layer sizes), build.log (the progress lines) and
// manifest.json (Name ImportName, Digest the hex manifest digest, IDBase),
// written last. If that dir already holds a complete import for idBase,
// ImportImage returns it
// without extracting anything. Otherwise it extracts into a temporary
// directory next to it, syncs the filesystem and renames that into place;
// on any failure, including a cancelled ctx or a refused layer, the
// temporary directory is removed, so a failed import leaves nothing behind.
// Concurrent imports of the same image are serialized by a lock file. An
// empty cacheDir means DefaultCacheDir(). Importing needs root (chown).
//
// Security: layers are untrusted. An entry with an absolute path or a ".."
// component, a hardlink whose target is not a path inside the image, an
// entry (or whiteout, or hardlink target) reached through a symbolic link
// that an earlier entry planted, and an owner outside 0..idrange.Count-1
// are refused with an error wrapping ErrUnsafeLayer: every path component
// is checked with lstat(2) and new files are created with O_EXCL|O_NOFOLLOW
// after removing whatever was there, so no entry can make the import read,
// write, chown or delete anything outside the root filesystem. Symbolic
// links themselves are kept as they are (they are resolved inside the
// sandbox). Device nodes are skipped (sandboxes get /dev from the runtime);
// setuid/setgid bits are kept; of the extended attributes only
// security.capability is kept (made namespaced by ShiftOwnership).
//
// Progress lines ("[import] ...") go to progress, which may be nil.
func ImportImage(ctx context.Context, cacheDir string, src ImportSource, idBase uint32, progress io.Writer) (ImportResult, error) {
	if err := src.validate(); err != nil {
		return ImportResult{}, fmt.Errorf("import image: %w", err)
	}
	if err := (idrange.Range{Base: idBase, Count: idrange.Count}).Validate(); err != nil {
		return ImportResult{}, fmt.Errorf("import image: %w", err)
	}
	if cacheDir == "" {
		cacheDir = DefaultCacheDir()
	}
	cacheDir, err := filepath.Abs(cacheDir)
	if err != nil {
		return ImportResult{}, fmt.Errorf("import image: cache dir: %w", err)
	}
	if err := PrivateDir(cacheDir); err != nil {
		return ImportResult{}, fmt.Errorf("import image: %w", err)
	}
	log := &importLog{w: progress}
	log.printf("opening %s", src.describe())
	img, cleanup, err := openImage(ctx, src, cacheDir)
	defer cleanup()
	if err != nil {
		return ImportResult{}, fmt.Errorf("import image: %w", err)
	}
	h, err := img.Digest()
	if err != nil {
		return ImportResult{}, fmt.Errorf("import image %s: digest: %w", src.describe(), err)
	}
	if len(h.Hex) < 16 {
		return ImportResult{}, fmt.Errorf("import image %s: unexpected digest %q", src.describe(), h)
	}
	name := importDirName(h.Hex)
	final := filepath.Join(cacheDir, name)

	if res, err := openImport(final, h, idBase); err == nil {
		log.printf("reusing %s (%s)", name, h)
		return res, nil
	}
	if os.Geteuid() != 0 {
		return ImportResult{}, fmt.Errorf("import image %s: importing needs root (chown)", src.describe())
	}
	unlock, err := lockFile(ctx, filepath.Join(cacheDir, "."+name+".lock"), func() {
		log.printf("waiting for another import of %s", name)
	})
	if err != nil {
		return ImportResult{}, fmt.Errorf("import image %s: %w", src.describe(), err)
	}
	defer unlock()

	// Another process may have finished the import while we waited.
	if _, err := os.Lstat(final); err == nil {
		res, err := openImport(final, h, idBase)
		if err != nil {
			return ImportResult{}, fmt.Errorf("import image: %s exists but is not a complete import (remove it to import again): %w", final, err)
		}
		log.printf("reusing %s (%s)", name, h)
		return res, nil
	}
	// Leftovers of imports of this image killed before they could clean
	// up. We hold the lock, so none of them is still running.
	stale, _ := filepath.Glob(filepath.Join(cacheDir, ".tmp-"+name+"-*"))
	for _, d := range stale {
		if err := removeTree(d); err != nil {
			return ImportResult{}, fmt.Errorf("import image %s: remove stale import: %w", src.describe(), err)
		}
	}
	tmp, err := os.MkdirTemp(cacheDir, ".tmp-"+name+"-")
	if err != nil {
		return ImportResult{}, fmt.Errorf("import image %s: %w", src.describe(), err)
	}
	res, err := importInto(ctx, img, h, src, idBase, tmp, final, log)
	if err != nil {
		if rerr := removeTree(tmp); rerr != nil {
			err = fmt.Errorf("%w (and removing the partial import failed: %v)", err, rerr)
		}
		log.file = nil
		log.printf("import failed: %v", err)
		return ImportResult{}, fmt.Errorf("import image %s: %w", src.describe(), err)
	}
	return res, nil
}

// openImport opens the imported build dir dir and checks it holds the image
// with manifest digest h, shifted to idBase.
func openImport(dir string, h v1.Hash, idBase uint32) (ImportResult, error) {
	m, err := ReadManifest(dir)
	if err != nil {
		return ImportResult{}, err
	}
	if m.Digest != h.Hex {
		return ImportResult{}, fmt.Errorf("template %s has digest %s, want %s", dir, m.Digest, h.Hex)
	}
	if m.idBase() != idBase {
		return ImportResult{}, fmt.Errorf("template %s is owned by uid range base %d, want %d", dir, m.idBase(), idBase)
	}
	rec, err := readImportRecord(dir)
	if err != nil {
		return ImportResult{}, err
	}
	if rec.Digest != h.String() {
		return ImportResult{}, fmt.Errorf("import record of %s has digest %s, want %s", dir, rec.Digest, h)
	}
	return ImportResult{Dir: dir, Digest: rec.Digest, Layers: rec.Layers, Size: rec.Size, Config: rec.Config}, nil
}

// importInto extracts img into tmp and renames tmp to final.
func importInto(ctx context.Context, img v1.Image, h v1.Hash, src ImportSource, idBase uint32, tmp, final string, log *importLog) (ImportResult, error) {
	start := time.Now()
	logf, err := os.OpenFile(filepath.Join(tmp, BuildLogFile), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return ImportResult{}, fmt.Errorf("create build log: %w", err)
	}
	defer logf.Close()
	log.file = logf
	log.printf("importing %s from %s", h, src.describe())

	cf, err := img.ConfigFile()
	if err != nil {
		return ImportResult{}, fmt.Errorf("read image config: %w", err)
	}
	if cf.OS != "" && cf.OS != "linux" {
		return ImportResult{}, fmt.Errorf("image is for %s, not linux", cf.OS)
	}
	if cf.Architecture != "" && cf.Architecture != runtime.GOARCH {
		log.printf("warning: image is for %s, this host is %s", cf.Architecture, runtime.GOARCH)
	}
	layers, err := img.Layers()
	if err != nil {
		return ImportResult{}, fmt.Errorf("read image layers: %w", err)
	}
	rootfs := filepath.Join(tmp, RootFSDir)
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return ImportResult{}, fmt.Errorf("create rootfs: %w", err)
	}
	if err := os.Chmod(rootfs, 0o755); err != nil {
		return ImportResult{}, fmt.Errorf("create rootfs: %w", err)
	}
	x := &extractor{root: rootfs, dirTimes: map[string][2]time.Time{}}
	infos := make([]LayerInfo, len(layers))
	for i, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return ImportResult{}, fmt.Errorf("layer %d/%d: digest: %w", i+1, len(layers), err)
		}
		size, err := l.Size()
		if err != nil {
			return ImportResult{}, fmt.Errorf("layer %d/%d (%s): size: %w", i+1, len(layers), d, err)
		}
		log.printf("layer %d/%d %s (%s compressed)", i+1, len(layers), d, formatBytes(size))
		st, err := x.applyLayer(ctx, l)
		if err != nil {
			return ImportResult{}, fmt.Errorf("layer %d/%d (%s): %w", i+1, len(layers), d, err)
		}
		infos[i] = LayerInfo{Digest: d.String(), Size: size, Files: st.files, Bytes: st.bytes}
	}
	if err := x.finish(); err != nil {
		return ImportResult{}, err
	}
	if x.devices > 0 {
		log.printf("skipped %d device nodes (sandboxes get /dev from the runtime)", x.devices)
	}
	if err := ctx.Err(); err != nil {
		return ImportResult{}, err
	}

	log.printf("shifting ownership by %d", idBase)
	if err := ShiftOwnership(rootfs, int(idBase)); err != nil {
		return ImportResult{}, err
	}
	size, files, _, err := scanTree(rootfs, 0)
	if err != nil {
		return ImportResult{}, err
	}
	du, err := diskUsage(rootfs)
	if err != nil {
		return ImportResult{}, err
	}
	rec := importRecord{Digest: h.String(), Source: src.describe(), Size: size, Config: imageConfig(cf), Layers: infos}
	b, err := encodeJSON(rec)
	if err != nil {
		return ImportResult{}, fmt.Errorf("encode import record: %w", err)
	}
	if err := writeFileSync(filepath.Join(tmp, LayersFile), b); err != nil {
		return ImportResult{}, err
	}
	m := Manifest{
		Name:          ImportName,
		Version:       "oci-" + h.Hex[:12],
		Digest:        h.Hex,
		Size:          du,
		Created:       time.Now().UTC(),
		Packages:      []string{},
		RecipeVersion: importFormatVersion,
		IDBase:        idBase,
	}
	m.BuildSeconds = m.Created.Sub(start).Seconds()
	log.printf("imported %d layers, %d files, %s in %.1fs", len(layers), files, formatBytes(size), m.BuildSeconds)
	log.file = nil
	if err := logf.Close(); err != nil {
		return ImportResult{}, fmt.Errorf("close build log: %w", err)
	}
	if err := syncFS(tmp); err != nil {
		return ImportResult{}, err
	}
	if err := installBuildDir(ctx, tmp, final, m); err != nil {
		return ImportResult{}, err
	}
	log.printf("done: %s", final)
	return openImport(final, h, idBase)
}

// Inspect reports the size of the build dir dir, its n largest regular
// files and, for a build dir made by ImportImage, its image layers.
func Inspect(dir string, n int) (Inspection, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return Inspection{}, fmt.Errorf("inspect %s: %w", dir, err)
	}
	if _, err := ReadManifest(abs); err != nil {
		return Inspection{}, fmt.Errorf("inspect %s: %w", dir, err)
	}
	var ins Inspection
	ins.Size, ins.Files, ins.Largest, err = scanTree(filepath.Join(abs, RootFSDir), n)
	if err != nil {
		return Inspection{}, fmt.Errorf("inspect %s: %w", dir, err)
	}
	if _, err := os.Lstat(filepath.Join(abs, LayersFile)); err == nil {
		rec, err := readImportRecord(abs)
		if err != nil {
			return Inspection{}, fmt.Errorf("inspect %s: %w", dir, err)
		}
		ins.Layers = rec.Layers
	}
	return ins, nil
}

// scanTree returns the bytes and count of the regular files under root
// (each hardlinked inode counted once) and the n largest of them.
func scanTree(root string, n int) (size int64, files int, largest []PathSize, err error) {
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	var all []PathSize
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return &fs.PathError{Op: "lstat", Path: p, Err: err}
		}
		if st.Nlink > 1 {
			k := inode{uint64(st.Dev), st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		size += st.Size
		files++
		if n > 0 {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			all = append(all, PathSize{Path: filepath.ToSlash(rel), Bytes: st.Size})
		}
		return nil
	})
	if err != nil {
		return 0, 0, nil, fmt.Errorf("scan %s: %w", root, err)
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].Bytes != all[j].Bytes {
			return all[i].Bytes > all[j].Bytes
		}
		return all[i].Path < all[j].Path
	})
	if len(all) > n {
		all = all[:n]
	}
	return size, files, all, nil
}

// Whiteout names (OCI image spec, "Representing Changes").
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// extractor flattens layers into root. Paths named "rel" are slash-separated
// and relative to root, "" being root itself.
type extractor struct {
	root string
	// written holds the paths the current layer created, and their
	// ancestors: whiteouts only hide what lower layers created.
	written map[string]bool
	// dirTimes holds the access and modification times of directories,
	// set once every layer is applied (adding entries changes them).
	dirTimes map[string][2]time.Time
	// devices counts skipped device nodes.
	devices int
}

// layerStats counts the regular files a layer adds.
type layerStats struct {
	files int
	bytes int64
}

// unsafef returns an error wrapping ErrUnsafeLayer.
func unsafef(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrUnsafeLayer}, args...)...)
}

// applyLayer applies the layer l on top of root.
func (x *extractor) applyLayer(ctx context.Context, l v1.Layer) (layerStats, error) {
	var st layerStats
	rc, err := l.Uncompressed()
	if err != nil {
		return st, fmt.Errorf("open layer: %w", err)
	}
	defer rc.Close()
	r := ctxReader{ctx: ctx, r: rc}
	tr := tar.NewReader(r)
	x.written = map[string]bool{}
	for {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		// With GODEBUG=tarinsecurepath=0 the reader flags non-local
		// names itself; entry checks every name anyway.
		if err != nil && !(errors.Is(err, tar.ErrInsecurePath) && hdr != nil) {
			return st, fmt.Errorf("read layer: %w", err)
		}
		if err := x.entry(hdr, tr, &st); err != nil {
			return st, fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	}
	// Read to the end so that the blob's digest is checked.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return st, fmt.Errorf("read layer: %w", err)
	}
	return st, nil
}

// cleanEntryName returns name as a clean path relative to the root, or an
// error wrapping ErrUnsafeLayer if it is absolute or has a ".." component.
func cleanEntryName(name string) (string, error) {
	if strings.HasPrefix(name, "/") {
		return "", unsafef("path %q is absolute", name)
	}
	if strings.IndexByte(name, 0) >= 0 {
		return "", unsafef("path %q contains a NUL byte", name)
	}
	var parts []string
	for _, p := range strings.Split(name, "/") {
		switch p {
		case "", ".":
			continue
		case "..":
			return "", unsafef("path %q has a \"..\" component", name)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "/"), nil
}

// parentRel returns the parent of rel ("" for a top-level entry).
func parentRel(rel string) string {
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		return rel[:i]
	}
	return ""
}

// joinRel joins a relative directory and a name.
func joinRel(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// abs returns the host path of rel.
func (x *extractor) abs(rel string) string {
	if rel == "" {
		return x.root
	}
	return filepath.Join(x.root, filepath.FromSlash(rel))
}

// markWritten records that the current layer created rel.
func (x *extractor) markWritten(rel string) {
	for p := rel; p != ""; p = parentRel(p) {
		x.written[p] = true
	}
}

// lookup returns the host path of rel and its lstat, after checking that
// every ancestor of rel is a real directory, not a symbolic link. A missing
// path gives an error satisfying errors.Is(err, fs.ErrNotExist).
func (x *extractor) lookup(rel string) (string, os.FileInfo, error) {
	if rel == "" {
		fi, err := os.Lstat(x.root)
		return x.root, fi, err
	}
	parts := strings.Split(rel, "/")
	cur := x.root
	for i, p := range parts {
		cur = filepath.Join(cur, p)
		fi, err := os.Lstat(cur)
		if err != nil {
			return "", nil, err
		}
		if i == len(parts)-1 {
			return cur, fi, nil
		}
		if err := checkDir(fi, strings.Join(parts[:i+1], "/")); err != nil {
			return "", nil, err
		}
	}
	panic("unreachable")
}

// checkDir fails unless fi, the lstat of rel, is a real directory.
func checkDir(fi os.FileInfo, rel string) error {
	if fi.Mode()&os.ModeSymlink != 0 {
		return unsafef("%q is a symbolic link: refusing to follow it", rel)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%q is not a directory", rel)
	}
	return nil
}

// makeParents creates the missing ancestors of rel (mode 0755, owned by
// root) after checking that the existing ones are real directories.
func (x *extractor) makeParents(rel string) error {
	parts := strings.Split(rel, "/")
	cur := x.root
	for i := range len(parts) - 1 {
		cur = filepath.Join(cur, parts[i])
		fi, err := os.Lstat(cur)
		if errors.Is(err, fs.ErrNotExist) {
			if err := unix.Mkdir(cur, 0o755); err != nil {
				return &fs.PathError{Op: "mkdir", Path: cur, Err: err}
			}
			if err := unix.Fchmodat(unix.AT_FDCWD, cur, 0o755, 0); err != nil {
				return &fs.PathError{Op: "chmod", Path: cur, Err: err}
			}
			continue
		}
		if err != nil {
			return err
		}
		if err := checkDir(fi, strings.Join(parts[:i+1], "/")); err != nil {
			return err
		}
	}
	return nil
}

// removeExisting removes whatever is at path (a directory with its contents).
// Neither removal follows a symbolic link.
func removeExisting(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return os.RemoveAll(path)
	}
	return os.Remove(path)
}

// entry applies one tar entry.
func (x *extractor) entry(hdr *tar.Header, r io.Reader, st *layerStats) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	rel, err := cleanEntryName(hdr.Name)
	if err != nil {
		return err
	}
	if base := path.Base(rel); rel != "" && strings.HasPrefix(base, whiteoutPrefix) {
		return x.whiteout(parentRel(rel), base)
	}
	if hdr.Typeflag == tar.TypeChar || hdr.Typeflag == tar.TypeBlock {
		x.devices++
		return nil
	}
	if hdr.Uid < 0 || hdr.Uid >= idrange.Count || hdr.Gid < 0 || hdr.Gid >= idrange.Count {
		return unsafef("owner %d:%d is outside the container id range 0-%d", hdr.Uid, hdr.Gid, idrange.Count-1)
	}
	if rel == "" {
		if hdr.Typeflag != tar.TypeDir {
			return unsafef("the image root must be a directory")
		}
		return x.setDirMeta(x.root, rel, hdr)
	}
	if err := x.makeParents(rel); err != nil {
		return err
	}
	target := x.abs(rel)
	switch hdr.Typeflag {
	case tar.TypeDir:
		err = x.dir(target, rel, hdr)
	case tar.TypeReg, tar.TypeCont, tar.TypeGNUSparse:
		err = x.file(target, hdr, r)
		st.files++
		st.bytes += hdr.Size
	case tar.TypeSymlink:
		err = x.symlink(target, hdr)
	case tar.TypeLink:
		err = x.hardlink(target, rel, hdr)
	case tar.TypeFifo:
		err = x.fifo(target, hdr)
	default:
		return fmt.Errorf("unsupported tar entry type %q", hdr.Typeflag)
	}
	if err != nil {
		return err
	}
	x.markWritten(rel)
	return nil
}

// whiteout applies the whiteout file base found in directory dir.
func (x *extractor) whiteout(dir, base string) error {
	if base != whiteoutOpaque && strings.HasPrefix(base, whiteoutMeta) {
		return nil // other AUFS metadata (.wh..wh.plnk and such)
	}
	name := strings.TrimPrefix(base, whiteoutPrefix)
	if base != whiteoutOpaque && (name == "" || name == "." || name == "..") {
		return unsafef("whiteout %q names no entry of its directory", base)
	}
	dirPath, fi, err := x.lookup(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return unsafef("whiteout in %q, a symbolic link: refusing to follow it", dir)
	}
	if !fi.IsDir() {
		return nil
	}
	if base == whiteoutOpaque {
		return x.prune(dirPath, dir)
	}
	rel := joinRel(dir, name)
	if x.written[rel] {
		return nil // a whiteout hides lower layers only
	}
	return removeExisting(filepath.Join(dirPath, name))
}

// prune removes what lower layers put in directory rel (host path dirPath),
// keeping what the current layer created: dirPath is an opaque directory.
func (x *extractor) prune(dirPath, rel string) error {
	ents, err := os.ReadDir(dirPath)
	if err != nil {
		return err
	}
	for _, e := range ents {
		crel := joinRel(rel, e.Name())
		cpath := filepath.Join(dirPath, e.Name())
		if !x.written[crel] {
			if err := os.RemoveAll(cpath); err != nil {
				return err
			}
			continue
		}
		if e.IsDir() {
			if err := x.prune(cpath, crel); err != nil {
				return err
			}
		}
	}
	return nil
}

// dir creates (or keeps, merging the layers) directory target.
func (x *extractor) dir(target, rel string, hdr *tar.Header) error {
	fi, err := os.Lstat(target)
	switch {
	case err == nil && fi.IsDir():
	case err == nil:
		if err := os.Remove(target); err != nil {
			return err
		}
		fallthrough
	case errors.Is(err, fs.ErrNotExist):
		if err := unix.Mkdir(target, 0o700); err != nil {
			return &fs.PathError{Op: "mkdir", Path: target, Err: err}
		}
	default:
		return err
	}
	return x.setDirMeta(target, rel, hdr)
}

// setDirMeta sets the owner and mode of directory target, without following
// a symbolic link, and records its times for finish.
func (x *extractor) setDirMeta(target, rel string, hdr *tar.Header) error {
	fd, err := unix.Open(target, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: target, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return &fs.PathError{Op: "chown", Path: target, Err: err}
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode)&0o7777); err != nil {
		return &fs.PathError{Op: "chmod", Path: target, Err: err}
	}
	x.dirTimes[rel] = entryTimes(hdr)
	return nil
}

// file creates regular file target with the entry's content.
func (x *extractor) file(target string, hdr *tar.Header, r io.Reader) error {
	if err := removeExisting(target); err != nil {
		return err
	}
	f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(f, r)
	if err != nil {
		return fmt.Errorf("write %s: %w", target, err)
	}
	if n != hdr.Size {
		return fmt.Errorf("write %s: got %d bytes, want %d", target, n, hdr.Size)
	}
	fd := int(f.Fd())
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return &fs.PathError{Op: "chown", Path: target, Err: err}
	}
	// After chown, which clears the setuid and setgid bits.
	if err := unix.Fchmod(fd, uint32(hdr.Mode)&0o7777); err != nil {
		return &fs.PathError{Op: "chmod", Path: target, Err: err}
	}
	if v, ok := hdr.PAXRecords["SCHILY.xattr."+capXattrName]; ok {
		if err := unix.Fsetxattr(fd, capXattrName, []byte(v), 0); err != nil {
			return &fs.PathError{Op: "setxattr " + capXattrName, Path: target, Err: err}
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	return setTimes(target, entryTimes(hdr))
}

// symlink creates symbolic link target. Its target is kept as is: it is
// never followed here, and is resolved inside the sandbox.
func (x *extractor) symlink(target string, hdr *tar.Header) error {
	if hdr.Linkname == "" {
		return errors.New("symbolic link with an empty target")
	}
	if err := removeExisting(target); err != nil {
		return err
	}
	if err := os.Symlink(hdr.Linkname, target); err != nil {
		return err
	}
	if err := os.Lchown(target, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	return setTimes(target, entryTimes(hdr))
}

// hardlink creates target as a hardlink to the entry's link target, which
// must be an existing non-directory inside the root reached without
// following a symbolic link.
func (x *extractor) hardlink(target, rel string, hdr *tar.Header) error {
	lrel, err := cleanEntryName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hardlink target: %w", err)
	}
	if lrel == "" || lrel == rel {
		return unsafef("hardlink to %q", hdr.Linkname)
	}
	src, fi, err := x.lookup(lrel)
	if err != nil {
		return fmt.Errorf("hardlink target %q: %w", hdr.Linkname, err)
	}
	if fi.IsDir() {
		return unsafef("hardlink target %q is a directory", hdr.Linkname)
	}
	if err := removeExisting(target); err != nil {
		return err
	}
	// link(2) does not follow a symbolic link src: it links the link.
	return os.Link(src, target)
}

// fifo creates named pipe target.
func (x *extractor) fifo(target string, hdr *tar.Header) error {
	if err := removeExisting(target); err != nil {
		return err
	}
	if err := unix.Mkfifo(target, 0o600); err != nil {
		return &fs.PathError{Op: "mkfifo", Path: target, Err: err}
	}
	if err := os.Lchown(target, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	if err := unix.Fchmodat(unix.AT_FDCWD, target, uint32(hdr.Mode)&0o7777, 0); err != nil {
		return &fs.PathError{Op: "chmod", Path: target, Err: err}
	}
	return setTimes(target, entryTimes(hdr))
}

// finish sets the times of the directories, once nothing adds entries to
// them any more. A directory a later layer removed or replaced is skipped.
func (x *extractor) finish() error {
	for rel, ts := range x.dirTimes {
		p, fi, err := x.lookup(rel)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrUnsafeLayer) {
				continue
			}
			return err
		}
		if !fi.IsDir() {
			continue
		}
		if err := setTimes(p, ts); err != nil {
			return err
		}
	}
	return nil
}

// entryTimes returns the access and modification times of an entry.
func entryTimes(hdr *tar.Header) [2]time.Time {
	at := hdr.AccessTime
	if at.IsZero() {
		at = hdr.ModTime
	}
	return [2]time.Time{at, hdr.ModTime}
}

// setTimes sets the times of path without following a symbolic link.
func setTimes(path string, ts [2]time.Time) error {
	uts := []unix.Timespec{unix.NsecToTimespec(ts[0].UnixNano()), unix.NsecToTimespec(ts[1].UnixNano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, uts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "utimes", Path: path, Err: err}
	}
	return nil
}

// ctxReader is a reader that fails once its context is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// importLog writes "[import]" progress lines to a writer (if any) and to
// the build log (if open).
type importLog struct {
	w    io.Writer
	file io.Writer
}

func (l *importLog) printf(format string, args ...any) {
	line := fmt.Sprintf("[import] "+format+"\n", args...)
	if l.w != nil {
		_, _ = io.WriteString(l.w, line)
	}
	if l.file != nil {
		_, _ = io.WriteString(l.file, line)
	}
}

// formatBytes formats n bytes for humans.
func formatBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	default:
		return fmt.Sprintf("%d B", n)
	}
}

// writeFileSync writes b to path (mode 0644) and fsyncs it.
func writeFileSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
