package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sort"

	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/store"
)

// teamView is a team as GET /v1/teams and /v1/teams/{team}/quota report
// it: the quota in force, the admin's override of the server's defaults
// (only the fields it sets) and what its sandboxes use now.
type teamView struct {
	Team     string           `json:"team"`
	Quota    govern.TeamQuota `json:"quota"`
	Override store.TeamQuota  `json:"override"`
	Usage    govern.TeamStats `json:"usage"`
}

func (s *Server) teamOut(team string, o *store.TeamQuota) teamView {
	adm := s.mgr.Admission()
	v := teamView{Team: team, Quota: adm.TeamQuota(team), Usage: adm.TeamStats(team)}
	if o != nil {
		v.Override = *o
	}
	return v
}

// listTeams is GET /v1/teams (admin): every team named by an API key or a
// quota override, or running sandboxes, with its quota and usage.
func (s *Server) listTeams(w http.ResponseWriter, r *http.Request) {
	names, err := s.store.ListTeams(r.Context())
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	qs, err := s.store.ListTeamQuotas(r.Context())
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	overrides := map[string]*store.TeamQuota{}
	for _, q := range qs {
		overrides[q.Team] = q
	}
	seen := map[string]bool{}
	for _, n := range append(names, s.mgr.Admission().Teams()...) {
		seen[n] = true
	}
	out := make([]teamView, 0, len(seen))
	for n := range seen {
		out = append(out, s.teamOut(n, overrides[n]))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Team < out[j].Team })
	writeJSON(w, http.StatusOK, map[string]any{"teams": out})
}

// teamPath returns the {team} of the path, or writes the refusal of a
// name no team may have.
func (s *Server) teamPath(w http.ResponseWriter, r *http.Request) (string, bool) {
	team := r.PathValue("team")
	if err := store.ValidTeam(team); err != nil {
		s.writeErr(w, r, err)
		return "", false
	}
	return team, true
}

// getTeamQuota is GET /v1/teams/{team}/quota (admin).
func (s *Server) getTeamQuota(w http.ResponseWriter, r *http.Request) {
	team, ok := s.teamPath(w, r)
	if !ok {
		return
	}
	o, err := s.store.GetTeamQuota(r.Context(), team)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.teamOut(team, o))
}

// putTeamQuota is PUT /v1/teams/{team}/quota (admin): the body is the
// whole override (fields absent or null take the server's defaults; {}
// drops it). A bad value is refused naming its field, and nothing is
// stored. It applies to the team's next create.
func (s *Server) putTeamQuota(w http.ResponseWriter, r *http.Request) {
	team, ok := s.teamPath(w, r)
	if !ok {
		return
	}
	var body map[string]json.RawMessage
	if !decodeJSON(w, r, &body) {
		return
	}
	o, err := parseQuota(body)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	o.Team = team
	if err := s.mgr.SetTeamQuota(r.Context(), o); err != nil {
		s.writeErr(w, r, err)
		return
	}
	v := s.teamOut(team, &o)
	s.auditChange(r.Context(), "team.quota_set", map[string]any{"team": team, "override": v.Override})
	writeJSON(w, http.StatusOK, v)
}

// quotaInts are the override fields that take whole numbers.
var quotaInts = map[string]bool{"max_sandboxes": true, "max_per_agent": true, "max_memory_mb": true, "create_burst": true}

// parseQuota reads a quota override body field by field, so that every
// bad value (an unknown field, a string, a fraction where a count is
// meant) is an invalid_argument naming its field. The bounds are
// govern.ValidateQuota's.
func parseQuota(body map[string]json.RawMessage) (store.TeamQuota, error) {
	var o store.TeamQuota
	targets := map[string]any{
		"max_sandboxes": &o.MaxSandboxes, "max_per_agent": &o.MaxPerAgent, "max_cpus": &o.MaxCPUs,
		"max_memory_mb": &o.MaxMemoryMB, "create_rate": &o.CreateRate, "create_burst": &o.CreateBurst,
	}
	names := make([]string, 0, len(body))
	for k := range body {
		names = append(names, k)
	}
	sort.Strings(names) // the first bad field in a stable order
	for _, k := range names {
		raw := body[k]
		dst, known := targets[k]
		if !known {
			return o, &govern.InvalidError{Msg: fmt.Sprintf("unknown quota field %q (known: max_sandboxes, max_per_agent, max_cpus, max_memory_mb, create_rate, create_burst)", k)}
		}
		var v *float64
		if err := json.Unmarshal(raw, &v); err != nil {
			return o, &govern.InvalidError{Msg: fmt.Sprintf("%s must be a number or null", k)}
		}
		if v == nil {
			continue
		}
		if quotaInts[k] && (*v != math.Trunc(*v) || math.Abs(*v) > 1<<53) {
			return o, &govern.InvalidError{Msg: fmt.Sprintf("%s must be a whole number, not %g", k, *v)}
		}
		switch p := dst.(type) {
		case **float64:
			*p = v
		case **int64:
			n := int64(*v)
			*p = &n
		}
	}
	return o, nil
}
