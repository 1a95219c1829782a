package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// teamTable is a table whose key includes the owning team: names of
// volumes, secrets and pools are per team (issue 12), so team B may have
// a volume named like team A's and the two never mix.
type teamTable struct {
	name string
	// def is the column list and constraints of the current layout.
	def string
	// oldCols are the columns a table made before teams had; a rebuild
	// copies them and gives every row team DefaultTeam.
	oldCols string
}

var teamTables = []teamTable{
	{name: "volumes", def: `
	id TEXT PRIMARY KEY,
	team TEXT NOT NULL DEFAULT 'default',
	name TEXT NOT NULL,
	size_mb INTEGER NOT NULL,
	token TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	UNIQUE (team, name)`, oldCols: "id, name, size_mb, token, created_at"},
	{name: "secrets", def: `
	team TEXT NOT NULL DEFAULT 'default',
	name TEXT NOT NULL,
	hosts TEXT NOT NULL,
	header TEXT NOT NULL,
	value TEXT NOT NULL,
	allow_http INTEGER NOT NULL DEFAULT 0,
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	PRIMARY KEY (team, name)`, oldCols: "name, hosts, header, value, allow_http, created_at, updated_at"},
	{name: "pools", def: `
	team TEXT NOT NULL DEFAULT 'default',
	template TEXT NOT NULL,
	min INTEGER NOT NULL,
	max INTEGER NOT NULL,
	max_idle_s INTEGER NOT NULL,
	PRIMARY KEY (team, template)`, oldCols: "template, min, max, max_idle_s"},
}

// teamTablesSchema creates the team tables of a new database in their
// current layout (an existing table is left for rebuildTeamTables).
func teamTablesSchema() string {
	var b strings.Builder
	for _, t := range teamTables {
		fmt.Fprintf(&b, "CREATE TABLE IF NOT EXISTS %s (%s\n);\n", t.name, t.def)
	}
	return b.String()
}

// rebuildTeamTables moves a table made before teams (name as its key)
// to the per-team layout. SQLite cannot change a PRIMARY KEY or UNIQUE
// constraint in place, so the table is rebuilt: a new table is created,
// the rows are copied with team DefaultTeam, the old table is dropped and
// the new one renamed — in the migration's transaction, so a crash
// leaves either layout, never half of one. A table that has a team column is left
// alone (the rebuild is idempotent). It runs after addColumns, so that an
// old table has every column it copies.
func rebuildTeamTables(ctx context.Context, tx *sql.Tx) error {
	for _, t := range teamTables {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info(?) WHERE name='team'`, t.name).Scan(&n); err != nil {
			return fmt.Errorf("rebuild %s for teams: %w", t.name, err)
		}
		if n > 0 {
			continue
		}
		if err := rebuildTeamTable(ctx, tx, t); err != nil {
			return fmt.Errorf("rebuild %s for teams: %w", t.name, err)
		}
	}
	return nil
}

func rebuildTeamTable(ctx context.Context, tx *sql.Tx, t teamTable) error {
	tmp := t.name + "_teams"
	for _, q := range []string{
		`DROP TABLE IF EXISTS ` + tmp,
		`CREATE TABLE ` + tmp + ` (` + t.def + `)`,
		`INSERT INTO ` + tmp + ` (team, ` + t.oldCols + `) SELECT '` + DefaultTeam + `', ` + t.oldCols + ` FROM ` + t.name,
		`DROP TABLE ` + t.name,
		`ALTER TABLE ` + tmp + ` RENAME TO ` + t.name,
	} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return nil
}
