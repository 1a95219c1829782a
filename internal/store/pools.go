package store

import (
	"context"
	"fmt"
)

// Pool is the stored configuration of one team's warm pool of a
// template.
type Pool struct {
	// Team owns the pool: its idle sandboxes serve that team's creates
	// only.
	Team     string
	Template string
	Min, Max int
	MaxIdleS int64
}

// PutPool stores a pool's configuration (team "" is DefaultTeam); max 0
// removes it. Another team's pool of the template is untouched.
func (s *Store) PutPool(ctx context.Context, p Pool) error {
	var err error
	if p.Max == 0 {
		_, err = s.db.ExecContext(ctx, `DELETE FROM pools WHERE team=? AND template=?`, teamOr(p.Team), p.Template)
	} else {
		_, err = s.db.ExecContext(ctx, `INSERT INTO pools (team, template, min, max, max_idle_s) VALUES (?,?,?,?,?)
			ON CONFLICT(team, template) DO UPDATE SET min=excluded.min, max=excluded.max, max_idle_s=excluded.max_idle_s`,
			teamOr(p.Team), p.Template, p.Min, p.Max, p.MaxIdleS)
	}
	if err != nil {
		return fmt.Errorf("put pool %s: %w", p.Template, err)
	}
	return nil
}

// ListPools returns every team's stored pool configurations.
func (s *Store) ListPools(ctx context.Context) ([]Pool, error) {
	return queryAll(ctx, s.db, "list pools", `SELECT team, template, min, max, max_idle_s FROM pools ORDER BY team, template`, nil,
		func(sc scanner) (Pool, error) {
			var p Pool
			err := sc.Scan(&p.Team, &p.Template, &p.Min, &p.Max, &p.MaxIdleS)
			return p, err
		})
}
