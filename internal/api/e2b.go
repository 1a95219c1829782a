package api

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/corralhq/corral/internal/agentclient"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/volume"
	"github.com/corralhq/corral/proto/agentproto"
)

// E2B compatibility (docs/e2b.md): the REST
// control API of E2B under its own paths, and envd requests routed by the
// E2b-Sandbox-Id header (or a <port>-<id>.<domain> host name, or a signed
// /files URL) to the sandbox's agent, which is envd-compatible.

// EnvdVersion is the envd version corral's agent reports; the SDK gates
// features on it (docs/e2b-protocol.md §2.6).
const EnvdVersion = "0.6.13"

// EnvdPort is the port the SDK names in E2b-Sandbox-Port and host names.
const EnvdPort = 49983

func (s *Server) e2bRoutes() {
	s.mux.Handle("POST /sandboxes", s.e2bAuth(s.e2bCreate))
	s.mux.Handle("POST /v2/sandboxes", s.e2bAuth(s.e2bCreate))
	s.mux.Handle("GET /sandboxes", s.e2bAuth(s.e2bList))
	s.mux.Handle("GET /v2/sandboxes", s.e2bAuth(s.e2bList))
	s.mux.Handle("GET /sandboxes/{id}", s.e2bAuth(s.e2bScoped(sandboxObject, s.e2bGet)))
	s.mux.Handle("DELETE /sandboxes/{id}", s.e2bAuth(s.e2bScoped(sandboxObject, s.e2bKill)))
	s.mux.Handle("POST /sandboxes/{id}/timeout", s.e2bAuth(s.e2bScoped(sandboxObject, s.e2bTimeout)))
	s.mux.Handle("POST /volumes", s.e2bAuth(s.e2bCreateVolume))
	s.mux.Handle("GET /volumes", s.e2bAuth(s.e2bListVolumes))
	s.mux.Handle("GET /volumes/{id}", s.e2bAuth(s.e2bGetVolume))
	s.mux.Handle("DELETE /volumes/{id}", s.e2bAuth(s.e2bDeleteVolume))
	s.mux.Handle("POST /sandboxes/{id}/connect", s.e2bAuth(s.e2bScoped(sandboxObject, s.e2bConnect)))
	s.mux.Handle("POST /v2/sandboxes/{id}/connect", s.e2bAuth(s.e2bScoped(sandboxObject, s.e2bConnect)))
	s.mux.Handle("GET /sandboxes/{id}/metrics", s.e2bAuth(s.e2bScoped(sandboxObject, s.e2bMetrics)))
	s.mux.Handle("POST /sandboxes/{id}/pause", s.e2bAuth(s.e2bScoped(sandboxObject, s.e2bPause)))
	s.mux.Handle("POST /sandboxes/{id}/resume", s.e2bAuth(s.e2bScoped(sandboxObject, s.e2bConnect)))
	s.mux.Handle("PUT /sandboxes/{id}/network", s.e2bAuth(s.e2bScoped(sandboxObject, s.e2bUpdateNetwork)))
	s.mux.Handle("POST /sandboxes/{id}/snapshots", s.e2bAuth(s.e2bScoped(sandboxObject, s.e2bCreateSnapshot)))
	s.mux.Handle("GET /snapshots", s.e2bAuth(s.e2bListSnapshots))
	s.mux.Handle("DELETE /templates/{id}", s.e2bAuth(s.e2bScoped(e2bTemplateObject, s.e2bDeleteTemplate)))
	s.mux.Handle("GET /templates/aliases/{alias}", s.e2bAuth(s.e2bTemplateAlias))
	s.mux.Handle("POST /sandboxes/{id}/fork", s.e2bAuth(s.e2bScoped(sandboxObject, s.e2bFork)))
}

// e2bError writes E2B's error shape: {"code": <status>, "message": ...}.
// The SDK reads the numeric code, not the HTTP status, to detect 404s.
func e2bError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

// e2bSandbox is E2B's Sandbox object (create, connect).
type e2bSandbox struct {
	SandboxID       string  `json:"sandboxID"`
	TemplateID      string  `json:"templateID"`
	Alias           string  `json:"alias,omitempty"`
	ClientID        string  `json:"clientID"`
	EnvdVersion     string  `json:"envdVersion"`
	EnvdAccessToken string  `json:"envdAccessToken,omitempty"`
	Domain          *string `json:"domain"`
	// TrafficAccessToken is the token a request to a private sandbox's
	// port carries (null when its ports are public).
	TrafficAccessToken *string `json:"trafficAccessToken"`
}

// e2bDetail is E2B's SandboxDetail / ListedSandbox.
type e2bDetail struct {
	SandboxID       string            `json:"sandboxID"`
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias,omitempty"`
	ClientID        string            `json:"clientID"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int64             `json:"memoryMB"`
	DiskSizeMB      int64             `json:"diskSizeMB"`
	StartedAt       string            `json:"startedAt"`
	EndAt           string            `json:"endAt"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`
	// AllowInternetAccess is true for network mode all-public.
	AllowInternetAccess bool `json:"allowInternetAccess"`
	// Network lists the allow entries of mode allow.
	Network *e2bNetworkOut `json:"network,omitempty"`
	// Lifecycle says what happens at the timeout.
	Lifecycle e2bLifecycle `json:"lifecycle"`
	// VolumeMounts are the volumes the sandbox mounts.
	VolumeMounts []e2bVolumeMount `json:"volumeMounts,omitempty"`
}

// e2bVolumeMount is E2B's SandboxVolumeMount.
type e2bVolumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

type e2bLifecycle struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

type e2bNetworkOut struct {
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
	// AllowPublicTraffic is false for a sandbox with private ports
	// (omitted otherwise: E2B's default is public).
	AllowPublicTraffic *bool `json:"allowPublicTraffic,omitempty"`
}

func e2bSandboxOf(sb *store.Sandbox) e2bSandbox {
	v := e2bSandbox{SandboxID: sb.ID, TemplateID: sb.Template, Alias: sb.Template, ClientID: "corral",
		EnvdVersion: EnvdVersion, EnvdAccessToken: sb.AccessToken}
	if sb.TrafficToken != "" {
		v.TrafficAccessToken = &sb.TrafficToken
	}
	return v
}

func e2bDetailOf(sb *store.Sandbox, withToken bool) e2bDetail {
	d := e2bDetail{SandboxID: sb.ID, TemplateID: sb.Template, Alias: sb.Template, ClientID: "corral",
		CPUCount: max(1, int(math.Ceil(sb.Resources.CPU))), MemoryMB: sb.Resources.MemoryMB, DiskSizeMB: sb.Resources.DiskMB,
		StartedAt: ts(sb.CreatedAt), EndAt: ts(sb.ExpiresAt), EnvdVersion: EnvdVersion,
		Metadata: sb.Metadata, State: sb.State, AllowInternetAccess: sb.Network == "all-public",
		Lifecycle: e2bLifecycle{OnTimeout: "kill"}}
	if sb.Lifecycle.AutoPause {
		d.Lifecycle.OnTimeout = "pause"
	}
	if sb.Network == "allow" {
		d.Network = &e2bNetworkOut{AllowOut: sb.Egress.Allow, DenyOut: []string{"0.0.0.0/0"}}
	}
	if sb.TrafficToken != "" {
		if d.Network == nil {
			d.Network = &e2bNetworkOut{}
		}
		d.Network.AllowPublicTraffic = new(bool)
	}
	if d.Metadata == nil {
		d.Metadata = map[string]string{}
	}
	for _, vm := range sb.Volumes {
		d.VolumeMounts = append(d.VolumeMounts, e2bVolumeMount{Name: vm.Name, Path: vm.Path})
	}
	if withToken {
		d.EnvdAccessToken = sb.AccessToken
	}
	return d
}

type e2bNewSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *e2bNetworkConfig `json:"network"`
	AutoPause           *bool             `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	Secure              *bool             `json:"secure"`
	MCP                 json.RawMessage   `json:"mcp"`
	VolumeMounts        []e2bVolumeMount  `json:"volumeMounts"`
}

// e2bBody decodes a bounded JSON body by the rule of parseJSON, tolerating
// unknown fields (the SDK adds fields over time) and an empty body.
func e2bBody(w http.ResponseWriter, r *http.Request, v any) bool {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxJSONBody))
	if err == nil && len(bytes.TrimSpace(data)) == 0 {
		return true
	}
	if err == nil {
		err = parseJSON(data, v, false)
	}
	if err != nil {
		f := bodyFailure(err)
		e2bError(w, f.status, f.msg)
		return false
	}
	return true
}

func (s *Server) e2bCreate(w http.ResponseWriter, r *http.Request) {
	var req e2bNewSandbox
	if !e2bBody(w, r, &req) {
		return
	}
	if len(req.MCP) > 0 && string(req.MCP) != "null" {
		e2bError(w, http.StatusBadRequest, "MCP gateway sandboxes are not supported by corral")
		return
	}
	ttl := int64(300)
	if req.Timeout != nil {
		ttl = *req.Timeout
	}
	mode, allow, err := e2bPolicy(req.AllowInternetAccess, req.Network, s.cfg.E2BInternet)
	if err != nil {
		e2bError(w, http.StatusBadRequest, err.Error())
		return
	}
	public := e2bPublicTraffic(req.Network)
	cr := sandbox.CreateRequest{Team: callerTeam(r), Template: req.TemplateID, Timeout: &ttl, Metadata: req.Metadata, Env: req.EnvVars,
		Network: mode, Allow: allow, PublicTraffic: public,
		// lifecycle.onTimeout "pause": E2B keeps memory unless keepMemory is false.
		AutoPause: req.AutoPause != nil && *req.AutoPause, PauseMemory: req.AutoPauseMemory == nil || *req.AutoPauseMemory}
	for _, vm := range req.VolumeMounts {
		cr.Volumes = append(cr.Volumes, volume.Request{Volume: vm.Name, Path: vm.Path})
	}
	sb, err := s.mgr.Create(r.Context(), cr)
	if err != nil {
		s.e2bWriteErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, e2bSandboxOf(sb))
}

// e2bWriteErr answers err in E2B's shape ({"code": status, "message"})
// with the status of the native answer (classify). Refusals with a code
// of their own (capacity_exceeded, env_secret_refused, a brake's code)
// start the message with it, as clients match on it; an unknown template
// is E2B's 404; a capacity refusal carries Retry-After, so the SDK raises
// its RateLimitError and waits.
func (s *Server) e2bWriteErr(w http.ResponseWriter, r *http.Request, err error) {
	f := classify(err)
	switch {
	case f.internalError:
		s.log.Error("e2b request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	case f.capacity != nil:
		setRetryAfter(w, f.capacity)
		f.msg = f.capacity.Error()
	case f.code == CodeInvalidArgument && strings.Contains(f.msg, "no such template"):
		f.status = http.StatusNotFound
	case f.code != CodeInvalidArgument && f.code != CodeNotFound && f.code != CodeConflict &&
		f.code != CodeNetworkUnavailable && f.code != CodeVolumesUnavailable:
		f.msg = f.code + ": " + f.msg
	}
	e2bError(w, f.status, f.msg)
}

// e2bRunning returns the record of a running or paused sandbox or writes
// E2B's 404.
func (s *Server) e2bRunning(w http.ResponseWriter, r *http.Request) (*store.Sandbox, bool) {
	id := r.PathValue("id")
	if !s.mgr.Running(id) && !s.mgr.Paused(id) {
		e2bError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", id))
		return nil, false
	}
	sb, err := s.mgr.Get(r.Context(), id)
	if err != nil {
		e2bError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", id))
		return nil, false
	}
	return sb, true
}

func (s *Server) e2bGet(w http.ResponseWriter, r *http.Request) {
	if sb, ok := s.e2bRunning(w, r); ok {
		writeJSON(w, http.StatusOK, e2bDetailOf(sb, true))
	}
}

func (s *Server) e2bKill(w http.ResponseWriter, r *http.Request) {
	if _, err := s.mgr.Kill(r.Context(), r.PathValue("id")); err != nil {
		if errors.Is(err, sandbox.ErrNotFound) {
			e2bError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", r.PathValue("id")))
			return
		}
		s.e2bWriteErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) e2bTimeout(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Timeout int64 `json:"timeout"`
	}
	if !e2bBody(w, r, &req) {
		return
	}
	if req.Timeout < 1 || req.Timeout > int64(sandbox.MaxTTL/time.Second) {
		e2bError(w, http.StatusBadRequest, "timeout must be between 1 and 86400 seconds")
		return
	}
	if _, err := s.mgr.SetTimeout(r.Context(), r.PathValue("id"), time.Duration(req.Timeout)*time.Second); err != nil {
		s.e2bGoneErr(w, r, r.PathValue("id"), err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) e2bConnect(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Timeout *int64 `json:"timeout"`
	}
	if !e2bBody(w, r, &req) {
		return
	}
	if _, ok := s.e2bRunning(w, r); !ok {
		return
	}
	ttl := int64(300)
	if req.Timeout != nil {
		ttl = *req.Timeout
	}
	if ttl < 1 || ttl > int64(sandbox.MaxTTL/time.Second) {
		e2bError(w, http.StatusBadRequest, "timeout must be between 1 and 86400 seconds")
		return
	}
	id := r.PathValue("id")
	if s.mgr.Paused(id) { // connect resumes a paused sandbox: 201
		sb, err := s.mgr.Resume(r.Context(), id, time.Duration(ttl)*time.Second)
		switch {
		case err == nil:
			writeJSON(w, http.StatusCreated, e2bSandboxOf(sb))
			return
		case errors.Is(err, sandbox.ErrConflict) && !strings.HasSuffix(r.URL.Path, "/resume"):
			// Another connect resumed it first: connect to the running
			// sandbox below.
		default:
			s.e2bStateErr(w, r, id, err, fmt.Sprintf("sandbox %q is already running", id))
			return
		}
	}
	if strings.HasSuffix(r.URL.Path, "/resume") {
		e2bError(w, http.StatusConflict, fmt.Sprintf("sandbox %q is already running", id))
		return
	}
	sb, err := s.mgr.ExtendTimeout(r.Context(), id, time.Duration(ttl)*time.Second)
	if err != nil {
		s.e2bGoneErr(w, r, id, err)
		return
	}
	writeJSON(w, http.StatusOK, e2bSandboxOf(sb))
}

// e2bGoneErr answers a failed timeout change: 503 (e2bWriteErr) once the
// server is shutting down, else E2B's 404 for a sandbox that is not
// running.
func (s *Server) e2bGoneErr(w http.ResponseWriter, r *http.Request, id string, err error) {
	if errors.Is(err, sandbox.ErrShuttingDown) {
		s.e2bWriteErr(w, r, err)
		return
	}
	e2bError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", id))
}

// e2bPause freezes a sandbox (memory kept): 204, 409 if already paused.
func (s *Server) e2bPause(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Memory *bool `json:"memory"`
	}
	if !e2bBody(w, r, &req) {
		return
	}
	id := r.PathValue("id")
	// keepMemory false: persist the files, stop the processes.
	_, err := s.mgr.PauseWith(r.Context(), id, req.Memory != nil && !*req.Memory)
	if err != nil {
		s.e2bStateErr(w, r, id, err, fmt.Sprintf("sandbox %q is already paused", id))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// e2bStateErr answers a failed pause or resume: 409 with the manager's
// explanation (or conflict when it has none), 404 for a sandbox that is
// gone or ended during the call, else what e2bWriteErr answers.
func (s *Server) e2bStateErr(w http.ResponseWriter, r *http.Request, id string, err error, conflict string) {
	var ce *sandbox.ConflictError
	switch {
	case errors.As(err, &ce):
		e2bError(w, http.StatusConflict, ce.Msg)
	case errors.Is(err, sandbox.ErrConflict):
		e2bError(w, http.StatusConflict, conflict)
	case errors.Is(err, sandbox.ErrNotFound), errors.Is(err, store.ErrNotFound):
		e2bError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", id))
	default:
		// Everything else as the native API answers it (classify): a
		// driver that cannot pause or snapshot (Kubernetes) is 501
		// not_supported, a server shutting down 503; only the unexpected
		// is a 500 (logged).
		s.e2bWriteErr(w, r, err)
	}
}

func (s *Server) e2bMetrics(w http.ResponseWriter, r *http.Request) {
	sb, ok := s.e2bRunning(w, r)
	if !ok {
		return
	}
	cpus := max(sb.Resources.CPU, 0.01)
	// The watchdog's one-second history, within start..end (unix seconds)
	// when given; without a range and before the first sample, a reading
	// taken now.
	p := paramsOf(r)
	var from, to time.Time
	if v, ok := p.integer("start", 0, 0, maxUnixSeconds); ok {
		from = time.Unix(v, 0)
	}
	if v, ok := p.integer("end", 0, 0, maxUnixSeconds); ok {
		to = time.Unix(v, 0).Add(time.Second)
		if !from.IsZero() && !from.Before(to) {
			p.refuse("start", "must not be after end")
		}
	}
	if err := p.err(); err != nil {
		s.e2bWriteErr(w, r, err)
		return
	}
	if wd := s.mgr.Watchdog(); wd != nil {
		out := []map[string]any{}
		for _, smp := range wd.Series(sb.ID, time.Time{}) {
			if (!from.IsZero() && smp.Time.Before(from)) || (!to.IsZero() && !smp.Time.Before(to)) {
				continue
			}
			out = append(out, e2bMetric(sb, smp.Time, smp.CPUPercent/cpus, smp.MemoryBytes, smp.DiskBytes))
		}
		if len(out) > 0 || !from.IsZero() || !to.IsZero() {
			writeJSON(w, http.StatusOK, out)
			return
		}
	}
	st, err := s.mgr.Stats(sb.ID)
	if err != nil {
		writeJSON(w, http.StatusOK, []any{})
		return
	}
	now := time.Now().UTC()
	// CPU use since the previous sample of this sandbox (or since start).
	prevT, prevCPU := sb.CreatedAt, 0.0
	s.cpuMu.Lock()
	if p, ok := s.cpuPrev[sb.ID]; ok && now.Sub(p.at) > 100*time.Millisecond {
		prevT, prevCPU = p.at, p.cpu
	}
	if len(s.cpuPrev) > 4096 {
		clear(s.cpuPrev)
	}
	s.cpuPrev[sb.ID] = cpuSample{at: now, cpu: st.CPUSeconds}
	s.cpuMu.Unlock()
	used := (st.CPUSeconds - prevCPU) / math.Max(now.Sub(prevT).Seconds(), 1e-3) / cpus * 100
	writeJSON(w, http.StatusOK, []map[string]any{e2bMetric(sb, now, used, st.MemoryBytes, st.DiskBytes)})
}

// e2bMetric is one SandboxMetric; cpuPct is in percent of the quota.
func e2bMetric(sb *store.Sandbox, at time.Time, cpuPct float64, mem, disk int64) map[string]any {
	at = at.UTC()
	return map[string]any{
		"timestamp": ts(at), "timestampUnix": at.Unix(), "cpuCount": max(1, int(math.Ceil(sb.Resources.CPU))),
		"cpuUsedPct": math.Max(0, math.Min(cpuPct, 100)), "memUsed": mem, "memTotal": sb.Resources.MemoryMB << 20,
		"memCache": 0, "diskUsed": disk, "diskTotal": sb.Resources.DiskMB << 20,
	}
}

// cpuSample is the last CPU reading of a sandbox's metrics.
type cpuSample struct {
	at  time.Time
	cpu float64
}

// e2bList serves GET /v2/sandboxes (and v1 GET /sandboxes): running
// sandboxes filtered by metadata, state, startedAfter and template,
// ordered by start time, paginated with X-Next-Token.
func (s *Server) e2bList(w http.ResponseWriter, r *http.Request) {
	p := paramsOf(r)
	match, err := parseE2BMetadata(p.str("metadata"))
	if err != nil {
		p.refuse("metadata", "%s", err)
	}
	states := p.listOf("state", store.StateRunning, store.StatePaused)
	if states == nil {
		states = []string{store.StateRunning, store.StatePaused}
	}
	after := p.instant("startedAfter")
	limit64, _ := p.integer("limit", 100, 1, 100)
	limit := int(limit64)
	offset := p.offsetToken("nextToken")
	tmpl := p.str("template")
	asc := p.oneOf("order", "desc", "asc", "desc") == "asc"
	if err := p.err(); err != nil {
		s.e2bWriteErr(w, r, err)
		return
	}
	all, err := s.mgr.List(r.Context(), store.SandboxFilter{Team: scopeFrom(r.Context()).filter(), States: states}, match)
	if err != nil {
		e2bError(w, http.StatusInternalServerError, "internal error")
		return
	}
	items := make([]*store.Sandbox, 0, len(all))
	for _, sb := range all {
		if (tmpl == "" || sb.Template == tmpl) && !sb.CreatedAt.Before(after) && (s.mgr.Running(sb.ID) || s.mgr.Paused(sb.ID)) {
			items = append(items, sb)
		}
	}
	sort.SliceStable(items, func(i, j int) bool {
		if asc {
			return items[i].CreatedAt.Before(items[j].CreatedAt)
		}
		return items[i].CreatedAt.After(items[j].CreatedAt)
	})
	page := items[min(offset, len(items)):]
	next := ""
	if len(page) > limit {
		page = page[:limit]
		next = offsetTokenOf(offset + limit)
	}
	out := make([]e2bDetail, 0, len(page))
	for _, sb := range page {
		out = append(out, e2bDetailOf(sb, false))
	}
	w.Header().Set("X-Next-Token", next)
	w.Header().Set("X-Total-Running", strconv.Itoa(len(items)))
	writeJSON(w, http.StatusOK, out)
}

// parseE2BMetadata decodes the SDK's doubly encoded metadata filter
// (docs/e2b-protocol.md §2.5): after query decoding, unescape once more, split on
// & and =, unescape key and value again.
func parseE2BMetadata(raw string) (map[string]string, error) {
	out := map[string]string{}
	if raw == "" {
		return out, nil
	}
	s, err := url.QueryUnescape(raw)
	if err != nil {
		s = raw
	}
	for _, pair := range strings.Split(s, "&") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, fmt.Errorf("pair %s has no '=': give key=value pairs joined by '&'", got(pair))
		}
		if k, err = url.QueryUnescape(k); err != nil {
			return nil, fmt.Errorf("key %s: %w", got(k), err)
		}
		if v, err = url.QueryUnescape(v); err != nil {
			return nil, fmt.Errorf("value of %s: %w", got(k), err)
		}
		if k == "" {
			return nil, errors.New("a pair has an empty key")
		}
		if msg := badText(k + v); msg != "" {
			return nil, fmt.Errorf("pair %s: %s", got(k), msg)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("key %s given more than once", got(k))
		}
		out[k] = v
	}
	return out, nil
}

// e2bNotFound is the proxy's answer for an unknown, ended or paused
// sandbox: HTTP 502 with E2B's exact body (docs/e2b-protocol.md §5).
func e2bNotFound(w http.ResponseWriter, id string) {
	writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": id, "message": "The sandbox was not found", "code": 502})
}

const e2bUnauthorized = "unauthorized access, please provide a valid access token or method signing if supported"

// e2bEnvd routes an envd request for sandbox id to its agent, after
// checking the sandbox's access token (or, on /files, leaving a URL
// signature to the agent, which verifies it with the same token); the
// request then carries a CredSandbox Identity. It defends against a
// caller without the sandbox's token reaching its processes and files.
func (s *Server) e2bEnvd(w http.ResponseWriter, r *http.Request, id string) {
	token, ok := s.mgr.AccessToken(id)
	if !ok {
		e2bNotFound(w, id)
		return
	}
	ctx := withSandboxID(r.Context(), id)
	switch got := r.Header.Get(agentproto.AccessTokenHeader); {
	case r.URL.Path == "/health":
	case got != "":
		if !sameSecret(got, token) {
			e2bError(w, http.StatusUnauthorized, e2bUnauthorized)
			return
		}
	case r.URL.Path == "/files":
		ctx = agentclient.WithoutToken(ctx) // the agent checks the signature
	default:
		e2bError(w, http.StatusUnauthorized, e2bUnauthorized)
		return
	}
	ctx = withIdentity(ctx, Identity{Kind: CredSandbox, SandboxID: id})
	if r.URL.Path != "/health" {
		release, ok := s.sandboxStream(w, id)
		if !ok {
			return
		}
		defer release()
	}
	r2 := r.Clone(ctx)
	s.stripCredentials(r2, true)
	s.agent.ServeHTTP(w, r2)
}

// e2bSignedFiles serves a signed /files URL that names no sandbox (the
// SDK's uploadUrl/downloadUrl with E2B_SANDBOX_URL): the sandbox is the
// one whose token produced the signature.
//
// The request is unauthenticated and its path, user and expiry are the
// caller's to size, so the lookup defends against making the server work
// in proportion to them once per sandbox, or under the Manager's lock (as
// it did): a signature that cannot be one is refused before any hashing,
// the caller-sized prefix of the signed message is hashed once, and each
// live sandbox costs one clone of that state and a fixed-size tail (its
// token and the expiry, at most 20 digits), read from a lock-free copy of
// the tokens (sandbox.Manager.FindByToken). Every refusal is the same
// answer, 401 "invalid signature", whether the signature is malformed,
// made with a wrong token or for no sandbox there is.
func (s *Server) e2bSignedFiles(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	sig := q.Get("signature")
	if sig == "" {
		e2bError(w, http.StatusUnauthorized, "missing signature query parameter")
		return
	}
	exp := q.Get("signature_expiration")
	var id string
	if wellFormedSignature(sig, exp) {
		prefix := sha256.New()
		io.WriteString(prefix, q.Get("path")+":"+op+":"+q.Get("username")+":")
		id = s.mgr.FindByToken(func(token string) bool {
			return sameSecret(sig, signTail(prefix, token, exp))
		})
	}
	if id == "" || !s.mgr.Running(id) {
		e2bError(w, http.StatusUnauthorized, "invalid signature")
		return
	}
	release, ok := s.sandboxStream(w, id)
	if !ok {
		return
	}
	defer release()
	r2 := r.Clone(agentclient.WithoutToken(withIdentity(withSandboxID(r.Context(), id), Identity{Kind: CredSandbox, SandboxID: id})))
	s.stripCredentials(r2, true)
	s.agent.ServeHTTP(w, r2)
}

// signatureLen is the length of a v1 signature: "v1_" and the unpadded
// base64 of a SHA-256 sum.
const signatureLen = 3 + 43

// wellFormedSignature reports whether sig and exp can be a v1 signature
// and its expiry (unix seconds, at most 20 digits), so that anything else
// is refused without hashing.
func wellFormedSignature(sig, exp string) bool {
	if len(sig) != signatureLen || !strings.HasPrefix(sig, "v1_") || len(exp) > 20 {
		return false
	}
	for _, c := range exp {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// signTail finishes envd's v1 URL signature (docs/e2b-protocol.md §4.4),
// v1_ and base64(sha256("path:op:user:token[:exp]")), from the hash of its
// prefix "path:op:user:", which it leaves unchanged.
func signTail(prefix hash.Hash, token, exp string) string {
	h, err := prefix.(hash.Cloner).Clone()
	if err != nil {
		panic(err) // crypto/sha256 always clones
	}
	io.WriteString(h, token)
	if exp != "" {
		io.WriteString(h, ":"+exp)
	}
	return agentproto.FormatSignature(h.Sum(nil))
}

// e2bHost parses a <port>-<id>.<domain> host name.
func e2bHost(host string) (port int, id string, ok bool) {
	if h, _, found := strings.Cut(host, ":"); found {
		host = h
	}
	label, _, found := strings.Cut(host, ".")
	if !found {
		return 0, "", false
	}
	p, id, found := strings.Cut(label, "-")
	if !found || id == "" {
		return 0, "", false
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return 0, "", false
	}
	return port, id, true
}
