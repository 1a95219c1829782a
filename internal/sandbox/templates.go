package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/corralhq/corral/internal/inroot"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template"
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
	if m.cfg.TemplateDir != "" && (tv.Source == "build" || tv.Source == "sandbox") {
		dir := filepath.Join(m.cfg.TemplateDir, name, version)
		if err := os.RemoveAll(dir); err != nil {
			m.log.Error("remove template dir", "dir", dir, "err", err)
		}
	}
	m.audit("", "template.deleted", map[string]any{"template": ref})
	if tv.Source == "import" {
		m.purgeUnusedImports(ctx)
	}
	return nil
}

// importsDir is where imported images are extracted, one directory per
// image digest.
func (m *Manager) importsDir() string { return filepath.Join(m.cfg.TemplateDir, "imports") }

// purgeUnusedImports removes imported images that no template version
// names any more (their last version was deleted, or an import's record
// never made it) and partial imports left by a crash. It skips the round
// when an import is running; the reaper tries again.
func (m *Manager) purgeUnusedImports(ctx context.Context) {
	if m.cfg.TemplateDir == "" || !m.importMu.TryLock() {
		return
	}
	defer m.importMu.Unlock()
	entries, err := os.ReadDir(m.importsDir())
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			m.log.Error("reaper: list imports", "err", err)
		}
		return
	}
	versions, err := m.store.ListTemplateVersions(ctx, "")
	if err != nil {
		m.log.Error("reaper: list templates", "err", err)
		return
	}
	used := map[string]bool{}
	for _, tv := range versions {
		used[filepath.Dir(tv.RootFS)] = true
	}
	for _, e := range entries {
		dir := filepath.Join(m.importsDir(), e.Name())
		partial := strings.HasPrefix(e.Name(), ".tmp-import-")
		if !e.IsDir() || used[dir] || !partial && !strings.HasPrefix(e.Name(), "import-") {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			m.log.Error("reaper: remove import", "dir", dir, "err", err)
			continue
		}
		why := "unused"
		if partial {
			why = "partial"
		}
		m.audit("", "reaper.reclaimed", map[string]any{"what": "template import " + e.Name(), "reason": why})
	}
}

// MaxPasswdBytes bounds the /etc/passwd of an imported image that corral
// reads to find the user "user".
const MaxPasswdBytes = 4 << 20

// ImportTemplate imports an OCI image (docker-save tarball, OCI layout or
// registry reference) as template version name:version and makes it
// current. The image's env and working directory become the template's
// defaults; an image without the user "user" runs commands as root.
func (m *Manager) ImportTemplate(ctx context.Context, ref string, src template.ImportSource, progress io.Writer) (*store.TemplateVersion, error) {
	name, version := splitRef(ref)
	if !tmplNameRe.MatchString(name) || !tmplVersionRe.MatchString(version) || strings.HasPrefix(name, SnapshotPrefix) {
		return nil, invalid("give NAME:VERSION of [a-z0-9._-]")
	}
	if _, err := m.store.GetTemplateVersion(ctx, name, version); err == nil {
		return nil, &ConflictError{Msg: fmt.Sprintf("template %s exists; templates are immutable, pick a new version", ref)}
	}
	if m.cfg.TemplateDir == "" {
		return nil, errors.New("template imports are not configured")
	}
	m.importMu.RLock()
	defer m.importMu.RUnlock()
	res, err := template.ImportImage(ctx, m.importsDir(), src, m.cfg.IDBase, progress)
	if err != nil {
		if errors.Is(err, template.ErrUnsafeLayer) {
			return nil, invalid("%v", err)
		}
		return nil, fmt.Errorf("import %s: %w", ref, err)
	}
	cfg := store.TemplateConfig{Workdir: res.Config.WorkingDir, Env: map[string]string{}}
	for _, kv := range res.Config.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && envNameRe.MatchString(k) && k != "PATH" && k != "HOME" {
			cfg.Env[k] = v
		}
	}
	// Image content: read inside the image's root (a link to a host file
	// resolves inside it); an unreadable one means no user "user".
	if b, err := inroot.ReadFile(filepath.Join(res.Dir, "rootfs"), "/etc/passwd", MaxPasswdBytes); err != nil || !strings.Contains("\n"+string(b), "\nuser:") {
		cfg.User = "root"
	}
	tv := &store.TemplateVersion{Name: name, Version: version, Digest: res.Digest, Source: "import",
		RootFS: filepath.Join(res.Dir, "rootfs"), SizeBytes: res.Size, BuildLog: filepath.Join(res.Dir, "build.log"),
		CreatedAt: time.Now().UTC(), Config: cfg}
	if err := m.store.InsertTemplateVersion(ctx, tv, true); err != nil {
		return nil, err
	}
	m.audit("", "template.imported", map[string]any{"template": ref, "digest": res.Digest, "bytes": res.Size, "layers": len(res.Layers)})
	return tv, nil
}

// LayerInspection is the size and largest files of one layer of a template.
type LayerInspection struct {
	Layer   string              `json:"layer"` // "rootfs" or the layer's position from the top
	Bytes   int64               `json:"bytes"`
	Files   int                 `json:"files"`
	Largest []template.PathSize `json:"largest"`
}

// InspectTemplate reports a template version's size by layer and the
// largest paths of each (top n).
func (m *Manager) InspectTemplate(ctx context.Context, ref string, n int) ([]LayerInspection, []template.LayerInfo, error) {
	tv, err := m.TemplateVersion(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	var out []LayerInspection
	var imageLayers []template.LayerInfo
	if in, err := template.Inspect(filepath.Dir(tv.RootFS), n); err == nil {
		out = append(out, LayerInspection{Layer: "rootfs", Bytes: in.Size, Files: in.Files, Largest: in.Largest})
		imageLayers = in.Layers
	} else if li, err := inspectDir(tv.RootFS, n); err == nil {
		out = append(out, li)
	}
	for i := len(tv.Layers) - 1; i >= 0; i-- {
		li, err := inspectDir(tv.Layers[i], n)
		if err != nil {
			return nil, nil, err
		}
		li.Layer = fmt.Sprintf("layer %d", len(tv.Layers)-i)
		out = append(out, li)
	}
	return out, imageLayers, nil
}

func inspectDir(dir string, n int) (LayerInspection, error) {
	li := LayerInspection{Layer: "rootfs"}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		li.Files++
		li.Bytes += info.Size()
		rel, _ := filepath.Rel(dir, p)
		li.Largest = append(li.Largest, template.PathSize{Path: "/" + rel, Bytes: info.Size()})
		return nil
	})
	sort.Slice(li.Largest, func(i, j int) bool { return li.Largest[i].Bytes > li.Largest[j].Bytes })
	if len(li.Largest) > n {
		li.Largest = li.Largest[:n]
	}
	return li, err
}

// SaveTemplate makes a new template version name:version from a live
// sandbox's files: its writable layer (copied while it is frozen) on top of
// everything it was started from (template layers and any snapshot). The
// new version becomes current; the sandbox keeps running.
func (m *Manager) SaveTemplate(ctx context.Context, id, ref string) (*store.TemplateVersion, error) {
	name, version := splitRef(ref)
	if !tmplNameRe.MatchString(name) || !tmplVersionRe.MatchString(version) || strings.HasPrefix(name, SnapshotPrefix) {
		return nil, invalid("give NAME:VERSION of [a-z0-9._-]")
	}
	if _, err := m.store.GetTemplateVersion(ctx, name, version); err == nil {
		return nil, &ConflictError{Msg: fmt.Sprintf("template %s exists; templates are immutable, pick a new version", ref)}
	}
	ls, unlock, err := m.lockOp(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, err := m.copyableRecord(ls)
	if err != nil {
		return nil, err
	}
	parentRef := rec.TemplateVersion
	if parentRef == "" {
		parentRef = rec.Template
	}
	parent, err := m.resolveTemplate(ctx, parentRef)
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
	if m.cfg.TemplateDir == "" {
		return nil, errors.New("templates are not configured")
	}
	dir := filepath.Join(m.cfg.TemplateDir, name, version)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("template dir: %w", err)
	}
	layer := filepath.Join(dir, "layer")
	size, err := m.driver.Snapshot(ctx, id, layer)
	if err != nil {
		os.RemoveAll(dir)
		return nil, m.goneOr(ls, fmt.Errorf("save %s: %w", id, err))
	}
	digest, err := layerDigest(parent.Digest, layer)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	layers := append([]string{layer}, snapLayers...)
	tv := &store.TemplateVersion{Name: name, Version: version, Digest: digest, Parent: parent.Ref(), Source: "sandbox",
		RootFS: parent.RootFS, Layers: append(layers, parent.Layers...), SizeBytes: parent.SizeBytes + size,
		CreatedAt: time.Now().UTC(), Config: parent.Config}
	if parent.Version == "" {
		tv.Parent = parent.Name
	}
	if err := m.store.InsertTemplateVersion(ctx, tv, true); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	m.audit(id, "template.saved", map[string]any{"template": tv.Ref(), "parent": tv.Parent, "bytes": size})
	return tv, nil
}
