package registry

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/corralhq/corral/internal/interpreter"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template"
)

// RegisterBase records a base build (template.BuildBase) as a version of
// "base" like any other: its version is the build's, its root filesystem
// the build's rootfs. It becomes current when base has no current
// version yet; a build already recorded changes nothing.
func (r *Registry) RegisterBase(ctx context.Context, t template.Template) error {
	return r.registerBuild(ctx, BaseName, t, store.TemplateConfig{}, false)
}

// CodeInterpreterConfig is the code-interpreter template's configuration:
// its start command launches the interpreter server as the sandbox user in
// its home at every create.
func CodeInterpreterConfig() store.TemplateConfig {
	return store.TemplateConfig{Workdir: interpreter.Workdir, Start: interpreter.StartCommand}
}

// RegisterCodeInterpreter records a code-interpreter build
// (template.BuildCodeInterpreter) as a published version of
// "code-interpreter" (usable by every team) with CodeInterpreterConfig.
// A build not recorded yet becomes current (a new corral carries a new
// server, whose build its sandboxes should get); one recorded already
// changes nothing, so a rollback (Use) stays.
func (r *Registry) RegisterCodeInterpreter(ctx context.Context, t template.Template) error {
	return r.registerBuild(ctx, interpreter.TemplateName, t, CodeInterpreterConfig(), true)
}

// registerBuild records build t under name with configuration cfg (see
// RegisterBase); it becomes current when always is set or the name has no
// current version.
func (r *Registry) registerBuild(ctx context.Context, name string, t template.Template, cfg store.TemplateConfig, always bool) error {
	if _, err := r.st.GetTemplateVersion(ctx, name, t.Version); err == nil {
		return nil
	}
	_, curErr := r.st.GetTemplateVersion(ctx, name, "")
	tv := &store.TemplateVersion{Name: name, Version: t.Version, Digest: "sha256:" + t.Digest, Source: SourceBase,
		RootFS: t.RootFS, SizeBytes: t.Size, BuildLog: filepath.Join(t.Dir, template.BuildLogFile), CreatedAt: t.Created,
		Config: cfg}
	if err := r.st.InsertTemplateVersion(ctx, tv, always || curErr != nil); err != nil {
		return fmt.Errorf("register %s:%s: %w", name, t.Version, err)
	}
	return nil
}

// Base returns the build of the current base version (its manifest
// read from its build dir), or an error wrapping ErrNotFound when there
// is none or its build dir is gone.
func (r *Registry) Base(ctx context.Context) (template.Template, error) {
	tv, err := r.Resolve(ctx, BaseName)
	if err != nil {
		return template.Template{}, err
	}
	t, err := template.Open(filepath.Dir(tv.RootFS))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return template.Template{}, fmt.Errorf("base template %s: build dir %s is gone: %w", tv.Ref(), filepath.Dir(tv.RootFS), ErrNotFound)
		}
		return template.Template{}, fmt.Errorf("base template %s: %w", tv.Ref(), err)
	}
	return t, nil
}

// MigrateLinks moves an old data dir's registrations into the registry:
// before versions were recorded, DIR (DATA/templates) held one symbolic
// link per template name to a build dir. Each link whose build dir still
// holds a valid build is recorded as that build's version of its name
// (current when the name has none), then removed; a dangling or damaged
// link is removed too (it resolved to nothing before). Anything else in
// DIR (a directory, a file someone put there) is left alone. DIR itself
// is removed once empty. It is idempotent: a data dir already migrated
// (or never in the old layout) is left as it is.
func (r *Registry) MigrateLinks(ctx context.Context, dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("migrate template links: %w", err)
	}
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		link := filepath.Join(dir, e.Name())
		if template.ValidateName(e.Name()) == nil {
			target, err := os.Readlink(link)
			if err != nil {
				return fmt.Errorf("migrate template link %s: %w", link, err)
			}
			if !filepath.IsAbs(target) {
				target = filepath.Join(dir, target)
			}
			if t, err := template.Open(target); err == nil {
				if err := r.registerBuild(ctx, e.Name(), t, store.TemplateConfig{}, false); err != nil {
					return fmt.Errorf("migrate template link %s: %w", link, err)
				}
			} else {
				r.cfg.Log.Warn("migrate template link: not a build, dropped", "link", link, "target", target, "err", err)
			}
		}
		if err := os.Remove(link); err != nil {
			return fmt.Errorf("migrate template link %s: %w", link, err)
		}
	}
	_ = os.Remove(dir) // only when empty
	return nil
}
