// Package template builds and stores sandbox templates.
//
// A template is a read-only root filesystem directory that sandboxes mount as
// the lower layer of an overlay; each sandbox adds its own writable upper
// layer on a size-capped tmpfs. Templates are built once, cached by the
// digest of their build recipe, and registered by name in a Store.
//
// Sandboxes run in a user namespace that maps container uid/gid 0-65535 to
// the host ids of the server's uid range (see package idrange), so every
// file of a template is stored with its ownership shifted by the range's
// base (see ShiftOwnership): root inside a sandbox owns the template's
// files, and is nobody outside it. A build is made for one base: the base
// is part of the recipe digest (so builds for two ranges coexist in one
// cache) and is recorded in the manifest.
//
// On-disk layout of one built template (a "build dir"):
//
//	<cacheDir>/base-<first 16 hex digits of the recipe digest>/
//		manifest.json   the Manifest, written last before the atomic rename
//		build.log       the full debootstrap and setup log
//		rootfs/         the root filesystem, ownership shifted
package template

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/corralhq/corral/internal/idrange"
)

// Names of the files and directories inside a build dir.
const (
	// ManifestFile is the name of the manifest inside a build dir.
	ManifestFile = "manifest.json"
	// BuildLogFile is the name of the build log inside a build dir.
	BuildLogFile = "build.log"
	// RootFSDir is the name of the root filesystem directory inside a build dir.
	RootFSDir = "rootfs"
)

// The template build cache's location.
const (
	// CacheEnv names the environment variable that overrides
	// DefaultCache.
	CacheEnv = "CORRAL_TEMPLATE_CACHE"
	// DefaultCache is where built templates are cached.
	DefaultCache = "/var/cache/corral/templates"
)

// DefaultCacheDir returns the directory where built templates are cached:
// $CORRAL_TEMPLATE_CACHE if set, else [DefaultCache].
func DefaultCacheDir() string {
	if d := os.Getenv(CacheEnv); d != "" {
		return d
	}
	return DefaultCache
}

// ErrNotFound is returned (wrapped) when a template name is not registered.
var ErrNotFound = errors.New("template not found")

// ErrInvalidName is returned (wrapped) when a template name does not match
// ^[a-z0-9][a-z0-9._-]{0,62}$.
var ErrInvalidName = errors.New("invalid template name")

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidateName reports whether name is a valid template name. The error
// wraps ErrInvalidName. Valid names cannot contain a path separator and
// cannot be "." or "..", so they are safe to use as a file name.
func ValidateName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%w %q: want lowercase letters, digits, '.', '_' or '-', starting with a letter or digit, at most 63 characters", ErrInvalidName, name)
	}
	return nil
}

// Template describes a built, read-only template ready to be mounted.
type Template struct {
	// Name is the name the template is registered under (or the manifest
	// name for a template that is not registered).
	Name string `json:"name"`
	// Version is a human-readable version: suite, recipe revision and a
	// short digest.
	Version string `json:"version"`
	// Digest is the hex sha256 of the build recipe.
	Digest string `json:"digest"`
	// RootFS is the absolute path of the root filesystem directory.
	RootFS string `json:"rootfs"`
	// Dir is the absolute path of the build dir holding RootFS, the
	// manifest and the build log.
	Dir string `json:"dir"`
	// Size is the disk usage of RootFS in bytes.
	Size int64 `json:"size"`
	// Created is when the build finished.
	Created time.Time `json:"created"`
	// IDBase is the host uid/gid the files' container id 0 is shifted to.
	IDBase uint32 `json:"id_base"`
}

// Manifest is the JSON document stored as manifest.json in a build dir.
type Manifest struct {
	// Name is the template's build name, for example "base".
	Name string `json:"name"`
	// Version is a human-readable version (see Template.Version).
	Version string `json:"version"`
	// Digest is the hex sha256 of the build recipe.
	Digest string `json:"digest"`
	// Size is the disk usage of the root filesystem in bytes.
	Size int64 `json:"size"`
	// Created is when the build finished.
	Created time.Time `json:"created"`
	// Packages is the list of packages asked for (dependencies not listed).
	Packages []string `json:"packages"`
	// Suite is the Debian suite, for example "bookworm".
	Suite string `json:"suite,omitempty"`
	// Mirror is the Debian mirror the packages came from.
	Mirror string `json:"mirror,omitempty"`
	// RecipeVersion is the revision of the build recipe code.
	RecipeVersion int `json:"recipe_version,omitempty"`
	// BuildSeconds is how long the build took.
	BuildSeconds float64 `json:"build_seconds,omitempty"`
	// IDBase is the host uid/gid the files' container id 0 was shifted to
	// (0 in builds made before it was recorded: idrange.LegacyBase).
	IDBase uint32 `json:"id_base,omitempty"`
}

// idBase is the base the build's files are shifted to.
func (m Manifest) idBase() uint32 {
	if m.IDBase == 0 {
		return idrange.LegacyBase
	}
	return m.IDBase
}

// ReadManifest reads and checks the manifest of the build dir dir. It fails
// unless the manifest is complete (name, version, digest and created time
// set) and dir holds a rootfs directory.
func ReadManifest(dir string) (Manifest, error) {
	var m Manifest
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return m, fmt.Errorf("read template manifest: %w", err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("parse template manifest %s: %w", filepath.Join(dir, ManifestFile), err)
	}
	if m.Name == "" || m.Version == "" || m.Digest == "" || m.Created.IsZero() {
		return m, fmt.Errorf("template manifest %s is incomplete", filepath.Join(dir, ManifestFile))
	}
	fi, err := os.Stat(filepath.Join(dir, RootFSDir))
	if err != nil {
		return m, fmt.Errorf("template rootfs: %w", err)
	}
	if !fi.IsDir() {
		return m, fmt.Errorf("template rootfs %s is not a directory", filepath.Join(dir, RootFSDir))
	}
	return m, nil
}

// writeManifest writes m as dir/manifest.json, durably.
func writeManifest(dir string, m Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("encode manifest: %w", err)
	}
	b = append(b, '\n')
	path := filepath.Join(dir, ManifestFile)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("write manifest %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync manifest %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close manifest %s: %w", path, err)
	}
	return nil
}

// templateFromDir returns the Template stored in build dir dir, named name
// (the manifest's name if name is empty).
func templateFromDir(name, dir string) (Template, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return Template{}, fmt.Errorf("template dir %s: %w", dir, err)
	}
	m, err := ReadManifest(abs)
	if err != nil {
		return Template{}, err
	}
	if name == "" {
		name = m.Name
	}
	return Template{
		Name:    name,
		Version: m.Version,
		Digest:  m.Digest,
		RootFS:  filepath.Join(abs, RootFSDir),
		Dir:     abs,
		Size:    m.Size,
		Created: m.Created,
		IDBase:  m.idBase(),
	}, nil
}

// Open returns the template in build dir dir, as written by BuildBase.
func Open(dir string) (Template, error) {
	return templateFromDir("", dir)
}

// openBuild opens the build dir dir and checks it was built from digest.
func openBuild(dir, digest string) (Template, error) {
	t, err := Open(dir)
	if err != nil {
		return Template{}, err
	}
	if t.Digest != digest {
		return Template{}, fmt.Errorf("template %s has digest %s, want %s", dir, t.Digest, digest)
	}
	return t, nil
}
