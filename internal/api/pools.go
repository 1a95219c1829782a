package api

import (
	"net/http"
	"time"

	"github.com/corralhq/corral/internal/sandbox"
)

// poolView is a warm pool as the API reports it.
type poolView struct {
	// Team owns the pool: its idle sandboxes serve that team's creates.
	Team         string  `json:"team"`
	Template     string  `json:"template"`
	Min          int     `json:"min"`
	Max          int     `json:"max"`
	MaxIdleS     int64   `json:"max_idle_s"`
	Idle         int     `json:"idle"`
	Target       int     `json:"target"`
	Hits         int64   `json:"hits"`
	Misses       int64   `json:"misses"`
	Refills      int64   `json:"refills"`
	RefillMSAvg  float64 `json:"refill_ms_avg"`
	LastRefillMS float64 `json:"last_refill_ms"`
	Evicted      int64   `json:"evicted"`
}

func poolOut(p sandbox.PoolStats) poolView {
	return poolView{Team: p.Team, Template: p.Template, Min: p.Min, Max: p.Max, MaxIdleS: int64(p.MaxIdle / time.Second), Idle: p.Idle,
		Target: p.Target, Hits: p.Hits, Misses: p.Misses, Refills: p.Refills, RefillMSAvg: p.RefillMSAvg,
		LastRefillMS: p.LastRefillMS, Evicted: p.Evicted}
}

// listPools lists the pools of the request's scope.
func (s *Server) listPools(w http.ResponseWriter, r *http.Request) {
	sc := scopeFrom(r.Context())
	out := []poolView{}
	for _, p := range s.mgr.Pools() {
		if sc.sees(p.Team) {
			out = append(out, poolOut(p))
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"pools": out})
}

// setPool creates or changes the caller's own team's pool of a
// template; another team's pool of it is untouched.
func (s *Server) setPool(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Min      int   `json:"min"`
		Max      int   `json:"max"`
		MaxIdleS int64 `json:"max_idle_s"`
	}
	if !decodeJSON(w, r, &req) {
		return
	}
	st, err := s.mgr.SetPool(r.Context(), sandbox.PoolConfig{Team: callerTeam(r), Template: r.PathValue("template"), Min: req.Min, Max: req.Max,
		MaxIdle: time.Duration(req.MaxIdleS) * time.Second})
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, poolOut(st))
}

// deletePool removes the pool of a template of the request's scope (the
// caller's team, or the one an admin names with ?team=). Removing a pool
// that the team does not have answers as removing one it has, whether or
// not another team has one.
func (s *Server) deletePool(w http.ResponseWriter, r *http.Request) {
	team, ok := oneTeam(w, r, "pool")
	if !ok {
		return
	}
	if _, err := s.mgr.SetPool(r.Context(), sandbox.PoolConfig{Team: team, Template: r.PathValue("template")}); err != nil {
		s.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
