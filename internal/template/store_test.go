package template

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/idrange"
)

// fakeBuild creates a build dir with a manifest and an empty rootfs.
func fakeBuild(t *testing.T, parent, name, digest string) string {
	t.Helper()
	dir := filepath.Join(parent, name)
	if err := os.MkdirAll(filepath.Join(dir, RootFSDir), 0o755); err != nil {
		t.Fatal(err)
	}
	m := Manifest{Name: name, Version: "v-" + digest[:4], Digest: digest, Size: 1234, Created: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	if err := writeManifest(dir, m); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestValidateName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"base", true},
		{"b", true},
		{"0", true},
		{"python-3.11_slim", true},
		{"a" + strings.Repeat("b", 62), true},
		{"a" + strings.Repeat("b", 63), false},
		{"", false},
		{".", false},
		{"..", false},
		{".hidden", false},
		{"-flag", false},
		{"_x", false},
		{"Base", false},
		{"a/b", false},
		{"../etc", false},
		{"a b", false},
		{"a\x00", false},
		{"ümlaut", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateName(tt.name)
			if (err == nil) != tt.ok {
				t.Fatalf("ValidateName(%q) = %v, want ok=%v", tt.name, err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidName) {
				t.Errorf("error %v does not wrap ErrInvalidName", err)
			}
		})
	}
}

func TestStore(t *testing.T) {
	builds := t.TempDir()
	b1 := fakeBuild(t, builds, "base-1111", strings.Repeat("1", 64))
	b2 := fakeBuild(t, builds, "base-2222", strings.Repeat("2", 64))
	s, err := OpenStore(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}

	if l, err := s.List(); err != nil || len(l) != 0 {
		t.Fatalf("List on empty store = %v, %v", l, err)
	}
	if err := s.Register("base", b1); err != nil {
		t.Fatal(err)
	}
	if err := s.Register("alpha", b2); err != nil {
		t.Fatal(err)
	}
	got, err := s.Resolve("base")
	if err != nil {
		t.Fatal(err)
	}
	// The fake manifest records no id base: a build made before it was
	// recorded, shifted to the legacy base.
	want := Template{Name: "base", Version: "v-1111", Digest: strings.Repeat("1", 64), RootFS: filepath.Join(b1, RootFSDir), Dir: b1, Size: 1234, Created: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), IDBase: idrange.LegacyBase}
	if got != want {
		t.Errorf("Resolve(base) = %+v, want %+v", got, want)
	}

	// Re-registering replaces.
	if err := s.Register("base", b2); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Resolve("base"); got.Dir != b2 {
		t.Errorf("after re-register, base -> %s, want %s", got.Dir, b2)
	}

	l, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != 2 || l[0].Name != "alpha" || l[1].Name != "base" {
		t.Errorf("List = %+v", l)
	}

	// A store reopened sees the same registrations.
	s2, err := OpenStore(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Resolve("alpha"); err != nil {
		t.Errorf("reopened store: %v", err)
	}

	if err := s.Remove("alpha"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve("alpha"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Resolve after Remove: %v, want ErrNotFound", err)
	}
	if err := s.Remove("alpha"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Remove: %v, want ErrNotFound", err)
	}
}

func TestStoreErrors(t *testing.T) {
	builds := t.TempDir()
	good := fakeBuild(t, builds, "good", strings.Repeat("a", 64))
	noManifest := filepath.Join(builds, "nomanifest")
	if err := os.MkdirAll(filepath.Join(noManifest, RootFSDir), 0o755); err != nil {
		t.Fatal(err)
	}
	noRootFS := fakeBuild(t, builds, "norootfs", strings.Repeat("b", 64))
	if err := os.Remove(filepath.Join(noRootFS, RootFSDir)); err != nil {
		t.Fatal(err)
	}
	partial := filepath.Join(builds, "partial")
	if err := os.MkdirAll(filepath.Join(partial, RootFSDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(partial, ManifestFile), []byte(`{"name":"x"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	gone := fakeBuild(t, builds, "gone", strings.Repeat("c", 64))

	s, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Register("gone", gone); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(gone); err != nil {
		t.Fatal(err)
	}

	registerTests := []struct {
		name, dir string
		is        error // nil: any error
	}{
		{"Bad", good, ErrInvalidName},
		{"../x", good, ErrInvalidName},
		{"", good, ErrInvalidName},
		{"ok", noManifest, nil},
		{"ok", noRootFS, nil},
		{"ok", partial, nil},
		{"ok", filepath.Join(builds, "missing"), nil},
	}
	for _, tt := range registerTests {
		t.Run("register "+tt.name+" "+filepath.Base(tt.dir), func(t *testing.T) {
			err := s.Register(tt.name, tt.dir)
			if err == nil {
				t.Fatal("Register succeeded")
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("err = %v, want %v", err, tt.is)
			}
		})
	}

	resolveTests := []struct {
		name string
		is   error
	}{
		{"unknown", ErrNotFound},
		{"gone", ErrNotFound},
		{"UPPER", ErrInvalidName},
		{"a/b", ErrInvalidName},
		{"..", ErrInvalidName},
	}
	for _, tt := range resolveTests {
		t.Run("resolve "+tt.name, func(t *testing.T) {
			_, err := s.Resolve(tt.name)
			if !errors.Is(err, tt.is) {
				t.Errorf("Resolve(%q) = %v, want %v", tt.name, err, tt.is)
			}
		})
	}

	// List skips the dangling registration and stray files.
	if err := os.WriteFile(filepath.Join(s.Dir(), "stray"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Register("good", good); err != nil {
		t.Fatal(err)
	}
	l, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != 1 || l[0].Name != "good" {
		t.Errorf("List = %+v, want only good", l)
	}
	// Register does not replace a non-link entry.
	if err := os.Mkdir(filepath.Join(s.Dir(), "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.Dir(), "dir", "keep"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Register("dir", good); err == nil {
		t.Error("Register over a non-empty directory succeeded")
	}
}

func TestOpenBuildDir(t *testing.T) {
	dir := fakeBuild(t, t.TempDir(), "base-x", strings.Repeat("d", 64))
	tpl, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Name != "base-x" || tpl.RootFS != filepath.Join(dir, RootFSDir) {
		t.Errorf("Open = %+v", tpl)
	}
}

func TestDefaultCacheDir(t *testing.T) {
	t.Setenv("CORRAL_TEMPLATE_CACHE", "")
	if got := DefaultCacheDir(); got != "/var/cache/corral/templates" {
		t.Errorf("DefaultCacheDir() = %s", got)
	}
	t.Setenv("CORRAL_TEMPLATE_CACHE", "/tmp/x")
	if got := DefaultCacheDir(); got != "/tmp/x" {
		t.Errorf("DefaultCacheDir() with env = %s", got)
	}
}
