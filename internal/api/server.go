// Package api is corral's HTTP front: authentication, request bounds, the
// native REST API under /v1 and the proxy to each sandbox's agent. It maps
// errors to stable JSON codes and never returns host paths or stack traces.
package api

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corralhq/corral/internal/audit"
	"github.com/corralhq/corral/internal/console"
	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template/registry"
	"github.com/corralhq/corral/internal/usage"
	"github.com/corralhq/corral/internal/volume"
)

// Config configures the API server.
type Config struct {
	// MaxOutput is how many bytes of stdout and of stderr an exec call
	// returns (the tail is kept). Default 1 MiB.
	MaxOutput int
	// E2BInternet is the network mode ("none" or "all-public") of an E2B
	// sandbox created with internet access (allow_internet_access true or
	// absent, no allowOut). Default "none": corral is default-deny.
	E2BInternet string
	// Redactor learns the values of secrets registered through the API.
	Redactor *egress.Redactor
	// Audit is the audit log (read by GET /v1/audit, written on secret
	// changes).
	Audit *audit.Log
	// Governor keeps tasks (nil: the /v1/tasks routes answer 503).
	Governor *govern.Governor
	// Metrics serves GET /metrics (Prometheus text format) to callers
	// with an API key; nil leaves the route out.
	Metrics http.Handler
	// StallTimeout is how long one read of a request body or one write
	// of a response may block before the connection is cut (default
	// DefaultStallTimeout, 1 min; negative: never).
	StallTimeout time.Duration
	// MaxStreamsPerKey is how many streams one API key (or one
	// sandbox's envd credential) may hold open at once; more are refused
	// with 429 too_many_streams (default DefaultMaxStreamsPerKey, 256).
	MaxStreamsPerKey int
	// Templates is the template registry (the /v1/templates routes and
	// E2B's template alias check).
	Templates *registry.Registry
	// Volumes is the server's volume service (nil: one without a file
	// system, whose calls answer volumes_unavailable).
	Volumes *volume.Service
	// Usage is the usage meter GET /v1/usage flushes before it reads
	// (nil: the route reads what the store holds).
	Usage *usage.Meter
	// MaxEventStreamsPerKey is how many event streams (GET
	// /v1/events/stream) one API key may hold open at once; more are
	// refused with 429 too_many_streams (default
	// DefaultMaxEventStreamsPerKey, 8).
	MaxEventStreamsPerKey int
	// MaxEventStreamsPerTeam is how many event streams the keys of one
	// team may hold open at once together (default
	// DefaultMaxEventStreamsPerTeam, 32); MaxEventStreams how many the
	// server holds in all (default DefaultMaxEventStreams, 256). More are
	// refused with 429 too_many_streams.
	MaxEventStreamsPerTeam, MaxEventStreams int
	// EventHeartbeat is how often an idle event stream sends a comment
	// and re-checks its key (default DefaultEventHeartbeat, 15 s).
	EventHeartbeat time.Duration
}

// Server serves the API.
type Server struct {
	cfg   Config
	mgr   *sandbox.Manager
	vols  *volume.Service
	store *store.Store
	log   *slog.Logger
	mux   *http.ServeMux
	agent http.Handler
	ports http.Handler
	gov   *govern.Governor
	// templates is the template registry.
	templates *registry.Registry
	// streams bounds the open streams per credential.
	streams *streamLimit
	// eventStreams bounds the open event streams per API key, per team
	// and in all.
	eventStreams *eventStreamLimits
	// ending is closed by EndEventStreams: every event stream returns.
	ending     chan struct{}
	endingOnce sync.Once
	// handler is the routing with the progress deadlines around it.
	handler http.Handler
	// mcp holds the MCP sessions' state (mcp.go).
	mcp *mcpSessions

	cpuMu sync.Mutex
	// cpuPrev holds the previous metrics sample per sandbox; guarded by cpuMu.
	cpuPrev map[string]cpuSample
}

// New returns a Server.
func New(cfg Config, mgr *sandbox.Manager, st *store.Store, log *slog.Logger) *Server {
	if cfg.MaxOutput <= 0 {
		cfg.MaxOutput = DefaultMaxOutput
	}
	if cfg.StallTimeout == 0 {
		cfg.StallTimeout = DefaultStallTimeout
	}
	if cfg.MaxEventStreamsPerKey <= 0 {
		cfg.MaxEventStreamsPerKey = DefaultMaxEventStreamsPerKey
	}
	if cfg.MaxEventStreamsPerTeam <= 0 {
		cfg.MaxEventStreamsPerTeam = DefaultMaxEventStreamsPerTeam
	}
	if cfg.MaxEventStreams <= 0 {
		cfg.MaxEventStreams = DefaultMaxEventStreams
	}
	if cfg.EventHeartbeat <= 0 {
		cfg.EventHeartbeat = DefaultEventHeartbeat
	}
	if cfg.Volumes == nil {
		cfg.Volumes = volume.NewService(nil, st, nil, log)
	}
	s := &Server{cfg: cfg, mgr: mgr, vols: cfg.Volumes, store: st, log: log, mux: http.NewServeMux(), cpuPrev: map[string]cpuSample{}, gov: cfg.Governor, templates: cfg.Templates,
		streams: newStreamLimit(cfg.MaxStreamsPerKey), eventStreams: newEventStreamLimits(cfg.MaxEventStreamsPerKey, cfg.MaxEventStreamsPerTeam, cfg.MaxEventStreams), ending: make(chan struct{})}
	s.handler = progressDeadlines(cfg.StallTimeout, http.HandlerFunc(s.route))
	s.agent = newAgentProxy(mgr, log)
	s.ports = newPortProxy(mgr, log)
	s.routes()
	return s
}

func (s *Server) routes() {
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	if s.cfg.Metrics != nil {
		// Every team's sandboxes and counters: admin only.
		s.mux.Handle("GET /metrics", s.admin(s.cfg.Metrics.ServeHTTP))
	}
	s.mux.Handle("/volumecontent/", s.volumeContent())
	s.mux.Handle("POST /v1/volumes", s.auth(s.createVolume))
	s.mux.Handle("GET /v1/volumes", s.auth(s.listVolumes))
	s.mux.Handle("GET /v1/volumes/{ref}", s.auth(s.getVolume))
	s.mux.Handle("DELETE /v1/volumes/{ref}", s.auth(s.deleteVolume))
	s.mux.Handle("POST /v1/sandboxes", s.auth(s.createSandbox))
	s.mux.Handle("GET /v1/sandboxes", s.auth(s.listSandboxes))
	s.mux.Handle("GET /v1/sandboxes/{id}", s.auth(s.scoped(sandboxObject, s.getSandbox)))
	s.mux.Handle("DELETE /v1/sandboxes/{id}", s.auth(s.scoped(sandboxObject, s.killSandbox)))
	s.mux.Handle("POST /v1/sandboxes/{id}/timeout", s.auth(s.scoped(sandboxObject, s.setTimeout)))
	s.mux.Handle("POST /v1/sandboxes/{id}/exec", s.auth(s.scoped(sandboxObject, s.streamed(s.exec))))
	s.mux.Handle("POST /v1/sandboxes/{id}/pause", s.auth(s.scoped(sandboxObject, s.pauseSandbox)))
	s.mux.Handle("POST /v1/sandboxes/{id}/resume", s.auth(s.scoped(sandboxObject, s.resumeSandbox)))
	s.mux.Handle("GET /v1/sandboxes/{id}/commands", s.auth(s.scoped(sandboxObject, s.listCommands)))
	s.mux.Handle("GET /v1/sandboxes/{id}/network", s.auth(s.scoped(sandboxObject, s.getNetwork)))
	s.mux.Handle("PUT /v1/sandboxes/{id}/network", s.auth(s.scoped(sandboxObject, s.setNetwork)))
	s.mux.Handle("GET /v1/secrets", s.auth(s.listSecrets))
	s.mux.Handle("PUT /v1/secrets/{name}", s.auth(s.putSecret))
	s.mux.Handle("DELETE /v1/secrets/{name}", s.auth(s.deleteSecret))
	s.mux.Handle("GET /v1/audit", s.auth(s.listAudit))
	s.mux.Handle("GET /v1/events/stream", s.auth(s.eventStream))
	s.mux.Handle("GET /v1/whoami", s.auth(s.whoami))
	// The operator console's static files: no data; the page calls the
	// API with the key its user signs in with (docs/console.md).
	s.mux.Handle("GET /ui/", console.Handler())
	s.mux.Handle("GET /v1/usage", s.auth(s.usageReport))
	s.mux.Handle("GET /v1/sandboxes/{id}/metrics", s.auth(s.scoped(sandboxObject, s.sandboxMetrics)))
	s.mux.Handle("GET /v1/sandboxes/{id}/processes", s.auth(s.scoped(sandboxObject, s.sandboxProcesses)))
	s.mux.Handle("POST /v1/sandboxes/{id}/snapshots", s.auth(s.scoped(sandboxObject, s.createSnapshot)))
	s.mux.Handle("POST /v1/sandboxes/{id}/fork", s.auth(s.scoped(sandboxObject, s.forkSandbox)))
	s.mux.Handle("GET /v1/snapshots", s.auth(s.listSnapshots))
	s.mux.Handle("GET /v1/snapshots/{id}", s.auth(s.scoped(snapshotObject, s.getSnapshot)))
	s.mux.Handle("DELETE /v1/snapshots/{id}", s.auth(s.scoped(snapshotObject, s.deleteSnapshot)))
	s.mux.Handle("GET /v1/templates", s.auth(s.listTemplates))
	s.mux.Handle("POST /v1/templates/builds", s.auth(s.streamed(s.buildTemplate)))
	// Reads a host directory (layout) or makes the host fetch from any
	// registry address: admin only.
	s.mux.Handle("POST /v1/templates/import", s.admin(s.streamed(s.importTemplate)))
	s.mux.Handle("POST /v1/sandboxes/{id}/template", s.auth(s.scoped(sandboxObject, s.saveTemplate)))
	s.mux.Handle("GET /v1/templates/{ref}/inspect", s.auth(s.templateScoped(false, s.inspectTemplate)))
	s.mux.Handle("GET /v1/templates/{ref}", s.auth(s.templateScoped(false, s.getTemplate)))
	s.mux.Handle("POST /v1/templates/{ref}/current", s.auth(s.templateScoped(true, s.useTemplate)))
	s.mux.Handle("POST /v1/templates/{ref}/publish", s.admin(s.templateScoped(true, s.publishTemplate)))
	s.mux.Handle("DELETE /v1/templates/{ref}", s.auth(s.templateScoped(true, s.deleteTemplate)))
	s.mux.Handle("GET /v1/pools", s.auth(s.listPools))
	s.mux.Handle("PUT /v1/pools/{template}", s.auth(s.setPool))
	s.mux.Handle("DELETE /v1/pools/{template}", s.auth(s.deletePool))
	s.mux.Handle("GET /v1/teams", s.admin(s.listTeams))
	s.mux.Handle("GET /v1/teams/{team}/quota", s.admin(s.getTeamQuota))
	s.mux.Handle("PUT /v1/teams/{team}/quota", s.admin(s.putTeamQuota))
	s.mux.Handle("POST /v1/tasks", s.auth(s.createTask))
	s.mux.Handle("GET /v1/tasks", s.auth(s.listTasks))
	s.mux.Handle("GET /v1/tasks/{id}", s.auth(s.scoped(taskObject, s.getTask)))
	s.mux.Handle("PATCH /v1/tasks/{id}", s.auth(s.scoped(taskObject, s.changeTask)))
	s.mux.Handle("DELETE /v1/tasks/{id}", s.auth(s.scoped(taskObject, s.endTask)))
	s.mux.Handle("POST /v1/tasks/{id}/tokens", s.auth(s.scoped(taskObject, s.reportTokens)))
	s.mux.Handle("POST /v1/sandboxes/{id}/code", s.auth(s.scoped(sandboxObject, s.streamed(s.runCode))))
	s.mux.Handle("GET /v1/sandboxes/{id}/code/contexts", s.auth(s.scoped(sandboxObject, s.codeContexts)))
	s.mux.Handle("POST /v1/sandboxes/{id}/code/contexts", s.auth(s.scoped(sandboxObject, s.codeContexts)))
	s.mux.Handle("POST /v1/sandboxes/{id}/code/contexts/{ctx}/restart", s.auth(s.scoped(sandboxObject, s.codeContexts)))
	s.mux.Handle("DELETE /v1/sandboxes/{id}/code/contexts/{ctx}", s.auth(s.scoped(sandboxObject, s.codeContexts)))
	s.mux.Handle("/v1/sandboxes/{id}/agent/", s.auth(s.scoped(sandboxObject, s.streamed(s.agentRoute))))
	s.mux.Handle("POST /v1/keys", s.admin(s.createKey))
	s.mux.Handle("GET /v1/keys", s.admin(s.listKeys))
	s.mux.Handle("DELETE /v1/keys/{id}", s.admin(s.revokeKey))
	s.toolRoutes()
	s.mcpRoutes()
	s.e2bRoutes()
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, CodeNotFound, "no such route: "+r.Method+" "+r.URL.Path)
	})
}

// ServeHTTP implements http.Handler: every request is routed with the
// progress deadlines of Config.StallTimeout.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// route routes a request. E2B envd traffic is recognised first: by the
// E2b-Sandbox-Id header, by a <port>-<id>.<domain> host name, or as a
// signed /files URL; everything else goes to the routes.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		// With E2B_SANDBOX_URL the SDK names the port in a header: envd's
		// (or none) for envd, another (the code interpreter's) for that
		// port of the sandbox.
		switch p := r.Header.Get("E2b-Sandbox-Port"); {
		case p == "" || p == strconv.Itoa(EnvdPort):
			isolateFiles(w, r.URL.Path)
			s.e2bEnvd(w, r, id)
		default:
			port, err := strconv.Atoi(p)
			if err != nil || port < 1 || port > 65535 {
				e2bError(w, http.StatusBadRequest, "E2b-Sandbox-Port must be a port number")
				return
			}
			s.sandboxPort(w, r, id, port)
		}
		return
	}
	if port, id, ok := e2bHost(r.Host); ok {
		if port == EnvdPort {
			isolateFiles(w, r.URL.Path)
			s.e2bEnvd(w, r, id)
		} else {
			s.sandboxPort(w, r, id, port)
		}
		return
	}
	if r.URL.Path == "/files" {
		isolateFiles(w, r.URL.Path)
		s.e2bSignedFiles(w, r)
		return
	}
	if strings.HasPrefix(r.URL.Path, "/v1/") {
		// Answers hold a team's records: no browser or proxy keeps them
		// (the console reads them with the operator's key).
		w.Header().Set("Cache-Control", "no-store")
	}
	s.mux.ServeHTTP(w, r)
}

// isolateFiles marks an answer of the agent's /files route (a sandbox's
// file, served on the API's origin, which is the console's) as a
// sandboxed document that may not be sniffed. It defends against an
// agent's HTML file run as a page of the console's origin — a signed
// /files URL opened in the browser could otherwise show a fake sign-in
// asking for the operator's key, or call the API from that origin: with
// CSP sandbox the browser gives it an opaque origin and runs no script.
func isolateFiles(w http.ResponseWriter, path string) {
	if path != "/files" {
		return
	}
	h := w.Header()
	h.Set("Content-Security-Policy", "sandbox; default-src 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
}

type ctxKey int

const sandboxIDKey ctxKey = 0

func withSandboxID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, sandboxIDKey, id)
}

func sandboxIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(sandboxIDKey).(string)
	return id
}
