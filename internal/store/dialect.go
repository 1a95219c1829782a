package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// dialect is what differs between the store's two databases, SQLite (the
// embedded default) and PostgreSQL (a store shared by several control
// planes). Every query of the store is written once, in the common
// subset of the two with `?` placeholders and GREATEST/LEAST for the
// scalar maximum and minimum; the dialect rewrites it (query), translates
// the one schema (ddl), and supplies the few pieces that cannot be
// written in common: the append-only triggers of the event log, adding a
// column, the migration lock, the event-order lock and the errors.
type dialect interface {
	// name is "sqlite" or "postgres".
	name() string
	// query rewrites a query of the common subset for this database.
	query(q string) string
	// ddl translates schema text (SQLite's syntax and types) for this
	// database.
	ddl(s string) string
	// lockMigration serialises migrations of one database (several
	// control planes may start at once); it runs first in the
	// migration's transaction.
	lockMigration(ctx context.Context, tx *sql.Tx) error
	// addColumn adds column to table with def unless it exists.
	addColumn(ctx context.Context, tx *sql.Tx, table, column, def string) error
	// upgradeLegacy moves tables of an older layout to the current one.
	upgradeLegacy(ctx context.Context, tx *sql.Tx) error
	// appendOnly is the DDL that makes the event log append-only except
	// for retention (see appendOnlyDelete) and adds whatever the
	// dialect's tables need beyond the common schema.
	appendOnly() string
	// lockEvents serialises appends to the event log until tx ends, so
	// that event ids are committed in increasing order: a reader
	// following the log by id (EventFilter.AfterID) never skips an event
	// that a slower transaction commits later with a smaller id.
	lockEvents(ctx context.Context, tx *sql.Tx) error
	// txOptions are the options of a transaction that must behave as if
	// transactions ran one at a time (serializable).
	txOptions() *sql.TxOptions
	// isUnique reports whether err is a unique-constraint violation.
	isUnique(err error) bool
	// isRetryable reports whether err aborted a transaction that may
	// succeed when run again (a serialization failure, a deadlock).
	isRetryable(err error) bool
}

// sqliteDialect is SQLite's: the store's queries are written in its
// syntax already, and one connection serialises every transaction.
type sqliteDialect struct{}

func (sqliteDialect) name() string { return "sqlite" }

// sqliteFuncs maps the common subset's scalar functions to SQLite's.
var sqliteFuncs = strings.NewReplacer("GREATEST(", "MAX(", "LEAST(", "MIN(")

func (sqliteDialect) query(q string) string { return sqliteFuncs.Replace(q) }
func (sqliteDialect) ddl(s string) string   { return s }

func (sqliteDialect) lockMigration(context.Context, *sql.Tx) error { return nil }

func (sqliteDialect) addColumn(ctx context.Context, tx *sql.Tx, table, column, def string) error {
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info(?) WHERE name=?`, table, column).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	_, err := tx.ExecContext(ctx, `ALTER TABLE `+table+` ADD COLUMN `+column+` `+def)
	return err
}

func (sqliteDialect) upgradeLegacy(ctx context.Context, tx *sql.Tx) error {
	return rebuildTeamTables(ctx, tx)
}

func (sqliteDialect) appendOnly() string {
	return `CREATE TRIGGER IF NOT EXISTS events_append_only_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;` + appendOnlyDelete
}

func (sqliteDialect) lockEvents(context.Context, *sql.Tx) error { return nil }
func (sqliteDialect) txOptions() *sql.TxOptions                 { return nil }

func (sqliteDialect) isUnique(err error) bool {
	var e *sqlite.Error
	if !errors.As(err, &e) {
		return false
	}
	return e.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE || e.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
}

func (sqliteDialect) isRetryable(error) bool { return false }

// postgresDialect is PostgreSQL's (15 or later).
type postgresDialect struct{}

func (postgresDialect) name() string { return "postgres" }

// query rewrites `?` placeholders to `$1`, `$2`, ... (not inside quoted
// strings or identifiers).
func (postgresDialect) query(q string) string {
	if !strings.Contains(q, "?") {
		return q
	}
	var b strings.Builder
	b.Grow(len(q) + 16)
	n := 0
	var quote byte
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// pgTypes translate SQLite's column types: 64-bit integers (SQLite's
// INTEGER is 64 bits, PostgreSQL's 32), doubles, and text compared byte
// by byte (COLLATE "C", as SQLite's BINARY), so that key ranges and the
// order of lists do not depend on the database's locale.
var pgTypes = []struct {
	re   *regexp.Regexp
	repl string
}{
	{regexp.MustCompile(`\bINTEGER PRIMARY KEY AUTOINCREMENT\b`), `BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY`},
	{regexp.MustCompile(`\bINTEGER\b`), `BIGINT`},
	{regexp.MustCompile(`\bREAL\b`), `DOUBLE PRECISION`},
	{regexp.MustCompile(`\bTEXT\b`), `TEXT COLLATE "C"`},
}

func (postgresDialect) ddl(s string) string {
	for _, t := range pgTypes {
		s = t.re.ReplaceAllString(s, t.repl)
	}
	return s
}

// pgMigrationLock and pgEventsLock are the advisory lock keys of the
// migration and of appends to the event log.
const (
	pgMigrationLock = 0x636f7272616c01 // "corral" 1
	pgEventsLock    = 0x636f7272616c02 // "corral" 2
)

func (postgresDialect) lockMigration(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(pgMigrationLock))
	return err
}

func (postgresDialect) addColumn(ctx context.Context, tx *sql.Tx, table, column, def string) error {
	_, err := tx.ExecContext(ctx, `ALTER TABLE `+table+` ADD COLUMN IF NOT EXISTS `+column+` `+def)
	return err
}

// upgradeLegacy has nothing to do: PostgreSQL stores were first made
// with the current layout.
func (postgresDialect) upgradeLegacy(context.Context, *sql.Tx) error { return nil }

// appendOnly is appendOnlyDelete's rule in PL/pgSQL, and also refuses
// TRUNCATE (which fires no row trigger). api_keys gets a rowid: the
// creation order of keys within a millisecond, as SQLite's rowid.
func (postgresDialect) appendOnly() string {
	return `
CREATE TABLE IF NOT EXISTS events_prune (upto BIGINT NOT NULL);
CREATE OR REPLACE FUNCTION corral_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'DELETE' AND OLD.id <= (SELECT COALESCE(MAX(upto), 0) FROM events_prune) THEN
		RETURN OLD;
	END IF;
	RAISE EXCEPTION 'events are append-only';
END $$;
DROP TRIGGER IF EXISTS events_append_only_update ON events;
CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events FOR EACH ROW EXECUTE FUNCTION corral_events_append_only();
DROP TRIGGER IF EXISTS events_append_only_delete ON events;
CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events FOR EACH ROW EXECUTE FUNCTION corral_events_append_only();
DROP TRIGGER IF EXISTS events_append_only_truncate ON events;
CREATE TRIGGER events_append_only_truncate BEFORE TRUNCATE ON events FOR EACH STATEMENT EXECUTE FUNCTION corral_events_append_only();
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS rowid BIGINT GENERATED BY DEFAULT AS IDENTITY;
`
}

func (postgresDialect) lockEvents(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(pgEventsLock))
	return err
}

func (postgresDialect) txOptions() *sql.TxOptions {
	return &sql.TxOptions{Isolation: sql.LevelSerializable}
}

func pgCode(err error) string {
	var e *pgconn.PgError
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func (postgresDialect) isUnique(err error) bool { return pgCode(err) == "23505" }

// isRetryable: serialization_failure and deadlock_detected.
func (postgresDialect) isRetryable(err error) bool {
	c := pgCode(err)
	return c == "40001" || c == "40P01"
}

// db is the store's database handle: every query goes through the
// dialect.
type db struct {
	sql *sql.DB
	// read, when set, serves the queries made outside a transaction
	// (SQLite: a pool of read-only connections, so that a read never
	// waits for the one writer connection's commit); nil: sql serves
	// them.
	read *sql.DB
	d    dialect
	// group, when set (SQLite), commits the hot writes together
	// (groupCommit); nil: each write is its own transaction.
	group *groupCommit
	// wstmts and rstmts, when set (SQLite), are the prepared statements
	// of sql and of read; nil: every query is prepared by the driver
	// (pgx caches its own per connection).
	wstmts, rstmts *stmtCache
}

// readStmts is the statement cache of reader().
func (c *db) readStmts() *stmtCache {
	if c.read != nil {
		return c.rstmts
	}
	return c.wstmts
}

// reader is the pool of queries outside a transaction.
func (c *db) reader() *sql.DB {
	if c.read != nil {
		return c.read
	}
	return c.sql
}

// close closes the pools.
func (c *db) close() error {
	if c.group != nil {
		c.group.close()
	}
	c.wstmts.close()
	c.rstmts.close()
	err := c.sql.Close()
	if c.read != nil {
		err = errors.Join(err, c.read.Close())
	}
	return err
}

// querier runs queries: a *db or a *tx.
type querier interface {
	QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error)
}

func (c *db) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	q = c.d.query(q)
	if st := c.wstmts.get(q); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return c.sql.ExecContext(ctx, q, args...)
}

// QueryContext runs a read outside a transaction (on the read pool).
func (c *db) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	q = c.d.query(q)
	if st := c.readStmts().get(q); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return c.reader().QueryContext(ctx, q, args...)
}

// QueryRowContext runs a one-row read outside a transaction (on the
// read pool); a statement that writes goes in a transaction (inTx).
func (c *db) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	q = c.d.query(q)
	if st := c.readStmts().get(q); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return c.reader().QueryRowContext(ctx, q, args...)
}

// Exec is ExecContext without a context (tests).
func (c *db) Exec(q string, args ...any) (sql.Result, error) {
	return c.ExecContext(context.Background(), q, args...)
}

// maxTxAttempts bounds how often inTx runs a transaction that a
// concurrent one aborted.
const maxTxAttempts = 20

// inTx runs fn in a transaction and commits it. With serializable, the
// transaction behaves as if it ran alone (SQLite: always; PostgreSQL:
// SERIALIZABLE); a transaction that the database aborted for a conflict
// with a concurrent one is run again (fn must be safe to run again).
func (c *db) inTx(ctx context.Context, serializable bool, fn func(*tx) error) error {
	var opts *sql.TxOptions
	if serializable {
		opts = c.d.txOptions()
	}
	var err error
	for range maxTxAttempts {
		if err = c.tryTx(ctx, opts, fn); err == nil || !c.d.isRetryable(err) {
			return err
		}
	}
	return fmt.Errorf("transaction aborted by concurrent ones %d times: %w", maxTxAttempts, err)
}

func (c *db) tryTx(ctx context.Context, opts *sql.TxOptions, fn func(*tx) error) error {
	t, err := c.sql.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	defer t.Rollback()
	if err := fn(&tx{t, c.d, c.wstmts}); err != nil {
		return err
	}
	return t.Commit()
}

// queue runs fn in a transaction: through the group commit when the
// database has one (lazy: fn may wait LazyCommitDelay for an eager write
// to share its commit), else at once in a transaction of its own. The
// returned channel delivers fn's result once committed. fn's statements
// must use a context without cancellation (see groupCommit.submit).
func (c *db) queue(fn func(*tx) error, lazy bool) <-chan error {
	if c.group != nil {
		return c.group.submit(fn, lazy)
	}
	done := make(chan error, 1)
	done <- c.inTx(context.Background(), false, fn)
	return done
}

// tx is a transaction of a db.
type tx struct {
	tx *sql.Tx
	d  dialect
	// stmts are the writer pool's prepared statements (nil: none), run
	// on the transaction's connection through Tx.StmtContext.
	stmts *stmtCache
}

// stmt returns the transaction's use of q's prepared statement, or nil.
func (t *tx) stmt(ctx context.Context, q string) *sql.Stmt {
	if st := t.stmts.get(q); st != nil {
		return t.tx.StmtContext(ctx, st)
	}
	return nil
}

func (t *tx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	q = t.d.query(q)
	if st := t.stmt(ctx, q); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return t.tx.ExecContext(ctx, q, args...)
}

func (t *tx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	q = t.d.query(q)
	if st := t.stmt(ctx, q); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return t.tx.QueryContext(ctx, q, args...)
}

func (t *tx) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	q = t.d.query(q)
	if st := t.stmt(ctx, q); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return t.tx.QueryRowContext(ctx, q, args...)
}

// PrepareContext returns the transaction's use of q's cached prepared
// statement, or prepares q on the transaction.
func (t *tx) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	q = t.d.query(q)
	if st := t.stmt(ctx, q); st != nil {
		return st, nil
	}
	return t.tx.PrepareContext(ctx, q)
}

// b2i stores a bool as 0 or 1 (both databases' columns are integers).
func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// IsUnavailable reports whether err says that the database cannot be
// reached now — a PostgreSQL server that is down, restarting or failing
// over, a lost connection — rather than that it refused a statement: a
// write that failed so may succeed later, unchanged.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if c := pgCode(err); c != "" {
		// connection_exception, operator_intervention (admin_shutdown,
		// crash_shutdown, cannot_connect_now).
		return strings.HasPrefix(c, "08") || strings.HasPrefix(c, "57P")
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
