package api

import (
	"net/http"
	"time"

	"github.com/corralhq/corral/internal/sandbox"
)

// poolView is a warm pool as the API reports it.
type poolView struct {
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
	return poolView{Template: p.Template, Min: p.Min, Max: p.Max, MaxIdleS: int64(p.MaxIdle / time.Second), Idle: p.Idle,
		Target: p.Target, Hits: p.Hits, Misses: p.Misses, Refills: p.Refills, RefillMSAvg: p.RefillMSAvg,
		LastRefillMS: p.LastRefillMS, Evicted: p.Evicted}
}

func (s *Server) listPools(w http.ResponseWriter, r *http.Request) {
	out := []poolView{}
	for _, p := range s.mgr.Pools() {
		out = append(out, poolOut(p))
	}
	writeJSON(w, http.StatusOK, map[string]any{"pools": out})
}

func (s *Server) setPool(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Min      int   `json:"min"`
		Max      int   `json:"max"`
		MaxIdleS int64 `json:"max_idle_s"`
	}
	if !decodeJSON(w, r, &req) {
		return
	}
	st, err := s.mgr.SetPool(r.Context(), sandbox.PoolConfig{Template: r.PathValue("template"), Min: req.Min, Max: req.Max,
		MaxIdle: time.Duration(req.MaxIdleS) * time.Second})
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, poolOut(st))
}

func (s *Server) deletePool(w http.ResponseWriter, r *http.Request) {
	if _, err := s.mgr.SetPool(r.Context(), sandbox.PoolConfig{Template: r.PathValue("template")}); err != nil {
		s.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
