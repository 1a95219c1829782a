// Package store keeps corral's records: sandboxes, commands, API keys,
// brokered secrets and the append-only event log. Records outlive the
// sandboxes they describe. The database is SQLite by default (pure Go,
// WAL mode, synchronous=FULL so a committed record survives a crash) or
// PostgreSQL, which several control planes can share (see dialect.go and
// docs/configuration.md, "Store").
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
	_ "modernc.org/sqlite"             // registers the "sqlite" driver
)

// ErrNotFound is returned when no record matches.
var ErrNotFound = errors.New("record not found")

// DefaultTeam is the team of the admin key made on first start, and of
// every record made before corral had teams.
const DefaultTeam = "default"

// Store is an open corral database.
type Store struct {
	db *db
}

const schema = `
CREATE TABLE IF NOT EXISTS sandboxes (
	id TEXT PRIMARY KEY,
	template TEXT NOT NULL,
	runtime TEXT NOT NULL,
	tier TEXT NOT NULL,
	resources TEXT NOT NULL,
	command_timeout_ms INTEGER NOT NULL,
	network TEXT NOT NULL,
	metadata TEXT NOT NULL,
	state TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	expires_at INTEGER NOT NULL,
	ended_at INTEGER,
	end_reason TEXT NOT NULL DEFAULT '',
	error TEXT NOT NULL DEFAULT '',
	access_token TEXT NOT NULL DEFAULT '',
	egress TEXT NOT NULL DEFAULT '{}',
	task_id TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS sandboxes_state ON sandboxes(state, created_at);
CREATE TABLE IF NOT EXISTS commands (
	id INTEGER PRIMARY KEY AUTOINCREMENT,
	sandbox_id TEXT NOT NULL,
	started_at INTEGER NOT NULL,
	ended_at INTEGER,
	command TEXT NOT NULL,
	cwd TEXT NOT NULL,
	"user" TEXT NOT NULL,
	exit_code INTEGER,
	stdout_bytes INTEGER NOT NULL DEFAULT 0,
	stderr_bytes INTEGER NOT NULL DEFAULT 0,
	timed_out INTEGER NOT NULL DEFAULT 0,
	end_reason TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS commands_sandbox ON commands(sandbox_id, id);
CREATE TABLE IF NOT EXISTS tasks (
	id TEXT PRIMARY KEY,
	agent TEXT NOT NULL,
	implicit INTEGER NOT NULL DEFAULT 0,
	state TEXT NOT NULL,
	budgets TEXT NOT NULL,
	usage TEXT NOT NULL,
	breaker TEXT NOT NULL DEFAULT '{}',
	on_trip TEXT NOT NULL DEFAULT 'kill',
	artifacts TEXT NOT NULL DEFAULT '[]',
	created_at INTEGER NOT NULL,
	ended_at INTEGER
);
CREATE TABLE IF NOT EXISTS snapshots (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL DEFAULT '',
	sandbox_id TEXT NOT NULL,
	template TEXT NOT NULL,
	parent TEXT NOT NULL DEFAULT '',
	layers TEXT NOT NULL,
	size_bytes INTEGER NOT NULL,
	created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS template_versions (
	name TEXT NOT NULL,
	version TEXT NOT NULL,
	digest TEXT NOT NULL,
	parent TEXT NOT NULL DEFAULT '',
	source TEXT NOT NULL,
	rootfs TEXT NOT NULL,
	layers TEXT NOT NULL DEFAULT '[]',
	config TEXT NOT NULL DEFAULT '{}',
	size_bytes INTEGER NOT NULL,
	build_log TEXT NOT NULL DEFAULT '',
	created_at INTEGER NOT NULL,
	current INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (name, version)
);
CREATE TABLE IF NOT EXISTS events (
	id INTEGER PRIMARY KEY AUTOINCREMENT,
	at INTEGER NOT NULL,
	sandbox_id TEXT NOT NULL,
	task_id TEXT NOT NULL DEFAULT '',
	kind TEXT NOT NULL,
	data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_sandbox ON events(sandbox_id, id);
CREATE INDEX IF NOT EXISTS events_kind ON events(kind, id);
CREATE TABLE IF NOT EXISTS api_keys (
	hash TEXT PRIMARY KEY,
	name TEXT NOT NULL,
	created_at INTEGER NOT NULL
);
`

// IsPostgres reports whether a store address names a PostgreSQL
// database (a postgres:// or postgresql:// URL) rather than a SQLite
// file.
func IsPostgres(addr string) bool {
	return strings.HasPrefix(addr, "postgres://") || strings.HasPrefix(addr, "postgresql://")
}

// Open opens (creating and migrating if needed) the store at addr: a
// PostgreSQL URL (see IsPostgres) or the path of a SQLite file.
func Open(addr string) (*Store, error) {
	if IsPostgres(addr) {
		return openPostgres(addr)
	}
	return openSQLite(addr)
}

func openSQLite(path string) (*Store, error) {
	// The database holds brokered secret values and access tokens: only
	// root may read it. SQLite gives its -wal and -shm files the database
	// file's mode.
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	f.Close()
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("open store: %w", err)
		}
	}
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)"
	sdb, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	sdb.SetMaxOpenConns(1) // one writer; SQLite serialises anyway
	st, err := openDB(sdb, sqliteDialect{})
	if err != nil {
		return nil, err
	}
	// Readers of a WAL database do not wait for its writer: reads
	// outside a transaction get read-only connections of their own, so
	// that an API key lookup never queues behind the audit writer's
	// commit. A reader sees every transaction committed before its query
	// began.
	rdb, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=query_only(1)")
	if err != nil {
		sdb.Close()
		return nil, fmt.Errorf("open store: %w", err)
	}
	rdb.SetMaxOpenConns(SQLiteReadConns)
	rdb.SetMaxIdleConns(SQLiteReadConns)
	st.db.read = rdb
	st.db.wstmts, st.db.rstmts = newStmtCache(sdb), newStmtCache(rdb)
	st.db.group = newGroupCommit(st.db)
	return st, nil
}

// SQLiteReadConns bounds a SQLite store's read-only connections (besides
// its one writer).
const SQLiteReadConns = 4

// Pool bounds of a PostgreSQL store's connections (per control plane).
const (
	PostgresMaxConns     = 16
	PostgresMaxIdleConns = 4
)

func openPostgres(url string) (*Store, error) {
	sdb, err := sql.Open("pgx", url)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	sdb.SetMaxOpenConns(PostgresMaxConns)
	sdb.SetMaxIdleConns(PostgresMaxIdleConns)
	sdb.SetConnMaxIdleTime(5 * time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sdb.PingContext(ctx); err != nil {
		sdb.Close()
		return nil, fmt.Errorf("open store: %w", err)
	}
	return openDB(sdb, postgresDialect{})
}

func openDB(sdb *sql.DB, d dialect) (*Store, error) {
	if err := migrate(context.Background(), sdb, d); err != nil {
		sdb.Close()
		return nil, fmt.Errorf("migrate store: %w", err)
	}
	return &Store{db: &db{sql: sdb, d: d}}, nil
}

// Backend is "sqlite" or "postgres".
func (s *Store) Backend() string { return s.db.d.name() }

// migrate brings a database to the current layout in one transaction
// (a crash leaves the old layout or the new one, never half of one),
// under the dialect's migration lock (two control planes starting at
// once on one PostgreSQL database migrate one after the other). Every
// step is idempotent: tables and indexes are created if missing, columns
// added since a table was released are added if missing, older layouts
// are rebuilt.
func migrate(ctx context.Context, sdb *sql.DB, d dialect) error {
	t, err := sdb.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer t.Rollback()
	if err := d.lockMigration(ctx, t); err != nil {
		return err
	}
	if _, err := t.ExecContext(ctx, d.ddl(schema+teamTablesSchema()+teamQuotasSchema)); err != nil {
		return err
	}
	for _, c := range addedColumns {
		if err := d.addColumn(ctx, t, c.table, c.column, d.ddl(c.def)); err != nil {
			return fmt.Errorf("add %s.%s: %w", c.table, c.column, err)
		}
	}
	if err := d.upgradeLegacy(ctx, t); err != nil {
		return err
	}
	if _, err := t.ExecContext(ctx, d.ddl(`CREATE INDEX IF NOT EXISTS events_task ON events(task_id, id);`+usageSchema)); err != nil {
		return err
	}
	if _, err := t.ExecContext(ctx, d.appendOnly()); err != nil {
		return err
	}
	return t.Commit()
}

// addedColumns are columns added after a table was first released; a
// database made by an older corral gets them on open.
var addedColumns = []struct{ table, column, def string }{
	{"sandboxes", "access_token", "TEXT NOT NULL DEFAULT ''"},
	{"sandboxes", "egress", "TEXT NOT NULL DEFAULT '{}'"},
	{"events", "task_id", "TEXT NOT NULL DEFAULT ''"},
	{"sandboxes", "task_id", "TEXT NOT NULL DEFAULT ''"},
	{"sandboxes", "snapshot", "TEXT NOT NULL DEFAULT ''"},
	{"snapshots", "deleted", "INTEGER NOT NULL DEFAULT 0"},
	{"sandboxes", "template_version", "TEXT NOT NULL DEFAULT ''"},
	{"sandboxes", "env", "TEXT NOT NULL DEFAULT '{}'"},
	{"sandboxes", "persisted", "TEXT NOT NULL DEFAULT ''"},
	{"sandboxes", "lifecycle", "TEXT NOT NULL DEFAULT '{}'"},
	{"sandboxes", "volumes", "TEXT NOT NULL DEFAULT '[]'"},
	{"secrets", "allow_http", "INTEGER NOT NULL DEFAULT 0"},
	{"sandboxes", "traffic_token", "TEXT NOT NULL DEFAULT ''"},
	{"sandboxes", "team", "TEXT NOT NULL DEFAULT 'default'"},
	{"tasks", "team", "TEXT NOT NULL DEFAULT 'default'"},
	{"snapshots", "team", "TEXT NOT NULL DEFAULT 'default'"},
	{"events", "team", "TEXT NOT NULL DEFAULT ''"},
	{"events", "key_id", "TEXT NOT NULL DEFAULT ''"},
	{"template_versions", "team", "TEXT NOT NULL DEFAULT ''"},
	{"api_keys", "team", "TEXT NOT NULL DEFAULT 'default'"},
	{"api_keys", "role", "TEXT NOT NULL DEFAULT 'admin'"},
	{"api_keys", "revoked_at", "INTEGER"},
	// The control plane (node) that runs the sandbox; '' in rows made
	// before it, which AssignUnowned gives to the first node to start.
	{"sandboxes", "node", "TEXT NOT NULL DEFAULT ''"},
}

// Close closes the database.
func (s *Store) Close() error { return s.db.close() }

// Resources are a sandbox's recorded limits.
type Resources struct {
	CPU      float64 `json:"cpu"`
	MemoryMB int64   `json:"memory_mb"`
	DiskMB   int64   `json:"disk_mb"`
	Pids     int64   `json:"pids"`
	Nofile   int64   `json:"nofile"`
}

// Sandbox states.
const (
	StateRunning = "running"
	StatePaused  = "paused"
	StateEnded   = "ended"
)

// Sandbox is the record of one sandbox.
type Sandbox struct {
	ID string
	// Team owns the sandbox: the team of the key that created it.
	Team           string
	Template       string
	Runtime        string
	Tier           string
	Resources      Resources
	CommandTimeout time.Duration
	Network        string
	Metadata       map[string]string
	State          string
	CreatedAt      time.Time
	ExpiresAt      time.Time
	EndedAt        *time.Time
	EndReason      string
	Error          string
	// AccessToken authenticates the control plane to the sandbox's agent.
	// It is never returned by the API.
	AccessToken string
	// TrafficToken, when set, makes the sandbox's ports private: a
	// request to one must carry it (E2B's traffic access token). "" is
	// a sandbox with public ports.
	TrafficToken string
	// Egress is the rest of the network policy (Network holds its mode).
	Egress Egress
	// TaskID is the task (agent session) the sandbox belongs to.
	TaskID string
	// Snapshot is the snapshot the sandbox was started from ("" = the
	// template itself).
	Snapshot string
	// TemplateVersion is the exact template version ("name:version") the
	// sandbox runs; a later build of the name does not change it.
	TemplateVersion string
	// Env are the env vars given at create (kept to restart a persisted
	// sandbox and for forks; never returned by the API).
	Env map[string]string
	// Persisted is the snapshot a persisted pause saved the sandbox to
	// (its processes are stopped); "" otherwise.
	Persisted string
	// Lifecycle says what happens at the end of the TTL.
	Lifecycle Lifecycle
	// Volumes are the volumes mounted in the sandbox.
	Volumes []VolumeMount
	// Node is the control plane that runs the sandbox (its --node-id):
	// the one that may adopt it at start and that holds its TTL timer
	// and its agent connections.
	Node string
	// Warnings are returned by create and recorded in the audit log; they
	// are not stored with the record.
	Warnings []string
}

// Lifecycle is what happens when a sandbox's TTL ends.
type Lifecycle struct {
	// AutoPause pauses the sandbox instead of killing it.
	AutoPause bool `json:"auto_pause,omitempty"`
	// PauseMemory keeps processes and memory (cgroup freezer); false
	// persists the files and stops the processes.
	PauseMemory bool `json:"pause_memory,omitempty"`
}

// Egress is the recorded detail of a sandbox's network policy.
type Egress struct {
	// Allow lists domain patterns and CIDR:port rules.
	Allow []string `json:"allow,omitempty"`
	// Secrets names the brokered secrets the sandbox may use.
	Secrets []string `json:"secrets,omitempty"`
}

func ms(t time.Time) int64 { return t.UnixMilli() }

// InsertSandbox records a new sandbox.
func (s *Store) InsertSandbox(ctx context.Context, sb *Sandbox) error {
	res, _ := json.Marshal(sb.Resources)
	meta, _ := json.Marshal(orEmpty(sb.Metadata))
	eg, _ := json.Marshal(sb.Egress)
	envJSON, _ := json.Marshal(orEmpty(sb.Env))
	lc, _ := json.Marshal(sb.Lifecycle)
	vols, _ := json.Marshal(orEmptySlice(sb.Volumes))
	_, err := s.db.ExecContext(ctx, `INSERT INTO sandboxes
		(id, template, runtime, tier, resources, command_timeout_ms, network, metadata, state, created_at, expires_at, access_token, egress, task_id, snapshot, template_version, env, lifecycle, volumes, traffic_token, team, node)
		VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		sb.ID, sb.Template, sb.Runtime, sb.Tier, string(res), sb.CommandTimeout.Milliseconds(),
		sb.Network, string(meta), sb.State, ms(sb.CreatedAt), ms(sb.ExpiresAt), sb.AccessToken, string(eg), sb.TaskID, sb.Snapshot, sb.TemplateVersion,
		string(envJSON), string(lc), string(vols), sb.TrafficToken, teamOr(sb.Team), sb.Node)
	if err != nil {
		return fmt.Errorf("insert sandbox %s: %w", sb.ID, err)
	}
	return nil
}

func orEmptySlice[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// EndSandbox marks a sandbox ended with reason (only the first end counts).
func (s *Store) EndSandbox(ctx context.Context, id, reason, errText string, at time.Time) error {
	_, err := s.EndSandboxFirst(ctx, id, reason, errText, at)
	return err
}

// EndSandboxFirst is EndSandbox that reports whether this call ended
// the record (false: it had ended already, or there is none), so that
// of two control planes ending one sandbox at once exactly one records
// the end. An end that has an audit event is written with it instead
// (Event.EndsSandbox), so that the event is stored only with the end
// that counts.
func (s *Store) EndSandboxFirst(ctx context.Context, id, reason, errText string, at time.Time) (bool, error) {
	e := &SandboxEnd{ID: id, Reason: reason, Error: errText, At: at}
	if err := endSandbox(ctx, s.db, e); err != nil {
		return false, err
	}
	return e.Ended, nil
}

// SandboxEnd is a sandbox's end record: it ends the record if it has not
// ended yet, and says whether it did (Ended, set by the write).
type SandboxEnd struct {
	ID, Reason, Error string
	At                time.Time
	// Ended is set when the end is written: true if this write ended the
	// record, false if it had ended already or there is none.
	Ended bool
}

// endSandbox writes e with the one conditional update that decides,
// between ends racing on any number of control planes, which end counts
// (the first; the record keeps its reason).
func endSandbox(ctx context.Context, x execer, e *SandboxEnd) error {
	r, err := x.ExecContext(ctx, `UPDATE sandboxes SET state=?, ended_at=?, end_reason=?, error=?
		WHERE id=? AND state<>?`, StateEnded, ms(e.At), e.Reason, e.Error, e.ID, StateEnded)
	if err != nil {
		return fmt.Errorf("end sandbox %s: %w", e.ID, err)
	}
	n, err := r.RowsAffected()
	if err != nil {
		return fmt.Errorf("end sandbox %s: %w", e.ID, err)
	}
	e.Ended = n == 1
	return nil
}

// AssignUnowned gives node every sandbox record that names no node
// (rows made before records named their control plane, which only one
// control plane could have run) and returns how many it took.
func (s *Store) AssignUnowned(ctx context.Context, node string) (int64, error) {
	if node == "" {
		return 0, errors.New("assign sandboxes: no node id")
	}
	r, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET node=? WHERE node=''`, node)
	if err != nil {
		return 0, fmt.Errorf("assign sandboxes to node %s: %w", node, err)
	}
	n, _ := r.RowsAffected()
	return n, nil
}

// SetExpiry changes a running sandbox's expiry time.
func (s *Store) SetExpiry(ctx context.Context, id string, at time.Time) error {
	r, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET expires_at=? WHERE id=? AND state<>?`, ms(at), id, StateEnded)
	if err != nil {
		return fmt.Errorf("set expiry of %s: %w", id, err)
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// SetPersisted records that a paused sandbox was persisted to snapshot
// (or, with "", that it runs again).
func (s *Store) SetPersisted(ctx context.Context, id, snapshot string) error {
	r, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET persisted=? WHERE id=? AND state<>?`, snapshot, id, StateEnded)
	if err != nil {
		return fmt.Errorf("set persisted of %s: %w", id, err)
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// SetNetwork records a running or paused sandbox's new network policy.
func (s *Store) SetNetwork(ctx context.Context, id, mode string, eg Egress) error {
	b, _ := json.Marshal(eg)
	r, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET network=?, egress=? WHERE id=? AND state<>?`,
		mode, string(b), id, StateEnded)
	if err != nil {
		return fmt.Errorf("set network of %s: %w", id, err)
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// SetState changes a live sandbox's state (running or paused) and expiry.
func (s *Store) SetState(ctx context.Context, id, state string, expires time.Time) error {
	r, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET state=?, expires_at=? WHERE id=? AND state<>?`,
		state, ms(expires), id, StateEnded)
	if err != nil {
		return fmt.Errorf("set state of %s: %w", id, err)
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

const sandboxCols = `id, template, runtime, tier, resources, command_timeout_ms, network, metadata, state, created_at, expires_at, ended_at, end_reason, error, access_token, egress, task_id, snapshot, template_version, env, persisted, lifecycle, volumes, traffic_token, team, node`

// teamOr is team, or DefaultTeam when it is empty: every record has a
// team.
func teamOr(team string) string {
	if team == "" {
		return DefaultTeam
	}
	return team
}

func scanSandbox(sc interface{ Scan(...any) error }) (*Sandbox, error) {
	var sb Sandbox
	var res, meta, eg, envJSON, lc, vols string
	var ctMS, created, expires int64
	var ended sql.NullInt64
	if err := sc.Scan(&sb.ID, &sb.Template, &sb.Runtime, &sb.Tier, &res, &ctMS, &sb.Network, &meta,
		&sb.State, &created, &expires, &ended, &sb.EndReason, &sb.Error, &sb.AccessToken, &eg, &sb.TaskID, &sb.Snapshot, &sb.TemplateVersion, &envJSON, &sb.Persisted, &lc, &vols, &sb.TrafficToken, &sb.Team, &sb.Node); err != nil {
		return nil, err
	}
	_ = json.Unmarshal([]byte(envJSON), &sb.Env)
	_ = json.Unmarshal([]byte(lc), &sb.Lifecycle)
	_ = json.Unmarshal([]byte(vols), &sb.Volumes)
	_ = json.Unmarshal([]byte(eg), &sb.Egress)
	_ = json.Unmarshal([]byte(res), &sb.Resources)
	_ = json.Unmarshal([]byte(meta), &sb.Metadata)
	sb.CommandTimeout = time.Duration(ctMS) * time.Millisecond
	sb.CreatedAt = time.UnixMilli(created).UTC()
	sb.ExpiresAt = time.UnixMilli(expires).UTC()
	if ended.Valid {
		t := time.UnixMilli(ended.Int64).UTC()
		sb.EndedAt = &t
	}
	return &sb, nil
}

// GetSandbox returns the record of id.
func (s *Store) GetSandbox(ctx context.Context, id string) (*Sandbox, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id=?`, id)
	sb, err := scanSandbox(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	return sb, nil
}

// SandboxFilter selects sandboxes; zero fields match everything.
type SandboxFilter struct {
	// Team selects one team's sandboxes ("" = every team's).
	Team string
	// States selects sandboxes in one of the states.
	States []string
	// Node selects the sandboxes of one control plane ("" = every one's).
	Node string
}

// ListSandboxes returns the sandboxes f selects, newest first.
func (s *Store) ListSandboxes(ctx context.Context, f SandboxFilter) ([]*Sandbox, error) {
	q := `SELECT ` + sandboxCols + ` FROM sandboxes WHERE 1=1`
	var args []any
	if f.Team != "" {
		q += ` AND team=?`
		args = append(args, f.Team)
	}
	if f.Node != "" {
		q += ` AND node=?`
		args = append(args, f.Node)
	}
	if states := f.States; len(states) > 0 && states[0] != "" {
		q += ` AND state IN (?` + strings.Repeat(",?", len(states)-1) + `)`
		for _, st := range states {
			args = append(args, st)
		}
	}
	q += ` ORDER BY created_at DESC, id`
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	defer rows.Close()
	var out []*Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, fmt.Errorf("list sandboxes: %w", err)
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

// CountSandboxes counts the sandboxes that have not ended, by state.
func (s *Store) CountSandboxes(ctx context.Context) (map[string]int, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT state, COUNT(*) FROM sandboxes WHERE state<>'ended' GROUP BY state`)
	if err != nil {
		return nil, fmt.Errorf("count sandboxes: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var state string
		var n int
		if err := rows.Scan(&state, &n); err != nil {
			return nil, fmt.Errorf("count sandboxes: %w", err)
		}
		out[state] = n
	}
	return out, rows.Err()
}

// Command is the record of one command run in a sandbox.
type Command struct {
	ID          int64
	SandboxID   string
	StartedAt   time.Time
	EndedAt     *time.Time
	Command     string
	Cwd         string
	User        string
	ExitCode    *int
	StdoutBytes int64
	StderrBytes int64
	TimedOut    bool
	EndReason   string
}

// StartCommand records a command as started and returns its record id.
// With task non-nil, the task's state and usage (its call counter) are
// written in the same transaction: one commit admits the call and
// records the command, before the command runs.
func (s *Store) StartCommand(ctx context.Context, c *Command, task *Task) (int64, error) {
	return s.QueueStartCommand(ctx, c, task)()
}

// QueueStartCommand is StartCommand in two steps: it queues the write
// (with a copy of task as it is now) and returns the function that waits
// for its commit and returns the record id. Writes queued one after
// another commit in that order, so a caller that queues under its own
// lock and waits after releasing it still stores the task's states in
// the order it made them (the governor's call counter). On SQLite
// concurrent starts and the audit writer's pending batch share one
// commit (groupCommit).
func (s *Store) QueueStartCommand(ctx context.Context, c *Command, task *Task) (wait func() (int64, error)) {
	ctx = context.WithoutCancel(ctx)
	var tc *Task
	if task != nil {
		cp := *task
		tc = &cp
	}
	cc := *c
	var id int64
	done := s.db.queue(func(tx *tx) error {
		if tc != nil {
			if err := updateTask(ctx, tx, tc); err != nil {
				return err
			}
		}
		return tx.QueryRowContext(ctx, `INSERT INTO commands (sandbox_id, started_at, command, cwd, "user")
		VALUES (?,?,?,?,?) RETURNING id`, cc.SandboxID, ms(cc.StartedAt), cc.Command, cc.Cwd, cc.User).Scan(&id)
	}, false)
	return func() (int64, error) {
		if err := <-done; err != nil {
			return 0, fmt.Errorf("record command: %w", err)
		}
		return id, nil
	}
}

// EndCommand records how a command ended.
func (s *Store) EndCommand(ctx context.Context, c *Command) error {
	if err := endCommand(ctx, s.db, c); err != nil {
		return fmt.Errorf("record command end: %w", err)
	}
	return nil
}

// execer runs statements: a *db or a *tx.
type execer interface {
	ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error)
}

func endCommand(ctx context.Context, e execer, c *Command) error {
	var ended int64
	if c.EndedAt != nil {
		ended = ms(*c.EndedAt)
	}
	_, err := e.ExecContext(ctx, `UPDATE commands SET ended_at=?, exit_code=?, stdout_bytes=?, stderr_bytes=?,
		timed_out=?, end_reason=? WHERE id=?`, ended, c.ExitCode, c.StdoutBytes, c.StderrBytes, b2i(c.TimedOut), c.EndReason, c.ID)
	return err
}

// EndOpenCommands marks every command of a sandbox that has no end as
// ended at at with reason (after a control-plane crash lost their
// streams) and returns them.
func (s *Store) EndOpenCommands(ctx context.Context, sandboxID, reason string, at time.Time) ([]*Command, error) {
	all, err := s.ListCommands(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	var open []*Command
	for _, c := range all {
		if c.EndedAt != nil {
			continue
		}
		if _, err := s.db.ExecContext(ctx, `UPDATE commands SET ended_at=?, end_reason=? WHERE id=? AND ended_at IS NULL`,
			ms(at), reason, c.ID); err != nil {
			return nil, fmt.Errorf("end open command %d: %w", c.ID, err)
		}
		t := at.UTC()
		c.EndedAt, c.EndReason = &t, reason
		open = append(open, c)
	}
	return open, nil
}

// ListCommands returns the commands of a sandbox in order.
func (s *Store) ListCommands(ctx context.Context, sandboxID string) ([]*Command, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, sandbox_id, started_at, ended_at, command, cwd, "user", exit_code,
		stdout_bytes, stderr_bytes, timed_out, end_reason FROM commands WHERE sandbox_id=? ORDER BY id`, sandboxID)
	if err != nil {
		return nil, fmt.Errorf("list commands: %w", err)
	}
	defer rows.Close()
	var out []*Command
	for rows.Next() {
		var c Command
		var started int64
		var ended sql.NullInt64
		var exit sql.NullInt64
		if err := rows.Scan(&c.ID, &c.SandboxID, &started, &ended, &c.Command, &c.Cwd, &c.User, &exit,
			&c.StdoutBytes, &c.StderrBytes, &c.TimedOut, &c.EndReason); err != nil {
			return nil, err
		}
		c.StartedAt = time.UnixMilli(started).UTC()
		if ended.Valid && ended.Int64 != 0 {
			t := time.UnixMilli(ended.Int64).UTC()
			c.EndedAt = &t
		}
		if exit.Valid {
			v := int(exit.Int64)
			c.ExitCode = &v
		}
		out = append(out, &c)
	}
	return out, rows.Err()
}

// scanner is a *sql.Row or *sql.Rows.
type scanner interface{ Scan(...any) error }

// queryAll runs q and returns every row made by scan.
func queryAll[T any](ctx context.Context, db querier, what, q string, args []any, scan func(scanner) (T, error)) ([]T, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// scanString scans a one-column row of text.
func scanString(sc scanner) (string, error) {
	var s string
	err := sc.Scan(&s)
	return s, err
}
