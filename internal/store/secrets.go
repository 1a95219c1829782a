package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Secret is a credential the operator registered for the egress proxy to
// inject. Its Value is only ever read by the proxy; the API reports the
// other fields.
type Secret struct {
	// Team owns the secret: only that team's sandboxes may use it. Names
	// are per team.
	Team   string
	Name   string
	Hosts  []string
	Header string
	Value  string
	// AllowHTTP lets the proxy inject the value into plain-HTTP requests;
	// by default it injects over TLS only.
	AllowHTTP bool
	CreatedAt time.Time
	UpdatedAt time.Time
}

const secretCols = `name, hosts, header, value, allow_http, created_at, updated_at, team`

// PutSecret creates or replaces the secret called sec.Name of sec.Team
// ("" is DefaultTeam); another team's secret of that name is untouched.
func (s *Store) PutSecret(ctx context.Context, sec *Secret) error {
	hosts, _ := json.Marshal(sec.Hosts)
	now := ms(time.Now())
	sec.Team = teamOr(sec.Team)
	_, err := s.db.ExecContext(ctx, `INSERT INTO secrets (`+secretCols+`)
		VALUES (?,?,?,?,?,?,?,?)
		ON CONFLICT(team, name) DO UPDATE SET hosts=excluded.hosts, header=excluded.header, value=excluded.value,
			allow_http=excluded.allow_http, updated_at=excluded.updated_at`,
		sec.Name, string(hosts), sec.Header, sec.Value, b2i(sec.AllowHTTP), now, now, sec.Team)
	if err != nil {
		return fmt.Errorf("put secret %s: %w", sec.Name, err)
	}
	return nil
}

// GetSecret returns team's secret called name ("" is DefaultTeam).
// Another team's secret of that name is ErrNotFound, exactly as a
// missing one: a sandbox of one team can never be given another team's
// secret.
func (s *Store) GetSecret(ctx context.Context, team, name string) (*Secret, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+secretCols+` FROM secrets WHERE team=? AND name=?`, teamOr(team), name)
	sec, err := scanSecret(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("get secret %s: %w", name, err)
	}
	return sec, nil
}

// ListSecrets returns team's secrets ("" = every team's), by name.
func (s *Store) ListSecrets(ctx context.Context, team string) ([]*Secret, error) {
	q := `SELECT ` + secretCols + ` FROM secrets`
	var args []any
	if team != "" {
		q += ` WHERE team=?`
		args = append(args, team)
	}
	return queryAll(ctx, s.db, "list secrets", q+` ORDER BY name, team`, args, scanSecret)
}

// DeleteSecret removes team's secret called name ("" is DefaultTeam);
// another team's is ErrNotFound.
func (s *Store) DeleteSecret(ctx context.Context, team, name string) error {
	r, err := s.db.ExecContext(ctx, `DELETE FROM secrets WHERE team=? AND name=?`, teamOr(team), name)
	if err != nil {
		return fmt.Errorf("delete secret %s: %w", name, err)
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

func scanSecret(sc scanner) (*Secret, error) {
	var sec Secret
	var hosts string
	var created, updated int64
	if err := sc.Scan(&sec.Name, &hosts, &sec.Header, &sec.Value, &sec.AllowHTTP, &created, &updated, &sec.Team); err != nil {
		return nil, err
	}
	_ = json.Unmarshal([]byte(hosts), &sec.Hosts)
	sec.CreatedAt = time.UnixMilli(created).UTC()
	sec.UpdatedAt = time.UnixMilli(updated).UTC()
	return &sec, nil
}

// Event is one entry of the append-only event log (the audit log): what
// happened to or in a sandbox. Data is a JSON object whose fields depend on
// Kind; it is redacted before it is stored.
type Event struct {
	ID        int64     `json:"id"`
	At        time.Time `json:"time"`
	SandboxID string    `json:"sandbox"`
	TaskID    string    `json:"task"`
	// Team is the team the event belongs to: its sandbox's team when it
	// names a sandbox (the store fills it in), else the team of the key
	// that caused it; "" for server events.
	Team string `json:"team"`
	// KeyID identifies the API key that caused the event (never the key
	// itself); "" when no key did (the sandbox itself, a timer, the
	// server).
	KeyID string          `json:"key_id"`
	Kind  string          `json:"kind"`
	Data  json.RawMessage `json:"data"`
	// EndsCommand, when set, is a command's end record (see
	// Store.EndCommand) written in the transaction that appends the
	// event: the end record and the event commit together or not at all.
	EndsCommand *Command `json:"-"`
	// EndsSandbox, when set, is a sandbox's end record written in the
	// transaction that appends the event, before it: the event is stored
	// only if this end ended the record (EndsSandbox.Ended), so that of
	// several ends of one sandbox racing (an owner's TTL and another
	// control plane's kill) exactly one stores its event, and a reader
	// who sees the record ended finds that event.
	EndsSandbox *SandboxEnd `json:"-"`
}

// AppendEvent stores ev (ID and, when zero, At and TaskID are set; see
// [Store.AppendEvents]) and returns its id.
func (s *Store) AppendEvent(ctx context.Context, ev *Event) (int64, error) {
	if err := s.AppendEvents(ctx, []*Event{ev}); err != nil {
		return 0, err
	}
	return ev.ID, nil
}

// EventFilter selects events; zero fields match everything.
type EventFilter struct {
	SandboxID string
	TaskID    string
	// Team selects one team's events ("" = every team's).
	Team string
	// Kind selects a kind and its family: "egress" matches "egress" and
	// every "egress.*" kind, "egress.dns" matches "egress.dns" and
	// "egress.dns.*" (never "egress.dnsx"). A trailing ".", ".*" or "*"
	// ("egress.", "egress.*") means the same family.
	Kind  string
	Since time.Time
	Until time.Time
	// AfterID returns only events with a larger id (for following).
	AfterID int64
	// Limit caps the result (default and maximum 10000).
	Limit int
}

// ListEvents returns matching events in the order they were appended.
func (s *Store) ListEvents(ctx context.Context, f EventFilter) ([]*Event, error) {
	q := `SELECT id, at, sandbox_id, task_id, team, key_id, kind, data FROM events WHERE id > ?`
	args := []any{f.AfterID}
	if f.Team != "" {
		q += ` AND team = ?`
		args = append(args, f.Team)
	}
	if f.TaskID != "" {
		q += ` AND task_id = ?`
		args = append(args, f.TaskID)
	}
	if f.SandboxID != "" {
		q += ` AND sandbox_id = ?`
		args = append(args, f.SandboxID)
	}
	if k := KindFamily(f.Kind); k != "" {
		q += ` AND (kind = ? OR substr(kind, 1, ?) = ?)`
		args = append(args, k, len(k)+1, k+".")
	}
	if !f.Since.IsZero() {
		q += ` AND at >= ?`
		args = append(args, f.Since.UnixMicro())
	}
	if !f.Until.IsZero() {
		q += ` AND at < ?`
		args = append(args, f.Until.UnixMicro())
	}
	limit := f.Limit
	if limit <= 0 || limit > 10000 {
		limit = 10000
	}
	q += ` ORDER BY id LIMIT ?`
	args = append(args, limit)
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	defer rows.Close()
	var out []*Event
	for rows.Next() {
		var ev Event
		var at int64
		var data string
		if err := rows.Scan(&ev.ID, &at, &ev.SandboxID, &ev.TaskID, &ev.Team, &ev.KeyID, &ev.Kind, &data); err != nil {
			return nil, fmt.Errorf("list events: %w", err)
		}
		ev.At = time.UnixMicro(at).UTC()
		ev.Data = json.RawMessage(data)
		out = append(out, &ev)
	}
	return out, rows.Err()
}

// KindFamily is the family a kind filter names: f without a trailing "*"
// and then without a trailing "." ("egress.*", "egress." and "egress" all
// name "egress").
func KindFamily(f string) string {
	return strings.TrimSuffix(strings.TrimSuffix(f, "*"), ".")
}

// AppendEvents stores evs in one transaction, in order. An event of a
// sandbox gets the sandbox's team, and its task when it names none, from
// the sandbox's record (the one place where events are attributed:
// whoever records an event of a sandbox — the egress proxy, the DNS
// filter, the manager — need not know its task or team, and `corral
// audit --task` sees every event a task's sandboxes caused). ID and, when
// zero, At are set on each event.
func (s *Store) AppendEvents(ctx context.Context, evs []*Event) error {
	err := s.db.inTx(ctx, false, func(tx *tx) error { return appendEvents(ctx, tx, evs) })
	if err != nil {
		return fmt.Errorf("append events: %w", err)
	}
	return nil
}

// AppendEventsLazy is AppendEvents for a writer that need not see its
// events committed at once (the audit log's): on SQLite the batch may
// wait up to LazyCommitDelay for a write that must commit now (a
// command's start record) and share its commit (groupCommit), unless
// Hurry is called.
func (s *Store) AppendEventsLazy(ctx context.Context, evs []*Event) error {
	ctx = context.WithoutCancel(ctx)
	if err := <-s.db.queue(func(tx *tx) error { return appendEvents(ctx, tx, evs) }, true); err != nil {
		return fmt.Errorf("append events: %w", err)
	}
	return nil
}

// Hurry makes lazy writes that wait for company (AppendEventsLazy)
// commit now: a reader about to wait for them (audit.Log.Sync) calls it.
func (s *Store) Hurry() {
	if s.db.group != nil {
		s.db.group.Hurry()
	}
}

func appendEvents(ctx context.Context, tx *tx, evs []*Event) error {
	if err := tx.d.lockEvents(ctx, tx.tx); err != nil {
		return err
	}
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO events (at, sandbox_id, task_id, team, key_id, kind, data) VALUES (?,?,?,?,?,?,?) RETURNING id`)
	if err != nil {
		return err
	}
	defer stmt.Close()
	type owner struct{ task, team string }
	owners := map[string]owner{}     // sandbox id -> its task and team, for this batch
	taskTeams := map[string]string{} // task id -> its team, for this batch
	for _, ev := range evs {
		if e := ev.EndsSandbox; e != nil {
			if err := endSandbox(ctx, tx, e); err != nil {
				return err
			}
			if !e.Ended {
				ev.ID = 0
				continue // another end counted: its event stands alone
			}
		}
		if ev.SandboxID != "" {
			o, ok := owners[ev.SandboxID]
			if !ok {
				err := tx.QueryRowContext(ctx, `SELECT task_id, team FROM sandboxes WHERE id=?`, ev.SandboxID).Scan(&o.task, &o.team)
				if err != nil && !errors.Is(err, sql.ErrNoRows) {
					return fmt.Errorf("owner of sandbox %s: %w", ev.SandboxID, err)
				}
				owners[ev.SandboxID] = o
			}
			if ev.TaskID == "" {
				ev.TaskID = o.task
			}
			if o.team != "" {
				ev.Team = o.team
			}
		} else if ev.TaskID != "" {
			// A task's own event (budgets, breakers) belongs to the
			// task's team.
			team, ok := taskTeams[ev.TaskID]
			if !ok {
				err := tx.QueryRowContext(ctx, `SELECT team FROM tasks WHERE id=?`, ev.TaskID).Scan(&team)
				if err != nil && !errors.Is(err, sql.ErrNoRows) {
					return fmt.Errorf("team of task %s: %w", ev.TaskID, err)
				}
				taskTeams[ev.TaskID] = team
			}
			if team != "" {
				ev.Team = team
			}
		}
		if ev.At.IsZero() {
			ev.At = time.Now().UTC()
		}
		data := ev.Data
		if len(data) == 0 {
			data = json.RawMessage("{}")
		}
		if err := stmt.QueryRowContext(ctx, ev.At.UnixMicro(), ev.SandboxID, ev.TaskID, ev.Team, ev.KeyID, ev.Kind, string(data)).Scan(&ev.ID); err != nil {
			return fmt.Errorf("append %s event: %w", ev.Kind, err)
		}
		if ev.EndsCommand != nil {
			if err := endCommand(ctx, tx, ev.EndsCommand); err != nil {
				return fmt.Errorf("record end of command %d: %w", ev.EndsCommand.ID, err)
			}
		}
	}
	return nil
}

// LastEventID returns the id of the newest stored event (0 when there is
// none): where a follower that wants only new events starts.
func (s *Store) LastEventID(ctx context.Context) (int64, error) {
	var id sql.NullInt64
	if err := s.db.QueryRowContext(ctx, `SELECT MAX(id) FROM events`).Scan(&id); err != nil {
		return 0, fmt.Errorf("last event id: %w", err)
	}
	return id.Int64, nil
}
