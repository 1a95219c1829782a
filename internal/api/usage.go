package api

import (
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

// usageReport serves GET /v1/usage?team=&since=&until=&by=: the usage of
// the caller's team (an admin's ?team=NAME or ?team=all: that team, every
// team). since and until are RFC 3339 times or Go durations back from now
// (1h, 90m); by is team, agent, task or sandbox.
func (s *Server) usageReport(w http.ResponseWriter, r *http.Request) {
	sc := scopeFrom(r.Context())
	p := paramsOf(r)
	now := time.Now()
	since, until := p.when("since", now), p.when("until", now)
	by := p.oneOf("by", "", store.UsageByTeam, store.UsageByAgent, store.UsageByTask, store.UsageBySandbox)
	err := p.err()
	if err == nil && !since.IsZero() && !until.IsZero() && !since.Before(until) {
		err = &ParamError{Name: "since", Msg: "must be before until"}
	}
	if err != nil {
		s.writeErr(w, r, err)
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
