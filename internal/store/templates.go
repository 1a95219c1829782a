package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// TemplateConfig are the defaults a template gives its sandboxes.
type TemplateConfig struct {
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
	User    string            `json:"user,omitempty"`
	Start   string            `json:"start,omitempty"` // a command started in the background at create
	Runtime string            `json:"runtime,omitempty"`
	Tier    string            `json:"tier,omitempty"`
}

// TemplateVersion is one immutable version of a template.
type TemplateVersion struct {
	Name    string
	Version string
	Digest  string // content digest ("sha256:...")
	Parent  string // "name:version" it was built on, or ""
	Source  string // debootstrap, build, import
	RootFS  string // the bottom root filesystem directory
	// Layers are directories stacked on RootFS, top-most first.
	Layers    []string
	Config    TemplateConfig
	SizeBytes int64
	BuildLog  string // path of the build log, if any
	CreatedAt time.Time
	Current   bool // the version the bare name resolves to
	// Team is the one team that may use a private template; "" is a
	// template published for every team.
	Team string
}

// Ref is "name:version".
func (t *TemplateVersion) Ref() string { return t.Name + ":" + t.Version }

const templateCols = `name, version, digest, parent, source, rootfs, layers, config, size_bytes, build_log, created_at, current, team`

// InsertTemplateVersion records a new version; with makeCurrent it becomes
// the one the bare name resolves to.
func (s *Store) InsertTemplateVersion(ctx context.Context, t *TemplateVersion, makeCurrent bool) error {
	l, _ := json.Marshal(t.Layers)
	c, _ := json.Marshal(t.Config)
	// Serializable: of two versions made current at once, one is.
	err := s.db.inTx(ctx, true, func(tx *tx) error {
		if makeCurrent {
			if _, err := tx.ExecContext(ctx, `UPDATE template_versions SET current=0 WHERE name=?`, t.Name); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO template_versions (`+templateCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)`,
			t.Name, t.Version, t.Digest, t.Parent, t.Source, t.RootFS, string(l), string(c), t.SizeBytes, t.BuildLog, ms(t.CreatedAt), b2i(makeCurrent), t.Team)
		return err
	})
	if err != nil {
		return fmt.Errorf("insert template %s: %w", t.Ref(), err)
	}
	t.Current = makeCurrent
	return nil
}

// GetTemplateVersion returns name:version, or the current version of name
// when version is "".
func (s *Store) GetTemplateVersion(ctx context.Context, name, version string) (*TemplateVersion, error) {
	var row *sql.Row
	if version == "" {
		row = s.db.QueryRowContext(ctx, `SELECT `+templateCols+` FROM template_versions WHERE name=? AND current=1`, name)
	} else {
		row = s.db.QueryRowContext(ctx, `SELECT `+templateCols+` FROM template_versions WHERE name=? AND version=?`, name, version)
	}
	t, err := scanTemplate(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("get template %s:%s: %w", name, version, err)
	}
	return t, nil
}

// ListTemplateVersions returns every version (of name, when not ""),
// by name then newest first.
func (s *Store) ListTemplateVersions(ctx context.Context, name string) ([]*TemplateVersion, error) {
	q := `SELECT ` + templateCols + ` FROM template_versions`
	var args []any
	if name != "" {
		q += ` WHERE name=?`
		args = append(args, name)
	}
	return queryAll(ctx, s.db, "list templates", q+` ORDER BY name, created_at DESC, version`, args, scanTemplate)
}

// SetCurrentTemplate makes name:version the current version (rollback).
func (s *Store) SetCurrentTemplate(ctx context.Context, name, version string) error {
	return s.db.inTx(ctx, true, func(tx *tx) error {
		r, err := tx.ExecContext(ctx, `UPDATE template_versions SET current=1 WHERE name=? AND version=?`, name, version)
		if err != nil {
			return err
		}
		if n, _ := r.RowsAffected(); n == 0 {
			return ErrNotFound
		}
		_, err = tx.ExecContext(ctx, `UPDATE template_versions SET current=0 WHERE name=? AND version<>?`, name, version)
		return err
	})
}

// TemplateUsers returns the live sandboxes, snapshots and template
// versions that use name:version.
func (s *Store) TemplateUsers(ctx context.Context, ref string) ([]string, error) {
	var users []string
	q := []struct{ sql, prefix string }{
		{`SELECT id FROM sandboxes WHERE template_version=? AND state<>'ended'`, "sandbox "},
		{`SELECT id FROM snapshots WHERE template=? AND deleted=0`, "snapshot "},
		{`SELECT name || ':' || version FROM template_versions WHERE parent=?`, "template "},
	}
	for _, x := range q {
		ids, err := queryAll(ctx, s.db, "template users", x.sql, []any{ref}, scanString)
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			users = append(users, x.prefix+id)
		}
	}
	return users, nil
}

// DeleteTemplateVersion removes the record of name:version.
func (s *Store) DeleteTemplateVersion(ctx context.Context, name, version string) error {
	r, err := s.db.ExecContext(ctx, `DELETE FROM template_versions WHERE name=? AND version=?`, name, version)
	if err != nil {
		return fmt.Errorf("delete template %s:%s: %w", name, version, err)
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

func scanTemplate(sc scanner) (*TemplateVersion, error) {
	var t TemplateVersion
	var l, c string
	var created int64
	if err := sc.Scan(&t.Name, &t.Version, &t.Digest, &t.Parent, &t.Source, &t.RootFS, &l, &c, &t.SizeBytes, &t.BuildLog, &created, &t.Current, &t.Team); err != nil {
		return nil, err
	}
	_ = json.Unmarshal([]byte(l), &t.Layers)
	_ = json.Unmarshal([]byte(c), &t.Config)
	t.CreatedAt = time.UnixMilli(created).UTC()
	return &t, nil
}

// TemplateOwner returns the team that owns template name ("" when it is
// published for every team) and whether any version of it exists. Every
// version of a name has the same owner.
func (s *Store) TemplateOwner(ctx context.Context, name string) (team string, exists bool, err error) {
	err = s.db.QueryRowContext(ctx, `SELECT team FROM template_versions WHERE name=? ORDER BY created_at LIMIT 1`, name).Scan(&team)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("owner of template %s: %w", name, err)
	}
	return team, true, nil
}

// SetTemplateTeam gives every version of template name to team ("" =
// published for every team).
func (s *Store) SetTemplateTeam(ctx context.Context, name, team string) error {
	r, err := s.db.ExecContext(ctx, `UPDATE template_versions SET team=? WHERE name=?`, team, name)
	if err != nil {
		return fmt.Errorf("set team of template %s: %w", name, err)
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}
