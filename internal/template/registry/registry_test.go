package registry

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/interpreter"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template"
)

// fakeBuild makes a base build dir (manifest and an empty rootfs) as
// template.BuildBase leaves it, under parent/dirName.
func fakeBuild(t *testing.T, parent, dirName, digest string) template.Template {
	t.Helper()
	dir := filepath.Join(parent, dirName)
	if err := os.MkdirAll(filepath.Join(dir, template.RootFSDir), 0o755); err != nil {
		t.Fatal(err)
	}
	m := template.Manifest{Name: "base", Version: "bookworm-r1-" + digest[:6], Digest: digest, Size: 1234,
		Created: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), IDBase: 100000}
	b, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(dir, template.ManifestFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	tpl, err := template.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}

func newRegistry(t *testing.T, data string) (*Registry, *store.Store) {
	t.Helper()
	st, err := store.Open(filepath.Join(data, "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return New(st, Config{Dir: filepath.Join(data, "template-versions")}), st
}

// TestMigrateLinks checks that a data dir of the old layout keeps
// working: before the registry, DATA/templates held one symbolic link per
// name to a build dir, and a name with no recorded version resolved
// through its link. Opening the registry on such a dir (made here, with
// an absolute and a relative link, a dangling link, a link to a damaged
// build, and a directory and a file that are not links) records each
// good link as a version of its name, current, and removes every link,
// so names resolve through the one path; it leaves what is not a link,
// and a second run changes nothing.
func TestMigrateLinks(t *testing.T) {
	ctx := context.Background()
	data := t.TempDir()
	cache := t.TempDir()
	links := filepath.Join(data, "templates")
	if err := os.MkdirAll(links, 0o755); err != nil {
		t.Fatal(err)
	}
	base := fakeBuild(t, cache, "base-1111", strings.Repeat("1", 64))
	py := fakeBuild(t, links, ".builds/py", strings.Repeat("2", 64))
	broken := filepath.Join(cache, "broken")
	os.MkdirAll(broken, 0o755) // no manifest, no rootfs
	for name, target := range map[string]string{
		"base":   base.Dir,
		"py":     ".builds/py", // relative to the link's dir
		"gone":   filepath.Join(cache, "removed"),
		"broken": broken,
	} {
		if err := os.Symlink(target, filepath.Join(links, name)); err != nil {
			t.Fatal(err)
		}
	}
	os.Mkdir(filepath.Join(links, "handmade"), 0o755)
	os.WriteFile(filepath.Join(links, "notes.txt"), []byte("x"), 0o644)

	r, _ := newRegistry(t, data)
	for range 2 { // the second run is a no-op
		if err := r.MigrateLinks(ctx, links); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		ref    string
		rootfs string
	}{
		{"base", base.RootFS},
		{"base:" + base.Version, base.RootFS},
		{"py", py.RootFS},
	} {
		tv, err := r.Resolve(ctx, c.ref)
		if err != nil || tv.RootFS != c.rootfs || !tv.Current || tv.Source != SourceBase {
			t.Errorf("Resolve(%s) = %+v, %v; want current %s", c.ref, tv, err, c.rootfs)
		}
	}
	for _, ref := range []string{"gone", "broken"} {
		if _, err := r.Resolve(ctx, ref); !errors.Is(err, ErrNotFound) {
			t.Errorf("Resolve(%s) = %v, want ErrNotFound", ref, err)
		}
	}
	ents, _ := os.ReadDir(links)
	var left []string
	for _, e := range ents {
		if e.Type()&os.ModeSymlink != 0 {
			t.Errorf("link %s left", e.Name())
		}
		left = append(left, e.Name())
	}
	if strings.Join(left, ",") != ".builds,handmade,notes.txt" {
		t.Errorf("left in %s: %v; want only what is not a link", links, left)
	}
	if list, _ := r.List(ctx, ""); len(list) != 2 {
		t.Errorf("%d versions after two migrations, want 2 (base, py)", len(list))
	}
	got, err := r.Base(ctx)
	if err != nil || got.Dir != base.Dir {
		t.Errorf("Base() = %+v, %v; want the build in %s", got, err, base.Dir)
	}
}

// TestMigrateLinksAlreadyRecorded covers the old server's own data dirs:
// it recorded the linked base build as a version too, and a newer base
// build may be current. Migration adds nothing, keeps the current
// version, removes the link and the emptied DATA/templates.
func TestMigrateLinksAlreadyRecorded(t *testing.T) {
	ctx := context.Background()
	data, cache := t.TempDir(), t.TempDir()
	old := fakeBuild(t, cache, "base-1111", strings.Repeat("1", 64))
	cur := fakeBuild(t, cache, "base-3333", strings.Repeat("3", 64))
	r, _ := newRegistry(t, data)
	if err := r.RegisterBase(ctx, cur); err != nil {
		t.Fatal(err)
	}
	if err := r.RegisterBase(ctx, old); err != nil { // recorded, not current
		t.Fatal(err)
	}
	links := filepath.Join(data, "templates")
	os.MkdirAll(links, 0o755)
	if err := os.Symlink(old.Dir, filepath.Join(links, "base")); err != nil {
		t.Fatal(err)
	}
	if err := r.MigrateLinks(ctx, links); err != nil {
		t.Fatal(err)
	}
	tv, err := r.Resolve(ctx, "base")
	if err != nil || tv.Version != cur.Version {
		t.Fatalf("base resolves to %+v, %v; want the current %s", tv, err, cur.Version)
	}
	if list, _ := r.List(ctx, "base"); len(list) != 2 {
		t.Errorf("%d base versions, want 2", len(list))
	}
	if _, err := os.Lstat(links); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left after migration: %v", links, err)
	}
}

// TestBaseIsAVersion checks that the base template goes through the
// same registry as every other version: registered, it resolves by name
// and by name:version; a second build does not take over a current
// base; Use rolls between them; Delete refuses the base (the server
// needs it) and unknown references are ErrNotFound.
func TestBaseIsAVersion(t *testing.T) {
	ctx := context.Background()
	data, cache := t.TempDir(), t.TempDir()
	r, _ := newRegistry(t, data)
	if _, err := r.Base(ctx); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Base() on an empty registry = %v, want ErrNotFound", err)
	}
	b1 := fakeBuild(t, cache, "b1", strings.Repeat("a", 64))
	b2 := fakeBuild(t, cache, "b2", strings.Repeat("b", 64))
	for _, b := range []template.Template{b1, b2, b1} {
		if err := r.RegisterBase(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	if tv, err := r.Resolve(ctx, "base"); err != nil || tv.RootFS != b1.RootFS || tv.Digest != "sha256:"+b1.Digest {
		t.Fatalf("base = %+v, %v; want the first build", tv, err)
	}
	if rootfs, err := r.RootFS(ctx, "base:"+b2.Version); err != nil || rootfs != b2.RootFS {
		t.Fatalf("RootFS(base:%s) = %q, %v", b2.Version, rootfs, err)
	}
	if _, err := r.Use(ctx, "base:"+b2.Version); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Base(ctx); err != nil || got.Dir != b2.Dir {
		t.Fatalf("after Use, Base() = %+v, %v", got, err)
	}
	var conflict *ConflictError
	if err := r.Delete(ctx, "base:"+b1.Version); !errors.As(err, &conflict) || !strings.Contains(err.Error(), "base template") {
		t.Errorf("Delete(base) = %v, want a conflict naming the base template", err)
	}
	for _, ref := range []string{"nope", "base:nope", "nope:1"} {
		if _, err := r.Resolve(ctx, ref); !errors.Is(err, ErrNotFound) {
			t.Errorf("Resolve(%s) = %v, want ErrNotFound", ref, err)
		}
	}
	if _, err := r.Use(ctx, "base:nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Use(base:nope) = %v, want ErrNotFound", err)
	}
	os.RemoveAll(b2.Dir)
	if _, err := r.Base(ctx); !errors.Is(err, ErrNotFound) {
		t.Errorf("Base() with its build dir removed = %v, want ErrNotFound (so the server rebuilds)", err)
	}
}

// TestCheckNew pins the rules for a new version's reference: bad input
// gets InvalidError, an existing version ConflictError (versions are
// immutable), and nothing is created either way.
func TestCheckNew(t *testing.T) {
	ctx := context.Background()
	data := t.TempDir()
	r, _ := newRegistry(t, data)
	if err := r.RegisterBase(ctx, fakeBuild(t, t.TempDir(), "b", strings.Repeat("c", 64))); err != nil {
		t.Fatal(err)
	}
	tv, _ := r.Resolve(ctx, "base")
	for _, c := range []struct {
		ref  string
		team string
		want string // "", "invalid", "conflict"
	}{
		{"py:1", "", ""},
		{"py", "", "invalid"},
		{"py:", "", "invalid"},
		{":1", "", "invalid"},
		{"Py:1", "", "invalid"},
		{"../x:1", "", "invalid"},
		{"snap-x:1", "", "invalid"},
		{"py:1/2", "", "invalid"},
		{"py:" + strings.Repeat("v", 65), "", "invalid"},
		{tv.Ref(), "", "conflict"},
		// The base is published: a team may not add a version of it,
		// and a name is one team's (names are server-wide).
		{"base:v2", "team-a", "conflict"},
		{"base:v2", "", ""},
	} {
		_, _, err := r.CheckNew(ctx, c.ref, c.team)
		var inv *InvalidError
		var conflict *ConflictError
		switch {
		case c.want == "" && err != nil,
			c.want == "invalid" && !errors.As(err, &inv),
			c.want == "conflict" && !errors.As(err, &conflict):
			t.Errorf("CheckNew(%q, team %q) = %v, want %s", c.ref, c.team, err, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(data, "template-versions")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CheckNew created files: %v", err)
	}
	if _, err := r.NewLayerDir("../x", "1"); err == nil {
		t.Error("NewLayerDir accepted ../x")
	}
	dir, err := r.NewLayerDir("py", "1")
	if err != nil || dir != filepath.Join(data, "template-versions", "py", "1") {
		t.Fatalf("NewLayerDir = %q, %v", dir, err)
	}
	if _, err := r.NewLayerDir("py", "1"); err == nil {
		t.Error("NewLayerDir made the same dir twice")
	}
}

// TestRegisterCodeInterpreter checks that a code-interpreter build is
// recorded as a published version (every team may start it) whose start
// command launches the interpreter server in the user's home, that a new
// build (a corral with a new server) becomes current while recording one
// again changes nothing (a rollback stays), and that the server's
// template cannot be deleted.
func TestRegisterCodeInterpreter(t *testing.T) {
	ctx := context.Background()
	data, cache := t.TempDir(), t.TempDir()
	r, _ := newRegistry(t, data)
	b1 := fakeBuild(t, cache, "c1", strings.Repeat("c", 64))
	b2 := fakeBuild(t, cache, "c2", strings.Repeat("d", 64))
	if err := r.RegisterCodeInterpreter(ctx, b1); err != nil {
		t.Fatal(err)
	}
	tv, err := r.Resolve(ctx, "code-interpreter")
	if err != nil || tv.RootFS != b1.RootFS || tv.Team != "" || !Visible(tv, "any-team") {
		t.Fatalf("code-interpreter = %+v, %v; want b1, published", tv, err)
	}
	if tv.Config.Start != interpreter.StartCommand || tv.Config.Workdir != "/home/user" || tv.Config.User != "" {
		t.Fatalf("config %+v: want the interpreter's start command, as the user, in /home/user", tv.Config)
	}
	if err := r.RegisterCodeInterpreter(ctx, b2); err != nil {
		t.Fatal(err)
	}
	if tv, _ := r.Resolve(ctx, "code-interpreter"); tv.RootFS != b2.RootFS {
		t.Fatalf("a new build is not current: %+v", tv)
	}
	if _, err := r.Use(ctx, "code-interpreter:"+b1.Version); err != nil {
		t.Fatal(err)
	}
	if err := r.RegisterCodeInterpreter(ctx, b2); err != nil {
		t.Fatal(err)
	}
	if tv, _ := r.Resolve(ctx, "code-interpreter"); tv.RootFS != b1.RootFS {
		t.Fatalf("registering a recorded build again undid a rollback: %+v", tv)
	}
	var conflict *ConflictError
	if err := r.Delete(ctx, "code-interpreter:"+b2.Version); !errors.As(err, &conflict) || !strings.Contains(err.Error(), "built-in code-interpreter template") {
		t.Errorf("Delete = %v, want a conflict naming the built-in template", err)
	}
}
