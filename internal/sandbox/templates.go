package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/proto/process"
)

// splitRef splits "name[:version]".
func splitRef(ref string) (name, version string) {
	name, version, _ = strings.Cut(ref, ":")
	return name, version
}

// startTemplateCommand starts a template's start command in the
// background (in its workdir, as its user or "user"); it is recorded like
// any command and counts against the sandbox's task.
func (m *Manager) startTemplateCommand(id string, c store.TemplateConfig) {
	user := c.User
	if user == "" {
		user = "user"
	}
	cmd := c.Start
	if c.Workdir != "" {
		cmd = "cd " + shellQuote(c.Workdir) + " && " + cmd
	}
	p, err := m.StartProcess(context.Background(), id, &process.StartRequest{Process: &process.ProcessConfig{
		Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}}}, user, 0)
	if err != nil {
		m.log.Warn("template start command", "id", id, "err", err)
		return
	}
	go func() {
		defer p.Close()
		for {
			if msg, err := p.Receive(); err != nil || msg == nil || msg.GetEvent().GetEnd() != nil {
				return
			}
		}
	}()
}

// resolveTemplate finds the template version a create names: an exact
// "name:version", or the current version of "name". A name with no
// recorded versions falls back to the template store (its rootfs, no
// layers, no version pin).
func (m *Manager) resolveTemplate(ctx context.Context, ref string) (*store.TemplateVersion, error) {
	name, version := splitRef(ref)
	tv, err := m.store.GetTemplateVersion(ctx, name, version)
	if err == nil {
		return tv, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	if version != "" {
		return nil, invalid("template %q: no such template version", ref)
	}
	rootfs, err := m.templates.RootFS(name)
	if err != nil {
		return nil, invalid("template %q: %v", ref, err)
	}
	return &store.TemplateVersion{Name: name, RootFS: rootfs}, nil
}

// Templates lists template versions (of name, when not "").
func (m *Manager) Templates(ctx context.Context, name string) ([]*store.TemplateVersion, error) {
	return m.store.ListTemplateVersions(ctx, name)
}

// TemplateVersion returns one version ("name:version", or the current
// version of "name").
func (m *Manager) TemplateVersion(ctx context.Context, ref string) (*store.TemplateVersion, error) {
	name, version := splitRef(ref)
	tv, err := m.store.GetTemplateVersion(ctx, name, version)
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrTemplateNotFound
	}
	return tv, err
}

// ErrTemplateNotFound: no such template version.
var ErrTemplateNotFound = errors.New("template not found")

// UseTemplate makes name:version the version the bare name resolves to
// (a rollback, or a roll forward). Running sandboxes keep theirs.
func (m *Manager) UseTemplate(ctx context.Context, ref string) (*store.TemplateVersion, error) {
	name, version := splitRef(ref)
	if version == "" {
		return nil, invalid("give name:version")
	}
	if err := m.store.SetCurrentTemplate(ctx, name, version); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, ErrTemplateNotFound
		}
		return nil, err
	}
	m.audit("", "template.current", map[string]any{"template": ref})
	return m.TemplateVersion(ctx, ref)
}

// DeleteTemplate removes name:version when no running sandbox, snapshot
// or other template version uses it, and its layer directory. The current
// version cannot be deleted while other versions exist (use another
// first).
func (m *Manager) DeleteTemplate(ctx context.Context, ref string) error {
	name, version := splitRef(ref)
	if version == "" {
		return invalid("give name:version")
	}
	tv, err := m.store.GetTemplateVersion(ctx, name, version)
	if errors.Is(err, store.ErrNotFound) {
		return ErrTemplateNotFound
	}
	if err != nil {
		return err
	}
	users, err := m.store.TemplateUsers(ctx, ref)
	if err != nil {
		return err
	}
	if tv.Source == "debootstrap" {
		users = append(users, "the server (the built-in base template)")
	}
	if len(users) > 0 {
		return &ConflictError{Msg: fmt.Sprintf("template %s is in use by %s", ref, strings.Join(users, ", "))}
	}
	if tv.Current {
		others, _ := m.store.ListTemplateVersions(ctx, name)
		if len(others) > 1 {
			return &ConflictError{Msg: fmt.Sprintf("template %s is the current version of %s; make another version current first", ref, name)}
		}
	}
	if err := m.store.DeleteTemplateVersion(ctx, name, version); err != nil {
		return err
	}
	if m.cfg.TemplateDir != "" && (tv.Source == "build" || tv.Source == "import") {
		dir := filepath.Join(m.cfg.TemplateDir, name, version)
		if err := os.RemoveAll(dir); err != nil {
			m.log.Error("remove template dir", "dir", dir, "err", err)
		}
	}
	m.audit("", "template.deleted", map[string]any{"template": ref})
	return nil
}
