package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// pruneBatch is the most rows one retention transaction deletes, so that
// the audit writer and the API (one database connection) wait at most
// for one batch.
const pruneBatch = 5000

// appendOnlyDelete (SQLite's form; PostgreSQL's is postgresDialect's
// appendOnly) makes the event log append-only except for retention:
// a delete is refused unless the event's id is at most the bound that
// [Store.DeleteEventsThrough] writes into events_prune inside its own
// transaction (and removes before it commits). So nothing — a bug, a
// stray statement — deletes events other than the oldest ones, in order,
// by the retention policy. It replaces the older unconditional trigger.
const appendOnlyDelete = `
CREATE TABLE IF NOT EXISTS events_prune (upto INTEGER NOT NULL);
DROP TRIGGER IF EXISTS events_append_only_delete;
CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
WHEN OLD.id > (SELECT COALESCE(MAX(upto), 0) FROM events_prune)
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
`

// EventsBeyond returns the id of the newest event that is older than
// before (zero: no age bound) or that is not among the keep newest
// events (keep <= 0: no size bound), so that deleting every event up to
// it leaves the log within both bounds; 0 means nothing is beyond.
func (s *Store) EventsBeyond(ctx context.Context, before time.Time, keep int64) (int64, error) {
	var cut int64
	if !before.IsZero() {
		var id sql.NullInt64
		if err := s.db.QueryRowContext(ctx, `SELECT MAX(id) FROM events WHERE at < ?`, before.UnixMicro()).Scan(&id); err != nil {
			return 0, fmt.Errorf("events beyond retention: %w", err)
		}
		cut = id.Int64
	}
	if keep > 0 {
		var id int64
		err := s.db.QueryRowContext(ctx, `SELECT id FROM events ORDER BY id DESC LIMIT 1 OFFSET ?`, keep).Scan(&id)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return 0, fmt.Errorf("events beyond retention: %w", err)
		}
		cut = max(cut, id)
	}
	return cut, nil
}

// DeleteEventsThrough deletes every event with an id up to upto, oldest
// first, in transactions of at most pruneBatch events, and returns how
// many it deleted. It is the only way events are deleted (see
// appendOnlyDelete); export them first.
func (s *Store) DeleteEventsThrough(ctx context.Context, upto int64) (int64, error) {
	var total int64
	for {
		n, err := s.deleteEventsBatch(ctx, upto)
		total += n
		if err != nil || n < pruneBatch {
			return total, err
		}
	}
}

func (s *Store) deleteEventsBatch(ctx context.Context, upto int64) (int64, error) {
	var n int64
	err := s.db.inTx(ctx, false, func(tx *tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO events_prune (upto) VALUES (?)`, upto); err != nil {
			return err
		}
		r, err := tx.ExecContext(ctx, `DELETE FROM events WHERE id IN (SELECT id FROM events WHERE id <= ? ORDER BY id LIMIT ?)`, upto, pruneBatch)
		if err != nil {
			return err
		}
		n, _ = r.RowsAffected()
		_, err = tx.ExecContext(ctx, `DELETE FROM events_prune`)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("delete events: %w", err)
	}
	return n, nil
}

// CountEvents returns how many events the log holds.
func (s *Store) CountEvents(ctx context.Context) (int64, error) {
	var n int64
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM events`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count events: %w", err)
	}
	return n, nil
}

// PruneCommands deletes the records of ended commands that ended before
// before (zero: no age bound) or that are not among the keep newest
// command records (keep <= 0: no size bound), oldest first, and returns
// how many it deleted. Commands still running are kept. Each command is
// also a "command" audit event, which the event retention archives.
func (s *Store) PruneCommands(ctx context.Context, before time.Time, keep int64) (int64, error) {
	var cut int64
	if keep > 0 {
		err := s.db.QueryRowContext(ctx, `SELECT id FROM commands ORDER BY id DESC LIMIT 1 OFFSET ?`, keep).Scan(&cut)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return 0, fmt.Errorf("prune commands: %w", err)
		}
	}
	var beforeMS int64
	if !before.IsZero() {
		beforeMS = ms(before)
	}
	if cut == 0 && beforeMS == 0 {
		return 0, nil
	}
	var total int64
	for {
		r, err := s.db.ExecContext(ctx, `DELETE FROM commands WHERE id IN (SELECT id FROM commands
			WHERE ended_at IS NOT NULL AND ended_at > 0 AND (id <= ? OR ended_at < ?) ORDER BY id LIMIT ?)`, cut, beforeMS, pruneBatch)
		if err != nil {
			return total, fmt.Errorf("prune commands: %w", err)
		}
		n, _ := r.RowsAffected()
		total += n
		if n < pruneBatch {
			return total, nil
		}
	}
}
