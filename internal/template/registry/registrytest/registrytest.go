// Package registrytest gives unit tests a real template registry without
// a debootstrap build: a base build dir (manifest and an empty rootfs)
// in a temporary directory, registered as the current version of "base"
// like the server registers its real base.
package registrytest

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template"
	"github.com/corralhq/corral/internal/template/registry"
)

// New returns a registry over st (its versions dir in a temporary
// directory) whose current "base" is a build made in a temporary
// directory, and that build's rootfs.
func New(t testing.TB, st *store.Store) (reg *registry.Registry, rootfs string) {
	t.Helper()
	reg = registry.New(st, registry.Config{Dir: filepath.Join(t.TempDir(), "template-versions")})
	tpl := Build(t, t.TempDir(), "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
	if err := reg.RegisterBase(context.Background(), tpl); err != nil {
		t.Fatal(err)
	}
	return reg, tpl.RootFS
}

// Build writes a base build dir under parent as template.BuildBase leaves
// one (a manifest with digest, and an empty rootfs directory) and
// returns it.
func Build(t testing.TB, parent, digest string) template.Template {
	t.Helper()
	dir := filepath.Join(parent, "base-"+digest[:8])
	if err := os.MkdirAll(filepath.Join(dir, template.RootFSDir), 0o755); err != nil {
		t.Fatal(err)
	}
	m := template.Manifest{Name: "base", Version: "test-" + digest[:8], Digest: digest, Size: 1,
		Created: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, template.ManifestFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	tpl, err := template.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}
