package corral

import (
	"context"
	"net/url"
	"time"
)

// Usage groupings (UsageQuery.By).
const (
	UsageByTeam    = "team"
	UsageByAgent   = "agent"
	UsageByTask    = "task"
	UsageBySandbox = "sandbox"
)

// UsageQuery selects a usage report; zero fields take the defaults.
type UsageQuery struct {
	// Team is another team's name or "all" (admin keys only; default:
	// the key's own team).
	Team string
	// Since and Until bound the window (zero: unbounded). The server
	// rounds them out to whole minutes.
	Since, Until time.Time
	// By groups the rows: UsageByTeam, UsageByAgent, UsageByTask or
	// UsageBySandbox ("": the totals only).
	By string
}

// UsageAmounts are metered amounts, in the units their names say.
type UsageAmounts struct {
	// CPUSeconds is CPU time used, all cores together.
	CPUSeconds float64 `json:"cpu_seconds"`
	// MemoryGiBSeconds is memory use integrated over time.
	MemoryGiBSeconds float64 `json:"memory_gib_seconds"`
	// SandboxSeconds is the time sandboxes existed (created to ended,
	// paused time included) inside the window.
	SandboxSeconds float64 `json:"sandbox_seconds"`
	// EgressBytes is EgressBytesUp + EgressBytesDown: the bytes the
	// egress proxy carried.
	EgressBytes     int64 `json:"egress_bytes"`
	EgressBytesUp   int64 `json:"egress_bytes_up"`
	EgressBytesDown int64 `json:"egress_bytes_down"`
	// Commands is the number of commands started.
	Commands int64 `json:"commands"`
	// Sandboxes counts the sandboxes that existed in the window.
	Sandboxes int64 `json:"sandboxes"`
}

// UsageRow is one group of a usage report: the key fields of its
// grouping (the others are empty) and its amounts.
type UsageRow struct {
	Team    string `json:"team"`
	Agent   string `json:"agent,omitempty"`
	Task    string `json:"task,omitempty"`
	Sandbox string `json:"sandbox,omitempty"`
	UsageAmounts
}

// UsageReport is the answer of Client.Usage.
type UsageReport struct {
	// Team is the team reported on, or "all".
	Team string `json:"team"`
	// Since and Until are the window as the server rounded it (nil:
	// unbounded).
	Since *time.Time `json:"since,omitempty"`
	Until *time.Time `json:"until,omitempty"`
	// GranularityS is the width of the server's usage rows in seconds.
	GranularityS int `json:"granularity_s"`
	// By is the grouping ("": totals only).
	By     string       `json:"by"`
	Totals UsageAmounts `json:"totals"`
	Rows   []UsageRow   `json:"rows"`
}

// Usage returns what sandboxes used: CPU seconds, memory GiB-seconds,
// sandbox-seconds, egress bytes and commands (GET /v1/usage).
func (c *Client) Usage(ctx context.Context, q UsageQuery) (*UsageReport, error) {
	v := url.Values{}
	if q.Team != "" {
		v.Set("team", q.Team)
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if !q.Until.IsZero() {
		v.Set("until", q.Until.UTC().Format(time.RFC3339Nano))
	}
	if q.By != "" {
		v.Set("by", q.By)
	}
	var out UsageReport
	if err := c.do(ctx, "GET", "/v1/usage", v, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
