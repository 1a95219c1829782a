package template

// OCI image import: the parts that do not touch the filesystem as root
// (sources, platform selection, the layers.json record). The extraction
// itself is in oci_linux.go.

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ImportName is the Manifest.Name of a build dir made by ImportImage.
const ImportName = "import"

// LayersFile is the name of the file in an imported build dir that records
// the image's digest, source, config and layers (see ImportResult).
const LayersFile = "layers.json"

// importFormatVersion is the revision of the import code, recorded in the
// manifest as RecipeVersion.
const importFormatVersion = 1

// ErrUnsafeLayer is returned (wrapped) when an image layer holds an entry
// that could write outside the root filesystem (an absolute path, a ".."
// component, a write through a symbolic link, a hardlink to a path outside
// the image) or an owner outside the container id range. Nothing of such an
// import is left on disk.
var ErrUnsafeLayer = errors.New("unsafe image layer")

// ImportSource names where an image comes from. Exactly one of Tarball,
// Layout and Ref must be set.
type ImportSource struct {
	// Tarball is the path of a `docker save` tarball (or of an OCI image
	// layout packed in a tar file, as written by `docker buildx
	// --output type=oci` or skopeo's oci-archive). It must not be
	// compressed and must hold a single image.
	Tarball string
	// Layout is the path of an OCI image layout directory.
	Layout string
	// Ref is a registry reference, name[:tag|@digest], pulled anonymously
	// with remote.Image.
	Ref string
	// Insecure allows a plain-HTTP registry for Ref (for example a test
	// registry on 127.0.0.1).
	Insecure bool
}

// describe returns a one-line description of the source, recorded in
// layers.json.
func (s ImportSource) describe() string {
	switch {
	case s.Tarball != "":
		return "tarball " + s.Tarball
	case s.Layout != "":
		return "layout " + s.Layout
	default:
		return "registry " + s.Ref
	}
}

// validate checks that exactly one source is set.
func (s ImportSource) validate() error {
	n := 0
	for _, v := range []string{s.Tarball, s.Layout, s.Ref} {
		if v != "" {
			n++
		}
	}
	if n != 1 {
		return errors.New("import source: set exactly one of tarball, layout directory and registry reference")
	}
	return nil
}

// ImportResult describes an imported build dir.
type ImportResult struct {
	// Dir is the absolute path of the build dir (manifest.json, rootfs/,
	// layers.json, build.log).
	Dir string `json:"dir"`
	// Digest is the image's manifest digest, "sha256:<hex>".
	Digest string `json:"digest"`
	// Layers describes the image's layers, bottom first.
	Layers []LayerInfo `json:"layers"`
	// Size is the number of bytes of regular files in the root filesystem
	// (a hardlinked file counted once).
	Size int64 `json:"size"`
	// Config is the runtime configuration from the image config.
	Config ImageConfig `json:"config"`
}

// LayerInfo describes one image layer.
type LayerInfo struct {
	// Digest is the layer's (compressed) blob digest, "sha256:<hex>".
	Digest string `json:"digest"`
	// Size is the compressed size of the layer in bytes.
	Size int64 `json:"size"`
	// Files is the number of regular files the layer adds or replaces.
	Files int `json:"files"`
	// Bytes is the sum of the sizes of those regular files.
	Bytes int64 `json:"bytes"`
}

// ImageConfig is the part of an image's config that says how to run it.
type ImageConfig struct {
	// Env is the default environment, "KEY=value" entries.
	Env []string `json:"env,omitempty"`
	// WorkingDir is the default working directory.
	WorkingDir string `json:"working_dir,omitempty"`
	// User is the default user, as "user", "uid", "user:group" or
	// "uid:gid".
	User string `json:"user,omitempty"`
	// Entrypoint is the image's entrypoint.
	Entrypoint []string `json:"entrypoint,omitempty"`
	// Cmd is the default command (the arguments of Entrypoint if it is
	// set).
	Cmd []string `json:"cmd,omitempty"`
}

// Inspection reports what a build dir holds.
type Inspection struct {
	// Size is the number of bytes of regular files in the root filesystem
	// (a hardlinked file counted once).
	Size int64 `json:"size"`
	// Files is the number of regular files (a hardlinked file counted
	// once).
	Files int `json:"files"`
	// Largest lists the largest regular files, largest first (ties by
	// path).
	Largest []PathSize `json:"largest"`
	// Layers describes the image layers of an imported build dir; it is
	// empty for other build dirs.
	Layers []LayerInfo `json:"layers,omitempty"`
}

// PathSize is a file of a root filesystem and its size.
type PathSize struct {
	// Path is the file's path relative to the root filesystem.
	Path string `json:"path"`
	// Bytes is the file's size.
	Bytes int64 `json:"bytes"`
}

// importRecord is the content of layers.json.
type importRecord struct {
	Digest string      `json:"digest"`
	Source string      `json:"source"`
	Size   int64       `json:"size"`
	Config ImageConfig `json:"config"`
	Layers []LayerInfo `json:"layers"`
}

// readImportRecord reads dir/layers.json.
func readImportRecord(dir string) (importRecord, error) {
	var r importRecord
	p := filepath.Join(dir, LayersFile)
	b, err := os.ReadFile(p)
	if err != nil {
		return r, fmt.Errorf("read import record: %w", err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("parse import record %s: %w", p, err)
	}
	if r.Digest == "" {
		return r, fmt.Errorf("import record %s has no digest", p)
	}
	return r, nil
}

// importDirName returns the build dir name of the image with manifest
// digest hex.
func importDirName(hex string) string {
	return "import-" + hex[:16]
}

// imageConfig extracts the runtime configuration from an image config.
func imageConfig(cf *v1.ConfigFile) ImageConfig {
	c := cf.Config
	return ImageConfig{
		Env:        c.Env,
		WorkingDir: c.WorkingDir,
		User:       c.User,
		Entrypoint: c.Entrypoint,
		Cmd:        c.Cmd,
	}
}

// hostPlatform is the platform picked from a multi-platform image.
func hostPlatform() v1.Platform {
	return v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
}

// openImage opens the image src names; ctx bounds a registry pull. cleanup,
// never nil, removes any scratch files; scratchDir is where an OCI archive
// is unpacked.
func openImage(ctx context.Context, src ImportSource, scratchDir string) (img v1.Image, cleanup func(), err error) {
	cleanup = func() {}
	if err := src.validate(); err != nil {
		return nil, cleanup, err
	}
	switch {
	case src.Tarball != "":
		return openTarball(src.Tarball, scratchDir)
	case src.Layout != "":
		idx, err := layout.ImageIndexFromPath(src.Layout)
		if err != nil {
			return nil, cleanup, fmt.Errorf("open OCI layout %s: %w", src.Layout, err)
		}
		img, err := pickImage(idx, 0)
		if err != nil {
			return nil, cleanup, fmt.Errorf("OCI layout %s: %w", src.Layout, err)
		}
		return img, cleanup, nil
	default:
		var opts []name.Option
		if src.Insecure {
			opts = append(opts, name.Insecure)
		}
		ref, err := name.ParseReference(src.Ref, opts...)
		if err != nil {
			return nil, cleanup, fmt.Errorf("image reference %q: %w", src.Ref, err)
		}
		img, err := remote.Image(ref, remote.WithContext(ctx), remote.WithPlatform(hostPlatform()))
		if err != nil {
			return nil, cleanup, fmt.Errorf("pull %s: %w", ref, err)
		}
		return img, cleanup, nil
	}
}

// openTarball opens a `docker save` tarball (it has a manifest.json) or an
// OCI image layout packed in a tar file (only index.json), which is
// unpacked into a directory under scratchDir.
func openTarball(path, scratchDir string) (v1.Image, func(), error) {
	nop := func() {}
	names, err := tarNames(path)
	if err != nil {
		return nil, nop, err
	}
	switch {
	case names["manifest.json"]:
		img, err := tarball.ImageFromPath(path, nil)
		if err != nil {
			return nil, nop, fmt.Errorf("read image tarball %s: %w", path, err)
		}
		return img, nop, nil
	case names["index.json"]:
		dir, err := os.MkdirTemp(scratchDir, ".tmp-oci-archive-")
		if err != nil {
			return nil, nop, fmt.Errorf("unpack OCI archive %s: %w", path, err)
		}
		cleanup := func() { os.RemoveAll(dir) }
		if err := unpackOCIArchive(path, dir); err != nil {
			cleanup()
			return nil, nop, err
		}
		idx, err := layout.ImageIndexFromPath(dir)
		if err != nil {
			cleanup()
			return nil, nop, fmt.Errorf("open OCI archive %s: %w", path, err)
		}
		img, err := pickImage(idx, 0)
		if err != nil {
			cleanup()
			return nil, nop, fmt.Errorf("OCI archive %s: %w", path, err)
		}
		return img, cleanup, nil
	default:
		return nil, nop, fmt.Errorf("%s is neither a docker save tarball (no manifest.json) nor an OCI image archive (no index.json)", path)
	}
}

// tarNames returns the names of the entries of the tar file at path,
// without a leading "./".
func tarNames(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open image tarball: %w", err)
	}
	defer f.Close()
	var magic [2]byte
	if n, _ := io.ReadFull(f, magic[:]); n == 2 && magic == [2]byte{0x1f, 0x8b} {
		return nil, fmt.Errorf("image tarball %s is gzip-compressed: decompress it first", path)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("read image tarball %s: %w", path, err)
	}
	names := map[string]bool{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read image tarball %s: %w", path, err)
		}
		names[strings.TrimPrefix(hdr.Name, "./")] = true
	}
	return names, nil
}

// ociBlobRE matches the blob paths of an OCI image layout.
var ociBlobRE = regexp.MustCompile(`^blobs/[a-z0-9]+/[a-f0-9]{32,128}$`)

// unpackOCIArchive unpacks the regular files of an OCI image layout packed
// in the tar file path into the empty directory dir. Only "oci-layout",
// "index.json" and "blobs/<alg>/<hex>" are unpacked, so no entry can land
// outside dir.
func unpackOCIArchive(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("unpack OCI archive: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("unpack OCI archive %s: %w", path, err)
		}
		n := strings.TrimPrefix(hdr.Name, "./")
		if hdr.Typeflag != tar.TypeReg || (n != "oci-layout" && n != "index.json" && !ociBlobRE.MatchString(n)) {
			continue
		}
		dst := filepath.Join(dir, filepath.FromSlash(n))
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return fmt.Errorf("unpack OCI archive: %w", err)
		}
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("unpack OCI archive %s: %w", path, err)
		}
		_, err = io.Copy(out, tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("unpack OCI archive %s: %s: %w", path, n, err)
		}
	}
}

// maxIndexDepth bounds the nesting of image indexes pickImage follows.
const maxIndexDepth = 4

// pickImage returns the image of idx to import: the one for the host
// platform (linux/GOARCH) of a multi-platform index, or the only image of
// an index without platforms (an OCI layout's index.json usually has one
// entry, which may itself be a multi-platform index). Attestation
// manifests are ignored.
func pickImage(idx v1.ImageIndex, depth int) (v1.Image, error) {
	if depth > maxIndexDepth {
		return nil, fmt.Errorf("image indexes nested more than %d deep", maxIndexDepth)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("read image index: %w", err)
	}
	want := hostPlatform()
	var plain, other []v1.Descriptor
	var chosen *v1.Descriptor
	for i, d := range im.Manifests {
		if !d.MediaType.IsImage() && !d.MediaType.IsIndex() {
			continue
		}
		if d.Annotations["vnd.docker.reference.type"] == "attestation-manifest" {
			continue
		}
		switch {
		case d.Platform == nil:
			plain = append(plain, d)
		case d.Platform.OS == "unknown":
			// BuildKit attestations and similar.
		case d.Platform.Satisfies(want):
			if chosen == nil {
				chosen = &im.Manifests[i]
			}
		default:
			other = append(other, d)
		}
	}
	if chosen == nil {
		switch len(plain) {
		case 1:
			chosen = &plain[0]
		case 0:
			var plats []string
			for _, d := range other {
				plats = append(plats, d.Platform.String())
			}
			if len(plats) == 0 {
				return nil, errors.New("no image in the index")
			}
			return nil, fmt.Errorf("no image for %s in the index (it has %s)", want.String(), strings.Join(plats, ", "))
		default:
			return nil, fmt.Errorf("the index holds %d images and none names a platform: cannot choose one", len(plain))
		}
	}
	if chosen.MediaType.IsIndex() {
		child, err := idx.ImageIndex(chosen.Digest)
		if err != nil {
			return nil, fmt.Errorf("open image index %s: %w", chosen.Digest, err)
		}
		return pickImage(child, depth+1)
	}
	img, err := idx.Image(chosen.Digest)
	if err != nil {
		return nil, fmt.Errorf("open image %s: %w", chosen.Digest, err)
	}
	return img, nil
}

// encodeJSON returns v as indented JSON with a final newline.
func encodeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
