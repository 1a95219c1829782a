package api

import (
	"net/http"
	"time"

	"github.com/corralhq/corral/internal/watchdog"
)

// sampleView is one watchdog sample.
type sampleView struct {
	Time        string  `json:"time"`
	CPUPercent  float64 `json:"cpu_percent"`
	CPUSeconds  float64 `json:"cpu_seconds"`
	MemoryBytes int64   `json:"memory_bytes"`
	DiskBytes   int64   `json:"disk_bytes"`
	Pids        int64   `json:"pids"`
	OOMKills    uint64  `json:"oom_kills"`
}

func sampleOut(s watchdog.Sample) sampleView {
	return sampleView{Time: ts(s.Time), CPUPercent: s.CPUPercent, CPUSeconds: s.CPUSeconds, MemoryBytes: s.MemoryBytes,
		DiskBytes: s.DiskBytes, Pids: s.Pids, OOMKills: s.OOMKills}
}

// sandboxMetrics serves GET /v1/sandboxes/{id}/metrics[?since=RFC3339]:
// the current sample, the recent series (one sample a second, up to five
// minutes) and the limits.
func (s *Server) sandboxMetrics(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	sb, err := s.mgr.Get(r.Context(), id)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if !s.mgr.Running(id) && !s.mgr.Paused(id) {
		writeError(w, http.StatusNotFound, CodeNotFound, "sandbox not found (it ended)")
		return
	}
	p := paramsOf(r)
	since := p.instant("since")
	if err := p.err(); err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := map[string]any{"limits": map[string]any{
		"cpu": sb.Resources.CPU, "memory_bytes": sb.Resources.MemoryMB << 20, "disk_bytes": sb.Resources.DiskMB << 20, "pids": sb.Resources.Pids,
	}}
	series := []sampleView{}
	if wd := s.mgr.Watchdog(); wd != nil {
		if cur, ok := wd.Latest(id); ok {
			out["current"] = sampleOut(cur)
		}
		for _, smp := range wd.Series(id, since) {
			series = append(series, sampleOut(smp))
		}
	}
	if _, ok := out["current"]; !ok {
		if st, err := s.mgr.Stats(id); err == nil {
			out["current"] = sampleView{Time: ts(time.Now()), CPUSeconds: st.CPUSeconds, MemoryBytes: st.MemoryBytes,
				DiskBytes: st.DiskBytes, Pids: st.Pids, OOMKills: st.OOMKills}
		}
	}
	out["series"] = series
	writeJSON(w, http.StatusOK, out)
}

// sandboxProcesses serves GET /v1/sandboxes/{id}/processes: the process
// tree as the host sees it (pid, ppid, user, cpu, rss, command).
func (s *Server) sandboxProcesses(w http.ResponseWriter, r *http.Request) {
	procs, err := s.mgr.Processes(r.PathValue("id"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"processes": procs})
}
