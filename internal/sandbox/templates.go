package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template/registry"
	"github.com/corralhq/corral/proto/process"
)

// TemplateRegistry is what the Manager needs of the template registry
// (registry.Registry, the one registry: every template, the base
// included, is a recorded version).
type TemplateRegistry interface {
	// Resolve resolves "name" (its current version) or "name:version";
	// an unknown one gives an error wrapping registry.ErrNotFound.
	Resolve(ctx context.Context, ref string) (*store.TemplateVersion, error)
	// CheckNew validates the "name:version" of a new version for team
	// ("" = published) and refuses an existing one or a name another team
	// owns.
	CheckNew(ctx context.Context, ref, team string) (name, version string, err error)
	// NewLayerDir creates the directory of a new version's files.
	NewLayerDir(name, version string) (string, error)
	// Add records a new version and makes it current.
	Add(ctx context.Context, tv *store.TemplateVersion) error
	// PurgeUnusedImports removes imported images no version uses.
	PurgeUnusedImports(ctx context.Context)
}

// ErrTemplateNotFound: no such template version.
var ErrTemplateNotFound = registry.ErrNotFound

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

// resolveTemplate finds the template version a create names (see
// registry.Registry.Resolve); an unknown one is the caller's mistake.
func (m *Manager) resolveTemplate(ctx context.Context, ref, team string) (*store.TemplateVersion, error) {
	tv, err := m.templates.Resolve(ctx, ref)
	if err == nil && !registry.Visible(tv, team) {
		// Another team's private template is absent, as if it did not
		// exist.
		err = registry.ErrNotFound
	}
	if errors.Is(err, registry.ErrNotFound) {
		if _, version := registry.SplitRef(ref); version != "" {
			return nil, invalid("template %q: no such template version", ref)
		}
		return nil, invalid("template %q: no such template", ref)
	}
	return tv, err
}

// SaveTemplate makes a new template version name:version from a live
// sandbox's files: its writable layer (copied while it is frozen) on top of
// everything it was started from (template layers and any snapshot). The
// new version becomes current; the sandbox keeps running. It is work
// Shutdown waits for (beginWork), so that the version's files and its
// record are both written or neither; once Shutdown has begun it is
// refused with ErrShuttingDown.
func (m *Manager) SaveTemplate(ctx context.Context, id, ref string) (*store.TemplateVersion, error) {
	done, ok := m.beginWork()
	if !ok {
		return nil, ErrShuttingDown
	}
	defer done()
	ls, unlock, err := m.lockOp(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, err := m.copyableRecord(ls)
	if err != nil {
		return nil, err
	}
	// The new template is private to the sandbox's team.
	name, version, err := m.templates.CheckNew(ctx, ref, rec.Team)
	if err != nil {
		return nil, err
	}
	parentRef := rec.TemplateVersion
	if parentRef == "" {
		parentRef = rec.Template
	}
	parent, err := m.resolveTemplate(ctx, parentRef, rec.Team)
	if err != nil {
		return nil, err
	}
	var snapLayers []string
	if ps := parentSnapshot(&rec); ps != "" {
		sn, err := m.store.GetSnapshotAny(ctx, ps)
		if err != nil {
			return nil, fmt.Errorf("snapshot under %s: %w", id, err)
		}
		snapLayers = sn.Layers
	}
	dir, err := m.templates.NewLayerDir(name, version)
	if err != nil {
		return nil, err
	}
	layer := filepath.Join(dir, "layer")
	size, err := m.driver.Snapshot(ctx, id, layer)
	if err != nil {
		os.RemoveAll(dir)
		return nil, m.goneOr(ls, fmt.Errorf("save %s: %w", id, err))
	}
	digest, err := registry.LayerDigest(parent.Digest, layer)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	layers := append([]string{layer}, snapLayers...)
	tv := &store.TemplateVersion{Name: name, Version: version, Digest: digest, Parent: parent.Ref(), Source: registry.SourceSandbox,
		RootFS: parent.RootFS, Layers: append(layers, parent.Layers...), SizeBytes: parent.SizeBytes + size,
		CreatedAt: time.Now().UTC(), Config: parent.Config, Team: rec.Team}
	if err := m.templates.Add(ctx, tv); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	m.auditBy(ctx, id, "template.saved", map[string]any{"template": tv.Ref(), "parent": tv.Parent, "bytes": size})
	return tv, nil
}
