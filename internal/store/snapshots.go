package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Snapshot is a saved writable layer of a sandbox: a new sandbox started
// from it sees the template with every layer of the chain on top.
type Snapshot struct {
	ID string
	// Team owns the snapshot: the team of the key that took it.
	Team      string
	Name      string
	SandboxID string // the sandbox it was taken from
	Template  string // the template at the bottom of the chain
	Parent    string // the snapshot the sandbox was started from, or ""
	// Layers are the layer directories, top-most first (this snapshot's
	// own layer, then its parent's chain).
	Layers    []string
	SizeBytes int64 // this snapshot's own layer
	CreatedAt time.Time
}

const snapshotCols = `id, name, sandbox_id, template, parent, layers, size_bytes, created_at, team`

// InsertSnapshot records a snapshot.
func (s *Store) InsertSnapshot(ctx context.Context, sn *Snapshot) error {
	l, _ := json.Marshal(sn.Layers)
	_, err := s.db.ExecContext(ctx, `INSERT INTO snapshots (`+snapshotCols+`) VALUES (?,?,?,?,?,?,?,?,?)`,
		sn.ID, sn.Name, sn.SandboxID, sn.Template, sn.Parent, string(l), sn.SizeBytes, ms(sn.CreatedAt), teamOr(sn.Team))
	if err != nil {
		return fmt.Errorf("insert snapshot %s: %w", sn.ID, err)
	}
	return nil
}

// GetSnapshot returns the snapshot id (not one marked deleted).
func (s *Store) GetSnapshot(ctx context.Context, id string) (*Snapshot, error) {
	return s.getSnapshot(ctx, id, false)
}

// GetSnapshotAny returns the snapshot id even when it is marked deleted
// (it may still be the parent of a live chain).
func (s *Store) GetSnapshotAny(ctx context.Context, id string) (*Snapshot, error) {
	return s.getSnapshot(ctx, id, true)
}

func (s *Store) getSnapshot(ctx context.Context, id string, any bool) (*Snapshot, error) {
	q := `SELECT ` + snapshotCols + ` FROM snapshots WHERE id=?`
	if !any {
		q += ` AND deleted=0`
	}
	sn, err := scanSnapshot(s.db.QueryRowContext(ctx, q, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("get snapshot %s: %w", id, err)
	}
	return sn, nil
}

// SnapshotFilter selects snapshots; zero fields match everything.
type SnapshotFilter struct {
	// Team selects one team's snapshots ("" = every team's).
	Team string
	// SandboxID selects the snapshots taken of one sandbox.
	SandboxID string
	// Name selects snapshots of one name.
	Name string
}

// ListSnapshots returns the snapshots f selects (not those marked
// deleted), newest first.
func (s *Store) ListSnapshots(ctx context.Context, f SnapshotFilter) ([]*Snapshot, error) {
	q := `SELECT ` + snapshotCols + ` FROM snapshots WHERE deleted=0`
	var args []any
	if f.Team != "" {
		q += ` AND team=?`
		args = append(args, f.Team)
	}
	if f.SandboxID != "" {
		q += ` AND sandbox_id=?`
		args = append(args, f.SandboxID)
	}
	if f.Name != "" {
		q += ` AND name=?`
		args = append(args, f.Name)
	}
	return queryAll(ctx, s.db, "list snapshots", q+` ORDER BY created_at DESC, id`, args, scanSnapshot)
}

// SnapshotUsers returns what still needs snapshot id: running or paused
// sandboxes started from it and snapshots whose chain contains it.
func (s *Store) SnapshotUsers(ctx context.Context, id string) (sandboxes, snapshots []string, err error) {
	sandboxes, err = queryAll(ctx, s.db, "snapshot users", `SELECT id FROM sandboxes WHERE (snapshot=? OR persisted=?) AND state<>?`,
		[]any{id, id, StateEnded}, scanString)
	if err != nil {
		return nil, nil, err
	}
	snapshots, err = queryAll(ctx, s.db, "snapshot users", `SELECT id FROM snapshots WHERE parent=?`, []any{id}, scanString)
	return sandboxes, snapshots, err
}

// MarkSnapshotDeleted hides snapshot id (no new sandbox can start from
// it) while something still uses it; the reaper removes it later.
func (s *Store) MarkSnapshotDeleted(ctx context.Context, id string) error {
	r, err := s.db.ExecContext(ctx, `UPDATE snapshots SET deleted=1 WHERE id=? AND deleted=0`, id)
	if err != nil {
		return fmt.Errorf("mark snapshot %s deleted: %w", id, err)
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// DeletedSnapshots returns the ids of snapshots marked deleted.
func (s *Store) DeletedSnapshots(ctx context.Context) ([]string, error) {
	return queryAll(ctx, s.db, "deleted snapshots", `SELECT id FROM snapshots WHERE deleted=1`, nil, scanString)
}

// DeleteSnapshot removes the record of snapshot id.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	r, err := s.db.ExecContext(ctx, `DELETE FROM snapshots WHERE id=?`, id)
	if err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

func scanSnapshot(sc scanner) (*Snapshot, error) {
	var sn Snapshot
	var l string
	var created int64
	if err := sc.Scan(&sn.ID, &sn.Name, &sn.SandboxID, &sn.Template, &sn.Parent, &l, &sn.SizeBytes, &created, &sn.Team); err != nil {
		return nil, err
	}
	_ = json.Unmarshal([]byte(l), &sn.Layers)
	sn.CreatedAt = time.UnixMilli(created).UTC()
	return &sn, nil
}
