package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Volume is the record of a volume: a persistent, size-capped file system
// that sandboxes mount.
type Volume struct {
	ID string
	// Team owns the volume: the team of the key that created it. Names
	// are per team.
	Team      string
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

// ErrVolumeExists: the team has a volume of that name.
var ErrVolumeExists = errors.New("a volume of that name exists")

// ErrAmbiguous: a name looked up in every team's records (an admin's
// ?team=all) names records of several teams.
var ErrAmbiguous = errors.New("the name is used by several teams")

const volumeCols = `id, name, size_mb, token, created_at, team`

// InsertVolume records a new volume of v.Team ("" is DefaultTeam).
func (s *Store) InsertVolume(ctx context.Context, v *Volume) error {
	v.Team = teamOr(v.Team)
	_, err := s.db.ExecContext(ctx, `INSERT INTO volumes (`+volumeCols+`) VALUES (?,?,?,?,?,?)`,
		v.ID, v.Name, v.SizeMB, v.Token, ms(v.CreatedAt), v.Team)
	if err != nil && s.db.d.isUnique(err) {
		return ErrVolumeExists
	}
	if err != nil {
		return fmt.Errorf("insert volume %s: %w", v.Name, err)
	}
	return nil
}

// GetVolume returns team's volume whose id or name is ref (an id wins
// over a name). Another team's volume is ErrNotFound, exactly as a
// missing one: a lookup never says that a name or id exists elsewhere.
// team "" looks in every team (an admin's ?team=all): an id matches in
// any team, a name only when one team has it (ErrAmbiguous otherwise).
func (s *Store) GetVolume(ctx context.Context, team, ref string) (*Volume, error) {
	q := `SELECT ` + volumeCols + ` FROM volumes WHERE (id=? OR name=?)`
	args := []any{ref, ref}
	if team != "" {
		q += ` AND team=?`
		args = append(args, team)
	}
	vs, err := queryAll(ctx, s.db, "get volume "+ref, q+` ORDER BY id=? DESC LIMIT 2`, append(args, ref), scanVolume)
	switch {
	case err != nil:
		return nil, err
	case len(vs) == 0:
		return nil, ErrNotFound
	case len(vs) > 1 && vs[0].ID != ref:
		return nil, ErrAmbiguous
	}
	return vs[0], nil
}

// ListVolumes returns team's volumes ("" = every team's), oldest first.
func (s *Store) ListVolumes(ctx context.Context, team string) ([]*Volume, error) {
	q := `SELECT ` + volumeCols + ` FROM volumes`
	var args []any
	if team != "" {
		q += ` WHERE team=?`
		args = append(args, team)
	}
	return queryAll(ctx, s.db, "list volumes", q+` ORDER BY created_at, id`, args, scanVolume)
}

// CountVolumes counts every team's volumes (the server's limit).
func (s *Store) CountVolumes(ctx context.Context) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM volumes`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count volumes: %w", err)
	}
	return n, nil
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
// The mounts are JSON in the sandbox record and matched here, not in SQL
// (the two databases' JSON functions differ); only live sandboxes are
// read.
func (s *Store) VolumeUsers(ctx context.Context, id string) ([]string, error) {
	type mounts struct {
		id   string
		vols []VolumeMount
	}
	live, err := queryAll(ctx, s.db, "volume users", `SELECT id, volumes FROM sandboxes WHERE state<>'ended' ORDER BY id`, nil,
		func(sc scanner) (mounts, error) {
			var m mounts
			var vols string
			if err := sc.Scan(&m.id, &vols); err != nil {
				return m, err
			}
			if err := json.Unmarshal([]byte(vols), &m.vols); err != nil {
				return m, fmt.Errorf("volumes of sandbox %s: %w", m.id, err)
			}
			return m, nil
		})
	if err != nil {
		return nil, err
	}
	var users []string
	for _, m := range live {
		if slices.ContainsFunc(m.vols, func(v VolumeMount) bool { return v.ID == id }) {
			users = append(users, m.id)
		}
	}
	return users, nil
}

func scanVolume(sc scanner) (*Volume, error) {
	var v Volume
	var created int64
	if err := sc.Scan(&v.ID, &v.Name, &v.SizeMB, &v.Token, &created, &v.Team); err != nil {
		return nil, err
	}
	v.CreatedAt = time.UnixMilli(created).UTC()
	return &v, nil
}
