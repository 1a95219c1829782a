package template

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
