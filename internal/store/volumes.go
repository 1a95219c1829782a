package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Volume is the record of a volume: a persistent, size-capped file system
// that sandboxes mount.
type Volume struct {
	ID        string
	Name      string
	SizeMB    int64
	Token     string // bearer token of its content API
	CreatedAt time.Time
}

// VolumeMount is a volume mounted in a sandbox.
type VolumeMount struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	Path string `json:"path"`
}

// ErrVolumeExists: a volume of that name exists.
var ErrVolumeExists = errors.New("a volume of that name exists")

const volumeCols = `id, name, size_mb, token, created_at`

// InsertVolume records a new volume.
func (s *Store) InsertVolume(ctx context.Context, v *Volume) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO volumes (`+volumeCols+`) VALUES (?,?,?,?,?)`,
		v.ID, v.Name, v.SizeMB, v.Token, ms(v.CreatedAt))
	if err != nil && strings.Contains(err.Error(), "UNIQUE") {
		return ErrVolumeExists
	}
	if err != nil {
		return fmt.Errorf("insert volume %s: %w", v.Name, err)
	}
	return nil
}

// GetVolume returns the volume whose id or name is ref.
func (s *Store) GetVolume(ctx context.Context, ref string) (*Volume, error) {
	v, err := scanVolume(s.db.QueryRowContext(ctx, `SELECT `+volumeCols+` FROM volumes WHERE id=? OR name=? ORDER BY id=? DESC LIMIT 1`, ref, ref, ref))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("get volume %s: %w", ref, err)
	}
	return v, nil
}

// ListVolumes returns every volume, oldest first.
func (s *Store) ListVolumes(ctx context.Context) ([]*Volume, error) {
	return queryAll(ctx, s.db, "list volumes", `SELECT `+volumeCols+` FROM volumes ORDER BY created_at, id`, nil, scanVolume)
}

// DeleteVolume removes the record of volume id.
func (s *Store) DeleteVolume(ctx context.Context, id string) error {
	r, err := s.db.ExecContext(ctx, `DELETE FROM volumes WHERE id=?`, id)
	if err != nil {
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// VolumeUsers returns the sandboxes that have not ended and mount volume id.
func (s *Store) VolumeUsers(ctx context.Context, id string) ([]string, error) {
	return queryAll(ctx, s.db, "volume users",
		`SELECT sandboxes.id FROM sandboxes, json_each(sandboxes.volumes) AS v
		 WHERE sandboxes.state<>'ended' AND json_extract(v.value, '$.id')=? ORDER BY sandboxes.id`, []any{id}, scanString)
}

func scanVolume(sc scanner) (*Volume, error) {
	var v Volume
	var created int64
	if err := sc.Scan(&v.ID, &v.Name, &v.SizeMB, &v.Token, &created); err != nil {
		return nil, err
	}
	v.CreatedAt = time.UnixMilli(created).UTC()
	return &v, nil
}
