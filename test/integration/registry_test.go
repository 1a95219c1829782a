package integration

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/corralhq/corral/internal/server"
	"github.com/corralhq/corral/test/testserver"
)

// TestTemplateOldLayoutDataDir checks that a data dir made before the
// one template registry keeps working: such a dir registered templates
// as symbolic links DATA/templates/<name> to build dirs, and its database
// had no version rows for them. The server opened on one (made here from
// a fresh data dir: its database removed, links to the cached base build
// put in) records every link as a version, removes the links, and
// sandboxes start from both names through the registry.
func TestTemplateOldLayoutDataDir(t *testing.T) {
	need(t)
	ctx := context.Background()
	tmp := t.TempDir()
	for d := tmp; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o711) // sandbox root must traverse to its rootfs
	}
	data := filepath.Join(tmp, "data")
	ids, err := testserver.CopyIDFiles(filepath.Join(tmp, "etc"))
	if err != nil {
		t.Fatal(err)
	}
	open := func() *server.Server {
		s, err := server.Open(ctx, server.Config{DataDir: data, AgentBinary: env.bin, IDFiles: ids,
			Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s1 := open()
	rootfs, err := s1.TemplateRootFS("base")
	if err != nil {
		t.Fatal(err)
	}
	if err := s1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// The old layout: no version rows, one link per name.
	for _, f := range []string{"corral.db", "corral.db-wal", "corral.db-shm"} {
		if err := os.Remove(filepath.Join(data, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	links := filepath.Join(data, "templates")
	if err := os.MkdirAll(links, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"base", "legacy"} {
		link := filepath.Join(links, name)
		if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Dir(rootfs), link); err != nil {
			t.Fatal(err)
		}
	}

	s2 := open()
	hs := httptest.NewServer(s2.Handler)
	defer func() {
		hs.Close()
		s2.Close(ctx)
	}()
	if _, err := os.Lstat(links); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there after the migration: %v", links, err)
	}
	saveURL, saveKey := env.url, env.key
	env.url, env.key = hs.URL, s2.AdminKey
	defer func() { env.url, env.key = saveURL, saveKey }()
	var list struct {
		Templates []struct {
			Name, Version, Source string
			Current               bool
		}
	}
	call(t, "GET", "/v1/templates", nil, &list)
	found := map[string]bool{}
	for _, tv := range list.Templates {
		if tv.Current && tv.Source == "debootstrap" {
			found[tv.Name] = true
		}
	}
	if !found["base"] || !found["legacy"] {
		t.Fatalf("templates after migration: %+v; want current base and legacy", list.Templates)
	}
	for _, tmpl := range []string{"base", "legacy"} {
		id := create(t, map[string]any{"template": tmpl})
		if out := mustSh(t, id, "echo ok"); out != "ok\n" {
			t.Errorf("sandbox from %s: %q", tmpl, out)
		}
		call(t, "DELETE", "/v1/sandboxes/"+id, nil, nil)
	}
}
