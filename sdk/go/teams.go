package corral

import (
	"context"
	"net/url"
)

// TeamQuota is what one team's sandboxes may use together; a zero field
// sets no team limit (the server's global limits still apply). Over a
// quota a create fails with capacity_exceeded (see [IsCapacityExceeded])
// whose message names the quota: team_sandboxes, team_agent, team_cpu,
// team_memory or team_rate.
type TeamQuota struct {
	MaxSandboxes int     `json:"max_sandboxes"`
	MaxPerAgent  int     `json:"max_per_agent"`
	MaxCPUs      float64 `json:"max_cpus"`
	MaxMemoryMB  int64   `json:"max_memory_mb"`
	CreateRate   float64 `json:"create_rate"`
	CreateBurst  int     `json:"create_burst"`
}

// QuotaOverride is an admin's override of a team's quota: a nil field
// takes the server's default (corral serve --team-*), a zero one sets no
// team limit.
type QuotaOverride struct {
	MaxSandboxes *int64   `json:"max_sandboxes,omitempty"`
	MaxPerAgent  *int64   `json:"max_per_agent,omitempty"`
	MaxCPUs      *float64 `json:"max_cpus,omitempty"`
	MaxMemoryMB  *int64   `json:"max_memory_mb,omitempty"`
	CreateRate   *float64 `json:"create_rate,omitempty"`
	CreateBurst  *int64   `json:"create_burst,omitempty"`
}

// TeamUsage is what a team's admitted sandboxes (running, paused or
// starting) use now, and how many of its creates wait for a slot.
type TeamUsage struct {
	Running  int     `json:"running"`
	Waiting  int     `json:"waiting"`
	CPUs     float64 `json:"cpus"`
	MemoryMB int64   `json:"memory_mb"`
}

// Team is a team's quota in force, its override and its usage.
type Team struct {
	Team     string        `json:"team"`
	Quota    TeamQuota     `json:"quota"`
	Override QuotaOverride `json:"override"`
	Usage    TeamUsage     `json:"usage"`
}

// Teams lists every team (named by an API key, a quota override or
// running sandboxes) with its quota and usage (GET /v1/teams; admin
// keys only).
func (c *Client) Teams(ctx context.Context) ([]Team, error) {
	var out struct {
		Teams []Team `json:"teams"`
	}
	if err := c.do(ctx, "GET", "/v1/teams", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Teams, nil
}

// TeamQuota returns a team's quota, override and usage (GET
// /v1/teams/{team}/quota; admin keys only).
func (c *Client) TeamQuota(ctx context.Context, team string) (*Team, error) {
	var t Team
	if err := c.do(ctx, "GET", "/v1/teams/"+url.PathEscape(team)+"/quota", nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// SetTeamQuota replaces a team's override (PUT /v1/teams/{team}/quota;
// admin keys only): the fields o sets replace the server's defaults, the
// zero QuotaOverride drops the override. It applies to the team's next
// create. A bad value fails with invalid_argument naming the field.
func (c *Client) SetTeamQuota(ctx context.Context, team string, o QuotaOverride) (*Team, error) {
	var t Team
	if err := c.do(ctx, "PUT", "/v1/teams/"+url.PathEscape(team)+"/quota", nil, o, &t); err != nil {
		return nil, err
	}
	return &t, nil
}
