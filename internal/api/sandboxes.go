package api

import (
	"net/http"

	"time"

	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
)

// sandboxView is the JSON form of a sandbox (docs/api.md).
type sandboxView struct {
	ID string `json:"id"`
	// Team owns the sandbox.
	Team           string              `json:"team"`
	Template       string              `json:"template"`
	Runtime        string              `json:"runtime"`
	State          string              `json:"state"`
	Tier           string              `json:"tier"`
	Resources      store.Resources     `json:"resources"`
	CommandTimeout int64               `json:"command_timeout"`
	Network        string              `json:"network"`
	Allow          []string            `json:"allow"`
	Secrets        []string            `json:"secrets"`
	Metadata       map[string]string   `json:"metadata"`
	CreatedAt      string              `json:"created_at"`
	ExpiresAt      string              `json:"expires_at"`
	EndedAt        *string             `json:"ended_at"`
	EndReason      string              `json:"end_reason"`
	Task           string              `json:"task"`
	Snapshot       string              `json:"snapshot"`
	Volumes        []store.VolumeMount `json:"volumes"`
	// Node is the control plane that runs the sandbox (its --node-id).
	Node string `json:"node"`
	// PublicTraffic is false when the sandbox's ports are private;
	// TrafficToken is the token a request to one of them
	// carries in the e2b-traffic-access-token header.
	PublicTraffic bool   `json:"public_traffic"`
	TrafficToken  string `json:"traffic_token,omitempty"`
	// Warnings are set on create only (for example env vars that look
	// like secrets).
	Warnings []string `json:"warnings,omitempty"`
	// Current is the watchdog's newest sample of a running or paused
	// sandbox, set by list and get only (for live views such as
	// corral top: one request instead of one per sandbox); absent
	// before the first sample and once the sandbox ended.
	Current *sampleView `json:"current,omitempty"`
}

func ts(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

func view(sb *store.Sandbox) sandboxView {
	v := sandboxView{
		ID: sb.ID, Team: sb.Team, Template: sb.Template, Runtime: sb.Runtime, State: sb.State, Tier: sb.Tier,
		Resources: sb.Resources, CommandTimeout: int64(sb.CommandTimeout / time.Second),
		Network: sb.Network, Metadata: sb.Metadata, CreatedAt: ts(sb.CreatedAt),
		ExpiresAt: ts(sb.ExpiresAt), EndReason: sb.EndReason,
		Allow: sb.Egress.Allow, Secrets: sb.Egress.Secrets, Warnings: sb.Warnings, Task: sb.TaskID, Snapshot: sb.Snapshot,
		PublicTraffic: sb.TrafficToken == "", TrafficToken: sb.TrafficToken, Node: sb.Node,
	}
	if v.Allow == nil {
		v.Allow = []string{}
	}
	if v.Secrets == nil {
		v.Secrets = []string{}
	}
	if v.Metadata == nil {
		v.Metadata = map[string]string{}
	}
	v.Volumes = sb.Volumes
	if v.Volumes == nil {
		v.Volumes = []store.VolumeMount{}
	}
	if sb.EndedAt != nil {
		e := ts(*sb.EndedAt)
		v.EndedAt = &e
	}
	return v
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req sandbox.CreateRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	req.Team = callerTeam(r)
	sb, err := s.mgr.Create(r.Context(), req)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, view(sb))
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	p := paramsOf(r)
	var states []string
	switch st := p.oneOf("state", "", store.StateRunning, store.StatePaused, store.StateEnded, "all"); st {
	case "":
		states = []string{store.StateRunning, store.StatePaused}
	case "all":
	default:
		states = []string{st}
	}
	match := p.prefixed("metadata.")
	if err := p.err(); err != nil {
		s.writeErr(w, r, err)
		return
	}
	list, err := s.mgr.List(r.Context(), store.SandboxFilter{Team: scopeFrom(r.Context()).filter(), States: states}, match)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := make([]sandboxView, 0, len(list))
	for _, sb := range list {
		out = append(out, s.liveView(sb))
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.mgr.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.liveView(sb))
}

// liveView is view with the watchdog's newest sample of a sandbox that
// has not ended (read from memory: no call to the sandbox).
func (s *Server) liveView(sb *store.Sandbox) sandboxView {
	v := view(sb)
	if sb.State == store.StateEnded {
		return v
	}
	if wd := s.mgr.Watchdog(); wd != nil {
		if cur, ok := wd.Latest(sb.ID); ok {
			c := sampleOut(cur)
			v.Current = &c
		}
	}
	return v
}

func (s *Server) killSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.mgr.Kill(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, view(sb))
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Timeout int64 `json:"timeout"`
	}
	if !decodeJSON(w, r, &req) {
		return
	}
	if req.Timeout < 1 || req.Timeout > int64(sandbox.MaxTTL/time.Second) {
		writeError(w, http.StatusBadRequest, CodeInvalidArgument, "timeout must be between 1 and 86400 seconds")
		return
	}
	sb, err := s.mgr.SetTimeout(r.Context(), r.PathValue("id"), time.Duration(req.Timeout)*time.Second)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, view(sb))
}

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Persist bool `json:"persist"`
	}
	if r.ContentLength != 0 && !decodeJSON(w, r, &req) {
		return
	}
	sb, err := s.mgr.PauseWith(r.Context(), r.PathValue("id"), req.Persist)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, view(sb))
}

func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Timeout int64 `json:"timeout"`
	}
	if r.ContentLength != 0 && !decodeJSON(w, r, &req) {
		return
	}
	sb, err := s.mgr.Resume(r.Context(), r.PathValue("id"), time.Duration(req.Timeout)*time.Second)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, view(sb))
}

type commandView struct {
	ID          int64   `json:"id"`
	Command     string  `json:"command"`
	Cwd         string  `json:"cwd"`
	User        string  `json:"user"`
	StartedAt   string  `json:"started_at"`
	EndedAt     *string `json:"ended_at"`
	ExitCode    *int    `json:"exit_code"`
	StdoutBytes int64   `json:"stdout_bytes"`
	StderrBytes int64   `json:"stderr_bytes"`
	TimedOut    bool    `json:"timed_out"`
	EndReason   string  `json:"end_reason"`
}

func (s *Server) listCommands(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, err := s.mgr.Get(r.Context(), id); err != nil {
		s.writeErr(w, r, err)
		return
	}
	if s.cfg.Audit != nil {
		// A command's end record is written with its audit event: wait
		// for the events recorded before this request, so that a
		// command answered before it is listed with its end.
		s.cfg.Audit.Sync()
	}
	cmds, err := s.store.ListCommands(r.Context(), id)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := make([]commandView, 0, len(cmds))
	for _, c := range cmds {
		v := commandView{ID: c.ID, Command: c.Command, Cwd: c.Cwd, User: c.User, StartedAt: ts(c.StartedAt),
			ExitCode: c.ExitCode, StdoutBytes: c.StdoutBytes, StderrBytes: c.StderrBytes, TimedOut: c.TimedOut, EndReason: c.EndReason}
		if c.EndedAt != nil {
			e := ts(*c.EndedAt)
			v.EndedAt = &e
		}
		out = append(out, v)
	}
	writeJSON(w, http.StatusOK, map[string]any{"commands": out})
}
