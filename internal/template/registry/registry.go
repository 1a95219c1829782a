// Package registry is corral's one template registry: every template a
// sandbox can start from, the debootstrap base included, is a version
// recorded in the store's template_versions table, and every lookup
// (name → current version, name:version → that version → root
// filesystem and layers) goes through Resolve. It also owns what happens
// to versions without a sandbox: imports of OCI images, rollbacks
// (Use), deletion, inspection, the purge of unused imports, and the
// migration of data dirs made when templates were symbolic links under
// DATA/templates.
//
// Builds from a spec and saving a sandbox as a template run a sandbox,
// so they stay with the sandbox Manager, which reaches the registry
// through a narrow interface (Resolve, CheckNew, NewLayerDir, Add).
package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/corralhq/corral/internal/inroot"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template"
)

// Sources of a template version.
const (
	// SourceBase is a template corral builds itself with debootstrap:
	// the base and code-interpreter templates (and any build
	// registered by a symbolic link in an old data dir). The server
	// needs them: they cannot be deleted.
	SourceBase = "debootstrap"
	// SourceBuild is a build from a spec.
	SourceBuild = "build"
	// SourceSandbox is a sandbox saved as a template.
	SourceSandbox = "sandbox"
	// SourceImport is an imported OCI image.
	SourceImport = "import"
)

// BaseName is the name of the built-in base template.
const BaseName = "base"

// SnapshotPrefix starts every snapshot id; no template name may start
// with it, so a snapshot can be named wherever a template can.
const SnapshotPrefix = "snap-"

// MaxPasswdBytes bounds the /etc/passwd of an imported image that corral
// reads to find the user "user".
const MaxPasswdBytes = 4 << 20

var (
	nameRe    = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	versionRe = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	envNameRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,255}$`)
)

// ErrNotFound: no such template version (or no current version of a
// name).
var ErrNotFound = errors.New("template not found")

// InvalidError is a request the registry refuses as malformed; nothing
// changed.
type InvalidError struct{ Msg string }

func (e *InvalidError) Error() string { return e.Msg }

func invalid(format string, args ...any) error {
	return &InvalidError{Msg: fmt.Sprintf(format, args...)}
}

// ConflictError is a request the registry's state refuses (an existing
// version, a version in use); nothing changed.
type ConflictError struct{ Msg string }

func (e *ConflictError) Error() string { return e.Msg }

// Config configures a Registry.
type Config struct {
	// Dir holds built, saved and imported template versions
	// (DIR/<name>/<version>/layer, DIR/imports/<image>). Empty: builds,
	// saves and imports are refused.
	Dir string
	// IDBase is the host uid imported images are shifted to.
	IDBase uint32
	// Audit records template events (may be nil).
	Audit Auditor
	// Log receives errors of background work (may be nil).
	Log *slog.Logger
}

// Auditor records an event in the audit log (audit.Log).
type Auditor interface {
	Record(sandbox, kind string, data any)
	// RecordBy records an event a request caused (the team and key id of
	// the actor in ctx).
	RecordBy(ctx context.Context, sandbox, kind string, data any)
}

type noAudit struct{}

func (noAudit) Record(string, string, any)                    {}
func (noAudit) RecordBy(context.Context, string, string, any) {}

// Registry is the template registry.
type Registry struct {
	cfg Config
	st  *store.Store
	// importMu: imports hold it shared from the extraction until their
	// version is recorded; the purge of unused imports holds it
	// exclusively, so it never removes an import being recorded.
	importMu sync.RWMutex
}

// New returns the registry over st.
func New(st *store.Store, cfg Config) *Registry {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Audit == nil {
		cfg.Audit = noAudit{}
	}
	return &Registry{cfg: cfg, st: st}
}

// SplitRef splits "name[:version]".
func SplitRef(ref string) (name, version string) {
	name, version, _ = strings.Cut(ref, ":")
	return name, version
}

// ValidName reports whether name may name a template.
func ValidName(name string) bool {
	return nameRe.MatchString(name) && !strings.HasPrefix(name, SnapshotPrefix)
}

// ValidVersion reports whether version may name a template version.
func ValidVersion(version string) bool { return versionRe.MatchString(version) }

// Resolve is the one resolution of a template reference: "name:version"
// gives that version, "name" the current version of name. An unknown
// reference gives an error wrapping ErrNotFound.
func (r *Registry) Resolve(ctx context.Context, ref string) (*store.TemplateVersion, error) {
	name, version := SplitRef(ref)
	tv, err := r.st.GetTemplateVersion(ctx, name, version)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("template %q: %w", ref, ErrNotFound)
	}
	return tv, err
}

// Visible reports whether team may use template version tv: a
// published one or one of its own.
func Visible(tv *store.TemplateVersion, team string) bool {
	return tv.Team == "" || tv.Team == team
}

// Publish makes every version of template name usable by every team.
func (r *Registry) Publish(ctx context.Context, name string) error {
	err := r.st.SetTemplateTeam(ctx, name, "")
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("template %q: %w", name, ErrNotFound)
	}
	return err
}

// RootFS returns the bottom root filesystem of ref (see Resolve).
func (r *Registry) RootFS(ctx context.Context, ref string) (string, error) {
	tv, err := r.Resolve(ctx, ref)
	if err != nil {
		return "", err
	}
	return tv.RootFS, nil
}

// List lists template versions (of name, when not "").
func (r *Registry) List(ctx context.Context, name string) ([]*store.TemplateVersion, error) {
	return r.st.ListTemplateVersions(ctx, name)
}

// CheckNew validates ref as the "name:version" of a new version for
// team ("" = a published version) and refuses one that exists (versions
// are immutable) or a name owned by someone else: template names are
// server-wide, and every version of a name belongs to one team or is
// published.
func (r *Registry) CheckNew(ctx context.Context, ref, team string) (name, version string, err error) {
	name, version = SplitRef(ref)
	if !ValidName(name) || !ValidVersion(version) {
		return "", "", invalid("give NAME:VERSION of [a-z0-9._-]")
	}
	owner, exists, err := r.st.TemplateOwner(ctx, name)
	if err != nil {
		return "", "", err
	}
	if exists && owner != team {
		return "", "", &ConflictError{Msg: fmt.Sprintf("template name %q is taken; template names are server-wide, pick another", name)}
	}
	if _, err := r.st.GetTemplateVersion(ctx, name, version); err == nil {
		return "", "", &ConflictError{Msg: fmt.Sprintf("template %s exists; templates are immutable, pick a new version", ref)}
	}
	return name, version, nil
}

// NewLayerDir creates (mode 0700) and returns the directory of a new
// version's files, DIR/<name>/<version>; it fails if it exists.
func (r *Registry) NewLayerDir(name, version string) (string, error) {
	if r.cfg.Dir == "" {
		return "", errors.New("template builds are not configured")
	}
	if !ValidName(name) || !ValidVersion(version) {
		return "", invalid("give NAME:VERSION of [a-z0-9._-]")
	}
	dir := filepath.Join(r.cfg.Dir, name, version)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return "", err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("template dir: %w", err)
	}
	return dir, nil
}

// Add records a new version and makes it current.
func (r *Registry) Add(ctx context.Context, tv *store.TemplateVersion) error {
	return r.st.InsertTemplateVersion(ctx, tv, true)
}

// Use makes name:version the version the bare name resolves to (a
// rollback, or a roll forward). Running sandboxes keep theirs.
func (r *Registry) Use(ctx context.Context, ref string) (*store.TemplateVersion, error) {
	name, version := SplitRef(ref)
	if version == "" {
		return nil, invalid("give name:version")
	}
	if err := r.st.SetCurrentTemplate(ctx, name, version); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("template %q: %w", ref, ErrNotFound)
		}
		return nil, err
	}
	r.cfg.Audit.RecordBy(ctx, "", "template.current", map[string]any{"template": ref})
	return r.Resolve(ctx, ref)
}

// Delete removes name:version when no running sandbox, snapshot or other
// template version uses it, and its files. The base template is always
// in use (by the server); the current version cannot be deleted while
// other versions exist (use another first).
func (r *Registry) Delete(ctx context.Context, ref string) error {
	name, version := SplitRef(ref)
	if version == "" {
		return invalid("give name:version")
	}
	tv, err := r.Resolve(ctx, ref)
	if err != nil {
		return err
	}
	users, err := r.st.TemplateUsers(ctx, ref)
	if err != nil {
		return err
	}
	if tv.Source == SourceBase {
		users = append(users, "the server (the built-in "+name+" template)")
	}
	if len(users) > 0 {
		return &ConflictError{Msg: fmt.Sprintf("template %s is in use by %s", ref, strings.Join(users, ", "))}
	}
	if tv.Current {
		others, _ := r.st.ListTemplateVersions(ctx, name)
		if len(others) > 1 {
			return &ConflictError{Msg: fmt.Sprintf("template %s is the current version of %s; make another version current first", ref, name)}
		}
	}
	if err := r.st.DeleteTemplateVersion(ctx, name, version); err != nil {
		return err
	}
	if r.cfg.Dir != "" && (tv.Source == SourceBuild || tv.Source == SourceSandbox) {
		dir := filepath.Join(r.cfg.Dir, name, version)
		if err := os.RemoveAll(dir); err != nil {
			r.cfg.Log.Error("remove template dir", "dir", dir, "err", err)
		}
	}
	r.cfg.Audit.RecordBy(ctx, "", "template.deleted", map[string]any{"template": ref})
	if tv.Source == SourceImport {
		r.PurgeUnusedImports(ctx)
	}
	return nil
}

// importsDir is where imported images are extracted, one directory per
// image digest.
func (r *Registry) importsDir() string { return filepath.Join(r.cfg.Dir, "imports") }

// PurgeUnusedImports removes imported images that no template version
// names any more (their last version was deleted, or an import's record
// never made it) and partial imports left by a crash. It skips the round
// when an import is running; the reaper tries again.
func (r *Registry) PurgeUnusedImports(ctx context.Context) {
	if r.cfg.Dir == "" || !r.importMu.TryLock() {
		return
	}
	defer r.importMu.Unlock()
	entries, err := os.ReadDir(r.importsDir())
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			r.cfg.Log.Error("reaper: list imports", "err", err)
		}
		return
	}
	versions, err := r.st.ListTemplateVersions(ctx, "")
	if err != nil {
		r.cfg.Log.Error("reaper: list templates", "err", err)
		return
	}
	used := map[string]bool{}
	for _, tv := range versions {
		used[filepath.Dir(tv.RootFS)] = true
	}
	for _, e := range entries {
		dir := filepath.Join(r.importsDir(), e.Name())
		partial := strings.HasPrefix(e.Name(), ".tmp-import-")
		if !e.IsDir() || used[dir] || !partial && !strings.HasPrefix(e.Name(), "import-") {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			r.cfg.Log.Error("reaper: remove import", "dir", dir, "err", err)
			continue
		}
		why := "unused"
		if partial {
			why = "partial"
		}
		r.cfg.Audit.Record("", "reaper.reclaimed", map[string]any{"what": "template import " + e.Name(), "reason": why})
	}
}

// Import imports an OCI image (docker-save tarball, OCI layout or
// registry reference) as template version name:version and makes it
// current. The image's env and working directory become the template's
// defaults; an image without the user "user" runs commands as root.
func (r *Registry) Import(ctx context.Context, ref, team string, src template.ImportSource, progress io.Writer) (*store.TemplateVersion, error) {
	name, version, err := r.CheckNew(ctx, ref, team)
	if err != nil {
		return nil, err
	}
	if r.cfg.Dir == "" {
		return nil, errors.New("template imports are not configured")
	}
	r.importMu.RLock()
	defer r.importMu.RUnlock()
	res, err := template.ImportImage(ctx, r.importsDir(), src, r.cfg.IDBase, progress)
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
	tv := &store.TemplateVersion{Name: name, Version: version, Digest: res.Digest, Source: SourceImport, Team: team,
		RootFS: filepath.Join(res.Dir, "rootfs"), SizeBytes: res.Size, BuildLog: filepath.Join(res.Dir, "build.log"),
		CreatedAt: time.Now().UTC(), Config: cfg}
	if err := r.Add(ctx, tv); err != nil {
		return nil, err
	}
	r.cfg.Audit.RecordBy(ctx, "", "template.imported", map[string]any{"template": ref, "digest": res.Digest, "bytes": res.Size, "layers": len(res.Layers)})
	return tv, nil
}
