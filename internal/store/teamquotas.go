package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// teamQuotasSchema is the table of per-team quota overrides.
const teamQuotasSchema = `
CREATE TABLE IF NOT EXISTS team_quotas (
	team TEXT PRIMARY KEY,
	quota TEXT NOT NULL,
	updated_at INTEGER NOT NULL
);`

// TeamQuota is an admin's override of one team's admission quota. A nil
// field takes the server's default (the --team-* flags); a zero one sets
// no team limit. The fields are those of govern.TeamQuota.
type TeamQuota struct {
	Team         string    `json:"-"`
	MaxSandboxes *int64    `json:"max_sandboxes,omitempty"`
	MaxPerAgent  *int64    `json:"max_per_agent,omitempty"`
	MaxCPUs      *float64  `json:"max_cpus,omitempty"`
	MaxMemoryMB  *int64    `json:"max_memory_mb,omitempty"`
	CreateRate   *float64  `json:"create_rate,omitempty"`
	CreateBurst  *int64    `json:"create_burst,omitempty"`
	UpdatedAt    time.Time `json:"-"`
}

// IsZero reports whether q overrides nothing.
func (q TeamQuota) IsZero() bool {
	return q.MaxSandboxes == nil && q.MaxPerAgent == nil && q.MaxCPUs == nil && q.MaxMemoryMB == nil &&
		q.CreateRate == nil && q.CreateBurst == nil
}

// PutTeamQuota stores q as the override of q.Team, replacing any; an
// override that sets nothing is deleted instead.
func (s *Store) PutTeamQuota(ctx context.Context, q *TeamQuota) error {
	if q.IsZero() {
		if _, err := s.db.ExecContext(ctx, `DELETE FROM team_quotas WHERE team=?`, q.Team); err != nil {
			return fmt.Errorf("delete team quota %s: %w", q.Team, err)
		}
		return nil
	}
	data, err := json.Marshal(q)
	if err != nil {
		return fmt.Errorf("put team quota %s: %w", q.Team, err)
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO team_quotas (team, quota, updated_at) VALUES (?,?,?)
		ON CONFLICT(team) DO UPDATE SET quota=excluded.quota, updated_at=excluded.updated_at`,
		q.Team, string(data), ms(time.Now()))
	if err != nil {
		return fmt.Errorf("put team quota %s: %w", q.Team, err)
	}
	return nil
}

// GetTeamQuota returns the override of team, or ErrNotFound.
func (s *Store) GetTeamQuota(ctx context.Context, team string) (*TeamQuota, error) {
	q, err := scanTeamQuota(s.db.QueryRowContext(ctx, `SELECT team, quota, updated_at FROM team_quotas WHERE team=?`, team))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("get team quota %s: %w", team, err)
	}
	return q, nil
}

// ListTeamQuotas returns every override, by team.
func (s *Store) ListTeamQuotas(ctx context.Context) ([]*TeamQuota, error) {
	return queryAll(ctx, s.db, "list team quotas", `SELECT team, quota, updated_at FROM team_quotas ORDER BY team`, nil, scanTeamQuota)
}

// ListTeams returns every team named by an API key (revoked ones
// included) or a quota override, sorted.
func (s *Store) ListTeams(ctx context.Context) ([]string, error) {
	return queryAll(ctx, s.db, "list teams", `SELECT team FROM api_keys UNION SELECT team FROM team_quotas ORDER BY 1`, nil,
		func(sc scanner) (string, error) {
			var t string
			err := sc.Scan(&t)
			return t, err
		})
}

func scanTeamQuota(sc scanner) (*TeamQuota, error) {
	var q TeamQuota
	var data string
	var updated int64
	if err := sc.Scan(&q.Team, &data, &updated); err != nil {
		return nil, err
	}
	team := q.Team
	if err := json.Unmarshal([]byte(data), &q); err != nil {
		return nil, fmt.Errorf("team quota %s: %w", team, err)
	}
	q.Team, q.UpdatedAt = team, time.UnixMilli(updated).UTC()
	return &q, nil
}
