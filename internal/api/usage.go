package api

import (
	"errors"
	"net/http"
	"time"

	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/usage"
)

// usageReportView is the answer of GET /v1/usage: the totals of the
// window and, with ?by=, one row per group.
type usageReportView struct {
	// Team is the team reported on, or "all" (an admin's ?team=all).
	Team string `json:"team"`
	// Since and Until are the window after rounding out to whole
	// minutes; absent when unbounded.
	Since *time.Time `json:"since,omitempty"`
	Until *time.Time `json:"until,omitempty"`
	// GranularityS is the width of the usage rows in seconds (60).
	GranularityS int `json:"granularity_s"`
	// By is the grouping ("" for the totals only).
	By     string        `json:"by"`
	Totals UsageAmounts  `json:"totals"`
	Rows   []usageRowOut `json:"rows"`
}

// UsageAmounts are the amounts of a usage report, in the units their
// names say.
type UsageAmounts struct {
	CPUSeconds       float64 `json:"cpu_seconds"`
	MemoryGiBSeconds float64 `json:"memory_gib_seconds"`
	SandboxSeconds   float64 `json:"sandbox_seconds"`
	// EgressBytes is EgressBytesUp + EgressBytesDown.
	EgressBytes     int64 `json:"egress_bytes"`
	EgressBytesUp   int64 `json:"egress_bytes_up"`
	EgressBytesDown int64 `json:"egress_bytes_down"`
	Commands        int64 `json:"commands"`
	// Sandboxes counts the sandboxes that existed in the window.
	Sandboxes int64 `json:"sandboxes"`
}

// usageRowOut is one group of a usage report: the group's key fields
// (those of the grouping; the others are absent) and its amounts.
type usageRowOut struct {
	Team    string `json:"team"`
	Agent   string `json:"agent,omitempty"`
	Task    string `json:"task,omitempty"`
	Sandbox string `json:"sandbox,omitempty"`
	UsageAmounts
}

func amountsOf(r *store.UsageRow) UsageAmounts {
	return UsageAmounts{CPUSeconds: r.CPUSeconds, MemoryGiBSeconds: r.MemoryGiBSeconds, SandboxSeconds: r.SandboxSeconds,
		EgressBytes: r.EgressBytesUp + r.EgressBytesDown, EgressBytesUp: r.EgressBytesUp, EgressBytesDown: r.EgressBytesDown,
		Commands: r.Commands, Sandboxes: r.Sandboxes}
}

// usageGroupings are the values of ?by=.
var usageGroupings = map[string]bool{"": true, store.UsageByTeam: true, store.UsageByAgent: true, store.UsageByTask: true, store.UsageBySandbox: true}

// usageReport serves GET /v1/usage?team=&since=&until=&by=: the usage of
// the caller's team (an admin's ?team=NAME or ?team=all: that team, every
// team). since and until are RFC 3339 times or Go durations back from now
// (1h, 90m); by is team, agent, task or sandbox.
func (s *Server) usageReport(w http.ResponseWriter, r *http.Request) {
	sc := scopeFrom(r.Context())
	q := r.URL.Query()
	now := time.Now()
	since, err := parseWhen("since", q.Get("since"), now)
	var until time.Time
	if err == nil {
		until, err = parseWhen("until", q.Get("until"), now)
	}
	by := q.Get("by")
	switch {
	case err != nil:
	case !usageGroupings[by]:
		err = errors.New("by must be team, agent, task or sandbox")
	case !since.IsZero() && !until.IsZero() && !since.Before(until):
		err = errors.New("since must be before until")
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidArgument, err.Error())
		return
	}
	uq := usage.Query{Team: sc.filter(), Since: since, Until: until, By: by}
	var rep *usage.Report
	if s.cfg.Usage != nil {
		rep, err = s.cfg.Usage.Report(r.Context(), uq)
	} else {
		rep, err = usage.ReportFrom(r.Context(), s.store, uq, now)
	}
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	v := usageReportView{Team: sc.filter(), GranularityS: int(store.UsageBucket / time.Second), By: by,
		Totals: amountsOf(&rep.Totals), Rows: make([]usageRowOut, 0, len(rep.Rows))}
	if v.Team == "" {
		v.Team = AllTeams
	}
	if !rep.Since.IsZero() {
		v.Since = &rep.Since
	}
	if !rep.Until.IsZero() {
		v.Until = &rep.Until
	}
	for _, row := range rep.Rows {
		out := usageRowOut{Team: row.Team, UsageAmounts: amountsOf(row)}
		switch by {
		case store.UsageBySandbox:
			out.Sandbox, out.Task, out.Agent = row.Sandbox, row.Task, row.Agent
		case store.UsageByTask:
			out.Task, out.Agent = row.Task, row.Agent
		case store.UsageByAgent:
			out.Agent = row.Agent
		}
		v.Rows = append(v.Rows, out)
	}
	writeJSON(w, http.StatusOK, v)
}

// parseWhen reads a since or until parameter: an RFC 3339 time, or a Go
// duration (1h, 90m) back from now; "" is the zero time (unbounded).
func parseWhen(name, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			return time.Time{}, errors.New(name + " must be an RFC 3339 time or a positive duration (1h)")
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, errors.New(name + " must be an RFC 3339 time or a duration back from now (1h)")
	}
	return t, nil
}
