// Package sandbox is the sandbox manager: it validates create requests,
// starts sandboxes through a runtime driver, keeps each sandbox's record in
// the store, enforces lifetimes (TTL), notices sandboxes that died, and on
// start reconciles the records with what the host still holds.
package sandbox

import (
	"context"
	"errors"
	"fmt"

	"log/slog"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corralhq/corral/internal/agentclient"
	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/idgen"
	"github.com/corralhq/corral/internal/inroot"
	"github.com/corralhq/corral/internal/pool"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/safetext"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/volume"
	"github.com/corralhq/corral/internal/watchdog"
)

// Errors the API maps to stable codes.
var (
	// ErrNotFound: no such sandbox, or it has ended.
	ErrNotFound = errors.New("sandbox not found")
	// ErrConflict: the sandbox is not in a state that allows the call
	// (pausing a paused sandbox, resuming a running one).
	ErrConflict = errors.New("sandbox state does not allow this")
)

// ConflictError is an ErrConflict with a specific explanation.
type ConflictError struct{ Msg string }

func (e *ConflictError) Error() string { return e.Msg }

// Unwrap makes errors.Is(err, ErrConflict) hold.
func (e *ConflictError) Unwrap() error { return ErrConflict }

// EnvSecretError refuses env vars that look like secrets (when the server
// is configured to refuse them).
type EnvSecretError struct{ Findings []egress.EnvFinding }

func (e *EnvSecretError) Error() string {
	names := make([]string, len(e.Findings))
	for i, f := range e.Findings {
		names[i] = f.Name + " (" + f.Why + ")"
	}
	return "env vars look like secrets: " + strings.Join(names, ", ") + "; register them with `corral secret set` and pass the secret's name instead"
}

// End reasons recorded for a sandbox.
const (
	EndKilled   = "killed"
	EndTTL      = "ttl"
	EndOOM      = "oom"
	EndError    = "error"
	EndOrphaned = "orphaned"
	EndShutdown = "shutdown"
	EndIdle     = "idle"
)

// Config configures a Manager.
type Config struct {
	// DefaultTemplate is used when a request names none (default "base").
	DefaultTemplate string
	// DefaultTTL is a sandbox's lifetime when the request gives none (300 s).
	DefaultTTL time.Duration
	// KillGrace is the time between SIGTERM and SIGKILL on kill (3 s).
	KillGrace time.Duration
	// WatchInterval is how often running sandboxes are checked for death (1 s).
	WatchInterval time.Duration
	// Gateway gives sandboxes their network (a *gateway.Gateway); nil
	// means networking is unavailable and only "none" is accepted.
	Gateway networkGateway
	// RemoteProxyEnv, when set (and Gateway nil), says that an egress
	// proxy elsewhere serves the sandboxes' networks (the kube driver's
	// `corral egress-proxy` Deployment, which reads each sandbox's policy
	// and secrets from the shared store on every request): networks other
	// than "none" are accepted, and such a sandbox gets these proxy
	// variables and its secrets' placeholders in its environment.
	RemoteProxyEnv map[string]string
	// RemoteCA is the remote egress proxy's CA certificate (PEM, never
	// its key): a sandbox that uses secrets gets it (runtime.Config's
	// TrustCA) and the trust variables of gateway.TrustEnv, as a local
	// sandbox gets the CA bind-mounted.
	RemoteCA []byte
	// EgressLimits are the per-sandbox egress caps (zero fields: defaults).
	EgressLimits egress.Limits
	// PrivatePorts makes the ports of a sandbox created without
	// PublicTraffic private (the server's --ports-default private).
	PrivatePorts bool
	// RefuseEnvSecrets refuses create requests whose env vars look like
	// secrets; by default they are accepted with a warning.
	RefuseEnvSecrets bool
	// Audit, when set, receives lifecycle and network events (an
	// *audit.Log).
	Audit auditRecorder
	// Governor, when set, keeps tasks: budgets, breakers, loop detection.
	Governor *govern.Governor
	// Admission limits running sandboxes globally and per agent; it is
	// the only capacity check, and a refusal is a *govern.CapacityError
	// (nil: an Admission with govern's defaults).
	Admission *govern.Admission
	// ArtifactDir receives artifacts archived from sandboxes of tripped
	// tasks before they are killed.
	ArtifactDir string
	// MaxOutput is the API's output limit per stream; commands whose
	// output exceeded it are recorded as truncated.
	MaxOutput int
	// IdleTimeout ends sandboxes with no command running and none started
	// or ended for this long (0: never). Recorded as end reason "idle".
	IdleTimeout time.Duration
	// Volumes are the volumes sandboxes mount (a *volume.Service; nil:
	// volumes are unavailable).
	Volumes volumes
	// MemoryPressure reports whether the host is short of memory, which
	// empties the warm pools and stops their refills (nil: available
	// memory below pool.MemoryFloor of the total, from /proc/meminfo).
	MemoryPressure func() bool
	// RunawayAction is what the watchdog's CPU-runaway rule does:
	// RunawayKillSandbox (default) or RunawayKillCommands.
	RunawayAction string
	// SnapshotDir holds snapshot layers ("" disables snapshots).
	SnapshotDir string
	// IDBase is the base of the server's uid range: the host uid/gid that
	// sandbox root maps to, which imported templates are shifted to and
	// volume files are owned from.
	IDBase uint32
	// OnCommand, when set, is called once for every command started in a
	// sandbox (the usage meter counts them), as its record is made.
	OnCommand func(sandbox string)
	// Node names this control plane in the records of the sandboxes it
	// runs (the server's --node-id; default DefaultNode()). It must be
	// stable across restarts (a restarted node adopts its own sandboxes)
	// and unique among the control planes sharing one store.
	Node string
	// ForeignGrace is how long another node's sandbox must be overdue
	// (past its TTL, or its Pod gone or ended) before this node ends it
	// under a shared driver: its own node, if alive, acts within a
	// death-check interval (default DefaultForeignGrace).
	ForeignGrace time.Duration
	// CreateDeadline bounds a create: another node's record younger than
	// this is never ended for want of a sandbox (its create may still be
	// starting the Pod). Default DefaultCreateDeadline.
	CreateDeadline time.Duration
	// GVisorLegacy says gVisor sandboxes run under a legacy runsc
	// (Debian's 2022 package, the fallback when the pinned build is
	// missing): they can have network none only and no volumes.
	GVisorLegacy bool
}

// Defaults of [Config] (docs/configuration.md).
const (
	// DefaultKillGrace is the time between SIGTERM and SIGKILL on kill.
	DefaultKillGrace = 3 * time.Second
	// DefaultWatchInterval is how often running sandboxes are checked for
	// a dead init.
	DefaultWatchInterval = time.Second
)

func (c *Config) setDefaults() {
	if c.DefaultTemplate == "" {
		c.DefaultTemplate = "base"
	}
	if c.DefaultTTL == 0 {
		c.DefaultTTL = 300 * time.Second
	}
	if c.KillGrace == 0 {
		c.KillGrace = DefaultKillGrace
	}
	if c.Admission == nil {
		c.Admission = govern.NewAdmission(govern.AdmissionConfig{})
	}
	if c.WatchInterval == 0 {
		c.WatchInterval = DefaultWatchInterval
	}
	if c.Node == "" {
		c.Node = DefaultNode()
	}
	if c.ForeignGrace <= 0 {
		c.ForeignGrace = DefaultForeignGrace
	}
	if c.CreateDeadline <= 0 {
		c.CreateDeadline = DefaultCreateDeadline
	}
}

// Manager owns the lifecycle of every sandbox.
type Manager struct {
	cfg       Config
	store     *store.Store
	driver    runtime.Driver
	templates TemplateRegistry
	log       *slog.Logger

	// mu guards live, closing, work and idle. It may be held while
	// calling the pools (never the other way round).
	mu sync.Mutex
	// live holds the sandboxes this process runs, by id.
	live map[string]*liveSandbox
	// closing is set by Shutdown: no create may start a sandbox after it.
	closing bool
	// work counts the work in flight that Shutdown waits for (see
	// beginWork); idle, made by a Shutdown waiting for it, is closed when
	// work drops to zero.
	work int
	idle chan struct{}
	// signers is a copy of the ids and access tokens of live, replaced
	// (under mu) whenever live changes and read without a lock by
	// FindByToken.
	signers atomic.Pointer[[]signer]

	clients agentclient.Cache

	// netMu serialises network changes (SetNetwork, RefreshSecrets).
	netMu sync.Mutex
	// tickets holds each live sandbox's admission ticket; guarded by mu.
	tickets map[string]*govern.Ticket
	// wd is the watchdog (SetWatchdog), nil until set.
	wd atomic.Pointer[watchdog.Watchdog]
	// pools are the warm pools.
	pools warmPools
	// shared: the driver's sandboxes are every node's (runtime.Shared).
	shared bool
	// foreignDead holds when another node's sandbox was first seen dead
	// (checkForeign); guarded by mu.
	foreignDead map[string]time.Time

	stop chan struct{}
	done chan struct{}
}

type liveSandbox struct {
	rec    *store.Sandbox
	pid    int
	timer  *time.Timer
	ending bool // Kill in progress; guarded by Manager.mu
	// ended is made when ending is set and closed when the end is
	// recorded (or failed), for a caller that waits for another's end
	// (EndIfDead). Guarded by Manager.mu.
	ended chan struct{}
	// paused: frozen, TTL clock stopped with remaining left; guarded by Manager.mu.
	paused    bool
	remaining time.Duration
	// stopped: a persisted pause stopped its processes; resume restarts
	// it from rec.Persisted. Guarded by Manager.mu.
	stopped bool
	// op serialises the calls that freeze, thaw, stop or copy the
	// sandbox (pause, resume, snapshot, save as template), so that one
	// never thaws what another froze. Taken before Manager.mu, never
	// while holding it.
	op sync.Mutex
	// lastActive is the last command start or end; running counts
	// commands in progress (for the idle limit). Guarded by Manager.mu.
	lastActive time.Time
	running    int
}

// New returns a Manager; call Reconcile before serving requests.
func New(cfg Config, st *store.Store, d runtime.Driver, t TemplateRegistry, log *slog.Logger) *Manager {
	cfg.setDefaults()
	if log == nil {
		log = slog.Default()
	}
	m := &Manager{cfg: cfg, store: st, driver: d, templates: t, log: log,
		live: map[string]*liveSandbox{}, tickets: map[string]*govern.Ticket{},
		shared: runtime.IsShared(d), foreignDead: map[string]time.Time{},
		stop: make(chan struct{}), done: make(chan struct{})}
	m.pools = pool.New(poolStarter{m}, st, cfg.Audit, cfg.MemoryPressure, log)
	go m.watch()
	return m
}

// CreateRequest is what a caller asks for.
type CreateRequest struct {
	Template       string            `json:"template"`
	Runtime        string            `json:"runtime"`
	Tier           string            `json:"tier"`
	Resources      *ResourceRequest  `json:"resources"`
	Timeout        *int64            `json:"timeout"`         // TTL seconds
	CommandTimeout *int64            `json:"command_timeout"` // seconds
	Env            map[string]string `json:"env"`
	Metadata       map[string]string `json:"metadata"`
	// Network is the egress mode: "none" (default), "allow", "all-public".
	Network string `json:"network"`
	// Allow lists domain patterns and CIDR:port rules for mode "allow".
	Allow []string `json:"allow"`
	// Secrets names registered secrets the sandbox may use through the
	// egress proxy; it sees only their placeholders.
	Secrets []string `json:"secrets"`
	// Task is the task (agent session) the sandbox belongs to; without
	// one, the sandbox gets its own implicit task.
	Task string `json:"task"`
	// Agent names the agent for admission limits and the audit log.
	Agent string `json:"agent"`
	// Snapshot starts the sandbox from a snapshot (its template with the
	// snapshot's layers on top) instead of the bare template.
	Snapshot string `json:"snapshot"`
	// AutoPause pauses the sandbox at the end of its TTL instead of
	// killing it; PauseMemory keeps its processes (cgroup freezer), else
	// its files are persisted and its processes stopped.
	AutoPause   bool `json:"auto_pause"`
	PauseMemory bool `json:"pause_memory"`
	// Volumes are mounted read-write in the sandbox.
	Volumes []volume.Request `json:"volumes"`
	// PublicTraffic false makes the sandbox's ports private: a request
	// to one must carry the sandbox's traffic token (E2B's
	// network.allowPublicTraffic). nil takes the server's default
	// (Config.PrivatePorts).
	PublicTraffic *bool `json:"public_traffic"`
	// Team owns the new sandbox and limits what it may use (snapshots,
	// volumes, secrets, tasks, pools and private templates of that team
	// only). It is the caller's identity, never read from a request body;
	// "" is store.DefaultTeam.
	Team string `json:"-"`

	// anySnapshot lets a resume use its hidden persisted snapshot.
	anySnapshot bool
}

var (
	envNameRe      = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,255}$`)
	templateNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}(:[a-z0-9._-]{1,64})?$`)
)

// validate fills defaults and checks every field; it changes nothing.
func (m *Manager) validate(ctx context.Context, req *CreateRequest) (*store.Sandbox, runtime.Config, *netPlan, error) {
	rec, rc, err := m.validateBase(req)
	if err != nil {
		return nil, rc, nil, err
	}
	pol, err := parsePolicy(req.Network, req.Allow)
	if err != nil {
		return nil, rc, nil, err
	}
	if pol.Mode != egress.ModeNone && rc.Runtime == runtime.GVisor && m.cfg.GVisorLegacy {
		return nil, rc, nil, invalid(gvisorNoNetwork)
	}
	if len(req.Secrets) > 0 && pol.Mode == egress.ModeNone {
		return nil, rc, nil, invalid("secrets need a network policy (allow or all-public)")
	}
	secrets, err := m.resolveSecrets(ctx, rec.Team, req.Secrets)
	if err != nil {
		return nil, rc, nil, err
	}
	if pol.Mode != egress.ModeNone && m.cfg.Gateway == nil && m.cfg.RemoteProxyEnv == nil {
		return nil, rc, nil, ErrNetworkUnavailable
	}
	if findings := egress.ScanEnv(req.Env); len(findings) > 0 {
		if m.cfg.RefuseEnvSecrets {
			return nil, rc, nil, &EnvSecretError{Findings: findings}
		}
		for _, f := range findings {
			rec.Warnings = append(rec.Warnings, fmt.Sprintf("env var %s may hold a secret (%s); secrets passed as env vars are readable by all code in the sandbox, use `corral secret set` and secrets instead", f.Name, f.Why))
		}
	}
	rec.Network = string(pol.Mode)
	if pol.Mode == egress.ModeAllow {
		rec.Egress.Allow = slices.Clone(req.Allow)
	}
	rec.Egress.Secrets = slices.Clone(req.Secrets)
	if rec.Volumes, rc.Volumes, err = m.resolveVolumes(ctx, rec.Team, rc.Runtime, req.Volumes); err != nil {
		return nil, rc, nil, err
	}
	return rec, rc, &netPlan{policy: pol, secrets: secrets}, nil
}

// netPlan is the validated network part of a create request.
type netPlan struct {
	policy  egress.Policy
	secrets []egress.Secret
}

func (m *Manager) validateBase(req *CreateRequest) (*store.Sandbox, runtime.Config, error) {
	var rc runtime.Config
	if req.Template != "" && !templateNameRe.MatchString(req.Template) {
		return nil, rc, invalid("template %q is not a valid name", req.Template)
	}
	var snap *store.Snapshot
	if req.Snapshot == "" && strings.HasPrefix(req.Template, SnapshotPrefix) {
		// E2B starts a sandbox from a snapshot by naming it as the template.
		req.Snapshot, req.Template = req.Template, ""
	}
	if req.Snapshot != "" {
		get := m.store.GetSnapshot
		if req.anySnapshot {
			get = m.store.GetSnapshotAny
		}
		sn, err := get(context.Background(), req.Snapshot)
		if err != nil || sn.Team != teamOr(req.Team) {
			// Another team's snapshot is absent, as if it did not exist.
			return nil, rc, invalid("snapshot %q not found", req.Snapshot)
		}
		if req.Template != "" && req.Template != sn.Template && req.Template != strings.SplitN(sn.Template, ":", 2)[0] {
			return nil, rc, invalid("snapshot %s is of template %s, not %s", sn.ID, sn.Template, req.Template)
		}
		snap, req.Template = sn, sn.Template
	}
	if req.Template == "" {
		req.Template = m.cfg.DefaultTemplate
	}
	tv, err := m.resolveTemplate(context.Background(), req.Template, teamOr(req.Team))
	if err != nil {
		return nil, rc, err
	}
	rootfs := tv.RootFS
	if req.Runtime == "" {
		req.Runtime = tv.Config.Runtime
	}
	if req.Tier == "" {
		req.Tier = tv.Config.Tier
	}
	if req.Runtime == "" {
		req.Runtime = string(runtime.Runc)
	}
	if !runtime.Runtime(req.Runtime).Valid() {
		return nil, rc, invalid("runtime must be runc or gvisor")
	}
	if req.Tier == "" {
		req.Tier = DefaultTier
	}
	tier, ok := Tiers[req.Tier]
	if !ok {
		return nil, rc, invalid("tier must be light, medium or heavy")
	}
	res, err := resolveResources(tier, req.Resources)
	if err != nil {
		return nil, rc, err
	}
	ttl := m.cfg.DefaultTTL
	if req.Timeout != nil {
		ttl = time.Duration(*req.Timeout) * time.Second
		if *req.Timeout < 1 || ttl > MaxTTL {
			return nil, rc, invalid("timeout must be between 1 and %d seconds", int64(MaxTTL/time.Second))
		}
	}
	cmdTimeout := tier.CommandTimeout
	if req.CommandTimeout != nil {
		cmdTimeout = time.Duration(*req.CommandTimeout) * time.Second
		if *req.CommandTimeout < 0 || cmdTimeout > MaxCommandTimeout {
			return nil, rc, invalid("command_timeout must be between 0 and %d seconds", int64(MaxCommandTimeout/time.Second))
		}
	}
	if len(req.Env) > MaxEnvVars {
		return nil, rc, invalid("at most %d env vars", MaxEnvVars)
	}
	size := 0
	for k, v := range req.Env {
		if !envNameRe.MatchString(k) {
			return nil, rc, invalid("env var name %q is not valid", k)
		}
		if strings.ContainsRune(v, 0) {
			return nil, rc, invalid("env var %s: the value holds a NUL byte (a process environment cannot)", k)
		}
		size += len(k) + len(v)
	}
	if size > MaxEnvBytes {
		return nil, rc, invalid("env vars exceed %d bytes", MaxEnvBytes)
	}
	if len(req.Metadata) > MaxMetadata {
		return nil, rc, invalid("at most %d metadata pairs", MaxMetadata)
	}
	for k, v := range req.Metadata {
		if k == "" || len(k) > MaxMetadataKey || len(v) > MaxMetadataValue {
			return nil, rc, invalid("metadata keys must be 1..%d bytes and values at most %d bytes", MaxMetadataKey, MaxMetadataValue)
		}
		if !safetext.Clean(k, false) || !safetext.Clean(v, true) {
			return nil, rc, invalid("metadata %q: keys hold no control characters, values none but tab, newline and carriage return", k)
		}
	}
	if err := govern.CheckAgent(req.Agent); err != nil {
		return nil, rc, err
	}
	now := time.Now().UTC()
	rec := &store.Sandbox{
		ID: idgen.New("", idgen.SandboxLen), AccessToken: idgen.Token(), Template: req.Template, Runtime: req.Runtime, Tier: req.Tier,
		Resources: res, CommandTimeout: cmdTimeout, Network: req.Network,
		Metadata: req.Metadata, State: store.StateRunning, CreatedAt: now, ExpiresAt: now.Add(ttl),
		Team: teamOr(req.Team), Node: m.cfg.Node,
	}
	if snap != nil {
		rec.Snapshot = snap.ID
	}
	if public := !m.cfg.PrivatePorts; (req.PublicTraffic == nil && !public) || (req.PublicTraffic != nil && !*req.PublicTraffic) {
		// Its own token, also for a fork or a snapshot's restore.
		rec.TrafficToken = idgen.Token()
	}
	rec.Env = req.Env
	rec.Lifecycle = store.Lifecycle{AutoPause: req.AutoPause, PauseMemory: req.PauseMemory}
	rec.TemplateVersion = tv.Ref()
	if tv.Version == "" {
		rec.TemplateVersion = ""
	}
	noNewPrivs, user := templatePrivileges(tv)
	// Every process sees that it runs in a sandbox (E2B_SANDBOX as envd
	// sets it, so code written for E2B detects it too); the caller's env
	// wins over these.
	env := map[string]string{"E2B_SANDBOX": "true", "CORRAL_SANDBOX": "true"}
	for k, v := range tv.Config.Env {
		env[k] = v
	}
	for k, v := range req.Env {
		env[k] = v
	}
	rc = runtime.Config{
		ID: rec.ID, Runtime: runtime.Runtime(req.Runtime), RootFS: rootfs, Layers: append(snapLayers(snap), tv.Layers...),
		Resources: runtime.Resources{
			CPU: res.CPU, MemoryBytes: res.MemoryMB << 20, DiskBytes: res.DiskMB << 20,
			Pids: res.Pids, Nofile: res.Nofile,
		},
		Env:             env,
		NoNewPrivileges: noNewPrivs,
		DefaultUser:     user,
		AccessToken:     rec.AccessToken,
		Template:        rec.Template,
		Team:            rec.Team,
	}
	return rec, rc, nil
}

// refusedContent turns an inroot.RefusedError (content of the template or
// snapshot that a sandbox cannot safely start with: a gVisor /tmp that is
// a link, a CA bundle that is not a regular file) into an InvalidError,
// the caller's to fix, whose message names no host path. Other errors are
// returned as they are.
func refusedContent(rec *store.Sandbox, err error) error {
	var refused *inroot.RefusedError
	if !errors.As(err, &refused) {
		return err
	}
	if rec.Snapshot != "" {
		return invalid("snapshot %s (template %s) cannot start safely: %s", rec.Snapshot, rec.Template, refused)
	}
	return invalid("template %s cannot start safely: %s", rec.Template, refused)
}

// Create validates req, starts the sandbox and records it.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (*store.Sandbox, error) {
	defer m.holdVolumes(req.Volumes)()
	ph := runtime.NewPhases()
	t := time.Now()
	rec, rc, plan, err := m.validate(ctx, &req)
	if err != nil {
		return nil, err
	}
	// A warm pool may already run a sandbox with these defaults.
	var pd *pool.Idle
	if poolable(&req) {
		if pd = m.pools.Take(rec.Team, rec.Template, rec.TemplateVersion); pd != nil {
			rec.ID, rec.AccessToken = pd.ID, pd.Token
		}
	}
	if pd == nil {
		m.pools.MakeRoom() // idle pooled sandboxes give way to a user's
	}
	release, err := m.admit(ctx, &req, rec)
	if err != nil {
		if pd != nil {
			m.pools.DiscardLater(pd)
		}
		return nil, err
	}
	started := ph.Mark(runtime.PhaseAdmission, t) // admitted: what follows is the start itself
	t = started
	m.mu.Lock()
	if m.closing {
		m.mu.Unlock()
		release()
		if pd != nil {
			m.pools.DiscardLater(pd)
		}
		return nil, ErrShuttingDown
	}
	ls := &liveSandbox{rec: rec, ending: true} // not killable until started
	m.addLive(ls)
	defer m.countWorkLocked()() // under mu, !closing: Shutdown waits for this create
	if pd != nil {
		// Live now: the reaper sees it as such. Released under mu while
		// not closing, so that Shutdown's Drain, which stops every taken
		// sandbox not released, leaves this one to the create.
		m.pools.Release(pd.ID)
	}
	m.mu.Unlock()

	if err := m.store.InsertSandbox(ctx, rec); err != nil {
		m.forget(rec.ID)
		release()
		return nil, err
	}
	t = ph.Mark(runtime.PhaseStore, t)
	fail := func(err error) (*store.Sandbox, error) {
		err = refusedContent(rec, err)
		m.teardownNetwork(rec.ID)
		m.forget(rec.ID)
		release()
		_, _ = m.recordEnd(context.WithoutCancel(ctx), rec.ID, EndError, err.Error(), map[string]any{"reason": EndError, "error": err.Error()})
		return nil, fmt.Errorf("start sandbox %s: %w", rec.ID, err)
	}
	var pid int
	if pd == nil {
		if err := m.prepareNetwork(rec, &rc, plan.policy, plan.secrets); err != nil {
			return fail(err)
		}
		t = ph.Mark(runtime.PhaseNetwork, t)
		h, err := m.driver.Start(runtime.WithPhases(ctx, ph), rc)
		if err != nil {
			return fail(err)
		}
		t = time.Now() // the driver recorded its phases
		pid = h.Pid
	}
	if err := m.activateNetwork(rec.ID, plan.policy, plan.secrets); err != nil {
		_ = m.driver.Stop(context.WithoutCancel(ctx), rec.ID, 0)
		return fail(err)
	}
	t = ph.Mark(runtime.PhaseNetwork, t)
	m.mu.Lock()
	if m.closing {
		// Shutdown began while it started; its sweep could not end a
		// sandbox that was not started yet, so this create does.
		m.mu.Unlock()
		_ = m.driver.Stop(context.WithoutCancel(ctx), rec.ID, 0)
		return fail(ErrShuttingDown)
	}
	ls.pid = pid
	ls.ending = false
	ls.lastActive = time.Now()
	ls.timer = time.AfterFunc(time.Until(rec.ExpiresAt), func() { m.expire(rec.ID) })
	m.mu.Unlock()
	ph.Mark(runtime.PhaseFinish, t)
	m.log.Info("sandbox created", "id", rec.ID, "template", rec.Template, "runtime", rec.Runtime, "network", rec.Network, "task", rec.TaskID, "pooled", pd != nil)
	source := "template"
	switch {
	case pd != nil:
		source = "pool"
	case req.Snapshot != "":
		source = "snapshot"
	}
	m.auditBy(ctx, rec.ID, "sandbox.created", map[string]any{
		"agent": req.Agent, "from_pool": pd != nil, "source": source,
		"create_ms": float64(time.Since(started).Microseconds()) / 1000,
		"phases_ms": ph.Milliseconds(),
		"template":  rec.Template, "runtime": rec.Runtime, "tier": rec.Tier, "resources": rec.Resources,
		"network": rec.Network, "allow": rec.Egress.Allow, "secrets": rec.Egress.Secrets, "metadata": rec.Metadata,
	})
	for _, w := range rec.Warnings {
		m.auditBy(ctx, rec.ID, "sandbox.warning", map[string]any{"warning": w})
	}
	if rec.TemplateVersion != "" {
		if tv, err := m.resolveTemplate(ctx, rec.TemplateVersion, rec.Team); err == nil && tv.Config.Start != "" {
			m.startTemplateCommand(rec.ID, tv.Config)
		}
	}
	return rec, nil
}

// teamOr is team, or store.DefaultTeam for "" (a caller without teams).
func teamOr(team string) string {
	if team == "" {
		return store.DefaultTeam
	}
	return team
}

func (m *Manager) forget(id string) {
	m.mu.Lock()
	delete(m.live, id)
	m.setSigners()
	m.mu.Unlock()
}

// addLive makes ls a live sandbox; m.mu must be held.
func (m *Manager) addLive(ls *liveSandbox) {
	m.live[ls.rec.ID] = ls
	m.setSigners()
}

// signer is a live sandbox's id and access token, for FindByToken.
type signer struct{ id, token string }

// setSigners republishes the signers of the live sandboxes after m.live
// changed; m.mu must be held. The slice is never changed once published.
func (m *Manager) setSigners() {
	out := make([]signer, 0, len(m.live))
	for id, ls := range m.live {
		out = append(out, signer{id: id, token: ls.rec.AccessToken})
	}
	m.signers.Store(&out)
}

func (m *Manager) expire(id string) {
	// Once the server is closing the next start deals with the TTL
	// (Reconcile ends what expired meanwhile; killAll ends everything).
	done, ok := m.beginWork()
	if !ok {
		return
	}
	defer done()
	m.mu.Lock()
	ls, ok := m.live[id]
	if ok && !ls.ending && !ls.paused && ls.timer != nil {
		if left := time.Until(ls.rec.ExpiresAt); left > 0 {
			// The lifetime was extended after the timer fired.
			ls.timer.Reset(left)
			m.mu.Unlock()
			return
		}
	}
	auto := ok && ls.rec.Lifecycle.AutoPause
	if auto && ls.paused {
		// Paused between the timer firing and now: that is what the
		// auto-pause wanted.
		m.mu.Unlock()
		return
	}
	var memory bool
	if auto {
		memory = ls.rec.Lifecycle.PauseMemory
	}
	m.mu.Unlock()
	if auto {
		pause := m.persist // counted by this expiry, also once Shutdown has begun
		if memory {
			pause = m.freeze
		}
		_, err := pause(context.Background(), id)
		if err == nil {
			m.audit(id, "sandbox.auto_paused", map[string]any{"memory": memory})
			return
		}
		if errors.Is(err, ErrConflict) && m.Paused(id) {
			return // a user's pause came first: the sandbox is kept paused
		}
		if errors.Is(err, ErrNotFound) {
			return // killed meanwhile
		}
		m.log.Error("auto-pause at the end of the TTL failed; killing", "id", id, "err", err)
	}
	if err := m.end(context.Background(), id, EndTTL, ""); err != nil && !errors.Is(err, ErrNotFound) {
		m.log.Error("expire sandbox", "id", id, "err", err)
	}
}

// Kill stops a running sandbox and records it as killed.
//
// A sandbox another node runs (its record names that node) is killed
// here only under a shared driver; under a host-local one the call is
// refused with an *OtherNodeError (nodes.go).
func (m *Manager) Kill(ctx context.Context, id string) (*store.Sandbox, error) {
	err := m.end(ctx, id, EndKilled, "")
	if errors.Is(err, ErrNotFound) {
		err = m.killForeign(ctx, id)
	}
	if err != nil {
		return nil, err
	}
	return m.store.GetSandbox(ctx, id)
}

// end stops the sandbox and records reason. Only one caller wins.
func (m *Manager) end(ctx context.Context, id, reason, errText string) error {
	return m.endIf(ctx, id, reason, errText, nil)
}

// errEndCancelled: endIf's condition no longer held.
var errEndCancelled = errors.New("the reason to end the sandbox no longer holds")

// endIf is end for a rule decided on a reading of the sandbox taken
// earlier (the idle limit): still, called under Manager.mu just before
// the sandbox is marked ending, says whether the rule still holds; if
// not, nothing is done and errEndCancelled is returned.
func (m *Manager) endIf(ctx context.Context, id, reason, errText string, still func(*liveSandbox) bool) error {
	m.mu.Lock()
	ls, ok := m.live[id]
	if !ok || ls.ending {
		m.mu.Unlock()
		return ErrNotFound
	}
	if still != nil && !still(ls) {
		m.mu.Unlock()
		return errEndCancelled
	}
	ls.ending = true
	ls.ended = make(chan struct{})
	defer close(ls.ended)
	defer m.countWorkLocked()() // Shutdown waits for this end, begun before it or during it
	if ls.timer != nil {
		ls.timer.Stop()
	}
	stopped := ls.stopped
	m.mu.Unlock()
	if stopped {
		// A persisted sandbox: a resume may be starting it again, or a
		// persisted pause still stopping it. Wait for that call (nothing
		// slow holds the lock of a stopped sandbox otherwise), so that the
		// stop below sees the container it left.
		ls.op.Lock()
		ls.op.Unlock() //nolint:staticcheck // a barrier, not a critical section
	}
	if reason == EndKilled || reason == EndTTL {
		// A process killed at the memory limit ended the sandbox, whatever came after.
		if st, err := m.driver.Stats(id); err == nil && st.OOMKills > 0 && !m.driver.Alive(id) {
			reason = EndOOM
		}
	}
	if reason == EndError || reason == EndOOM {
		if l, ok := m.driver.(interface{ AgentLog(string) string }); ok {
			m.log.Warn("sandbox died", "id", id, "reason", reason, "log", l.AgentLog(id))
		}
	}
	m.finalReading(id)
	stopErr := m.driver.Stop(ctx, id, m.cfg.KillGrace)
	m.teardownNetwork(id)
	if stopErr != nil {
		m.log.Error("stop sandbox", "id", id, "err", stopErr)
		if errText == "" {
			errText = "teardown: " + stopErr.Error()
		}
	}
	// Under a shared driver another node may have ended it (a kill sent
	// there): its end and its event stand, and this one records neither.
	task := m.taskOf(id)
	if _, err := m.recordEnd(ctx, id, reason, errText, map[string]any{"reason": reason, "error": errText}); err != nil {
		m.audit(id, "sandbox.end_unrecorded", map[string]any{"reason": reason, "error": err.Error()})
		return err
	}
	// From here the sandbox has ended; a failed stop is logged and kept
	// in the record (errText), and the reaper reclaims what it left.
	m.forget(id)
	m.dropClient(id)
	m.releaseSandbox(id, task)
	if wd := m.wd.Load(); wd != nil {
		wd.Forget(id)
	}
	m.log.Info("sandbox ended", "id", id, "reason", reason)
	return nil
}

// recordEnd ends the record of sandbox id with reason and errText and
// records its sandbox.ended event with data, in one step: the store's
// conditional update (store.Event.EndsSandbox) decides both, so that of
// several ends racing (the owner's TTL, watchdog or kill and another
// node's kill under a shared driver; two nodes ending an overdue
// sandbox) exactly one records an event, and it is the end the record
// keeps. It reports whether this end was that one. The event is stored
// with the record's end, so a reader who sees "ended" finds it. It is the
// one way a sandbox's end is recorded.
func (m *Manager) recordEnd(ctx context.Context, id, reason, errText string, data map[string]any) (bool, error) {
	end := &store.SandboxEnd{ID: id, Reason: reason, Error: errText, At: time.Now()}
	ctx = context.WithoutCancel(ctx)
	if m.cfg.Audit == nil {
		return m.store.EndSandboxFirst(ctx, id, reason, errText, end.At)
	}
	return m.cfg.Audit.RecordSandboxEnd(ctx, end, "sandbox.ended", data)
}

// finalReading gives the watchdog a last reading of a sandbox whose
// processes are about to stop (it ends, or a persisted pause stops it),
// so that what it used since the last sampling round is metered.
func (m *Manager) finalReading(id string) {
	if wd := m.wd.Load(); wd != nil {
		if st, err := m.driver.Stats(id); err == nil {
			wd.Final(id, st)
		}
	}
}

// IDBase is the host uid/gid that sandbox uid/gid 0 maps to (the base of
// the server's uid range): volume files of sandbox uid N are owned by host
// uid IDBase+N.
func (m *Manager) IDBase() uint32 { return m.cfg.IDBase }

// Get returns the record of a sandbox, running or ended.
func (m *Manager) Get(ctx context.Context, id string) (*store.Sandbox, error) {
	rec, err := m.store.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrNotFound
	}
	return rec, err
}

// Team returns the team that owns sandbox id, from memory for a live
// sandbox and from its record otherwise; ErrNotFound for an id that never
// existed.
func (m *Manager) Team(ctx context.Context, id string) (string, error) {
	m.mu.Lock()
	ls, ok := m.live[id]
	var team string
	if ok {
		team = ls.rec.Team
	}
	m.mu.Unlock()
	if ok {
		return team, nil
	}
	rec, err := m.Get(ctx, id)
	if err != nil {
		return "", err
	}
	return rec.Team, nil
}

// List returns the sandboxes f selects whose metadata contains every
// pair of match.
func (m *Manager) List(ctx context.Context, f store.SandboxFilter, match map[string]string) ([]*store.Sandbox, error) {
	all, err := m.store.ListSandboxes(ctx, f)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, sb := range all {
		ok := true
		for k, v := range match {
			if sb.Metadata[k] != v {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, sb)
		}
	}
	return out, nil
}

// SetTimeout makes a running sandbox expire d from now. It writes the
// store, so it is work Shutdown waits for (beginWork); once Shutdown has
// begun it is refused with ErrShuttingDown and changes nothing.
func (m *Manager) SetTimeout(ctx context.Context, id string, d time.Duration) (*store.Sandbox, error) {
	if d < time.Second || d > MaxTTL {
		return nil, invalid("timeout must be between 1 and %d seconds", int64(MaxTTL/time.Second))
	}
	done, ok := m.beginWork()
	if !ok {
		return nil, ErrShuttingDown
	}
	defer done() // after the Unlock below (deferred later, run first)
	m.mu.Lock()
	defer m.mu.Unlock()
	ls, ok := m.live[id]
	if !ok || ls.ending {
		return nil, ErrNotFound
	}
	at := time.Now().Add(d).UTC()
	if err := m.store.SetExpiry(ctx, id, at); err != nil {
		return nil, err
	}
	ls.rec.ExpiresAt = at
	if ls.paused {
		ls.remaining = d // the clock restarts on resume
	} else {
		ls.timer.Reset(d)
	}
	return m.store.GetSandbox(ctx, id)
}

// EndIfDead checks whether a sandbox that should be running has died (its
// init exited, for example at the memory limit) and if so ends it at once
// with the right reason, which it returns. It waits up to wait for a
// sandbox that is still dying. A sandbox whose processes corral stopped
// on purpose (a persisted pause) is not dead.
func (m *Manager) EndIfDead(ctx context.Context, id string, wait time.Duration) (reason string, dead bool) {
	deadline := time.Now().Add(wait)
	for m.driver.Alive(id) {
		if time.Now().After(deadline) {
			return "", false
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Checked after the runtime said dead: a persisted pause marks the
	// sandbox stopped before it stops the processes.
	m.mu.Lock()
	ls, ok := m.live[id]
	stopped := ok && ls.stopped
	m.mu.Unlock()
	if stopped {
		return "", false
	}
	reason = EndError
	if st, err := m.driver.Stats(id); err == nil && st.OOMKills > 0 {
		reason = EndOOM
	}
	if err := m.end(ctx, id, reason, "sandbox init exited"); errors.Is(err, ErrNotFound) && ok {
		// Another caller (the periodic check, a kill) is ending it: wait
		// until the end is recorded, so that what this caller reports
		// and what a read of the record says agree.
		m.mu.Lock()
		ended := ls.ended
		m.mu.Unlock()
		if ended != nil {
			select {
			case <-ended:
			case <-ctx.Done():
			}
		}
	}
	if rec, err := m.store.GetSandbox(ctx, id); err == nil && rec.EndReason != "" {
		reason = rec.EndReason
	}
	return reason, true
}

// TrafficToken returns the traffic token of a running sandbox ("" when
// its ports are public) and whether the sandbox runs.
func (m *Manager) TrafficToken(id string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ls, ok := m.live[id]
	if !ok || ls.ending || ls.paused {
		return "", false
	}
	return ls.rec.TrafficToken, true
}

// AccessToken returns the agent access token of a running sandbox.
func (m *Manager) AccessToken(id string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ls, ok := m.live[id]
	if !ok || ls.ending || ls.paused {
		return "", false
	}
	return ls.rec.AccessToken, true
}

// FindByToken returns the live sandbox whose access token satisfies
// match (for requests that name no sandbox but carry a signature made
// with its token), or "". The caller checks that it is running.
//
// Such requests are unauthenticated, so FindByToken never takes m.mu: it
// reads the published signers (setSigners) without a lock, and no caller
// can hold the Manager's lock for as long as it makes match run. It calls
// match once per live sandbox, which is unavoidable when the request names
// none (the signature is a hash over the token); the caller makes each
// call's cost independent of the request's size (e2bSignedFiles).
func (m *Manager) FindByToken(match func(token string) bool) string {
	p := m.signers.Load()
	if p == nil {
		return ""
	}
	for _, sg := range *p {
		if match(sg.token) {
			return sg.id
		}
	}
	return ""
}

// ExtendTimeout makes a running sandbox live at least d from now; it
// never shortens the lifetime (E2B's connect semantics).
func (m *Manager) ExtendTimeout(ctx context.Context, id string, d time.Duration) (*store.Sandbox, error) {
	m.mu.Lock()
	ls, ok := m.live[id]
	ok = ok && !ls.ending && !ls.paused
	longer := ok && time.Now().Add(d).After(ls.rec.ExpiresAt)
	m.mu.Unlock()
	if !ok {
		return nil, ErrNotFound
	}
	if !longer {
		return m.store.GetSandbox(ctx, id)
	}
	return m.SetTimeout(ctx, id, d)
}

// token returns the agent access token of a running sandbox.
func (m *Manager) token(id string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ls, ok := m.live[id]; ok {
		return ls.rec.AccessToken
	}
	return ""
}

// lockOp takes the operation lock of a live sandbox (liveSandbox.op) and
// returns the sandbox with the lock's release. ErrNotFound if it is not
// live or is ending, before or after the wait for the lock.
func (m *Manager) lockOp(id string) (*liveSandbox, func(), error) {
	m.mu.Lock()
	ls, ok := m.live[id]
	m.mu.Unlock()
	if !ok {
		return nil, nil, ErrNotFound
	}
	ls.op.Lock()
	if m.endingOrGone(ls) {
		ls.op.Unlock()
		return nil, nil, ErrNotFound
	}
	return ls, ls.op.Unlock, nil
}

// endingOrGone reports whether ls is being ended or has ended.
func (m *Manager) endingOrGone(ls *liveSandbox) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return ls.ending || m.live[ls.rec.ID] != ls
}

// goneOr is the error to report when a call on ls failed with err: the
// runtime's error is a consequence when the sandbox was killed during the
// call, which is then reported as ErrNotFound.
func (m *Manager) goneOr(ls *liveSandbox, err error) error {
	if m.endingOrGone(ls) {
		return ErrNotFound
	}
	return err
}

// Running reports whether id is a running (not paused, not ending)
// sandbox of this server.
func (m *Manager) Running(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	ls, ok := m.live[id]
	return ok && !ls.ending && !ls.paused
}

// Paused reports whether id is a paused sandbox of this server.
func (m *Manager) Paused(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	ls, ok := m.live[id]
	return ok && !ls.ending && ls.paused
}

// Pause freezes every process of a running sandbox with the cgroup
// freezer: memory is kept, no CPU is used, and its lifetime clock stops
// until Resume. Pausing a paused sandbox is ErrConflict. A pause is work
// Shutdown waits for (beginWork); once Shutdown has begun it is refused
// with ErrShuttingDown and the sandbox keeps running.
func (m *Manager) Pause(ctx context.Context, id string) (*store.Sandbox, error) {
	done, ok := m.beginWork()
	if !ok {
		return nil, ErrShuttingDown
	}
	defer done()
	return m.freeze(ctx, id)
}

// freeze is Pause's freezer pause, for a caller that counts it as work
// itself (Pause, or a TTL's expiry with its auto-pause).
func (m *Manager) freeze(ctx context.Context, id string) (*store.Sandbox, error) {
	ls, unlock, err := m.lockOp(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	m.mu.Lock()
	if ls.paused {
		m.mu.Unlock()
		return nil, ErrConflict
	}
	ls.paused = true
	ls.remaining = max(time.Until(ls.rec.ExpiresAt), time.Second)
	remaining := ls.remaining
	if ls.timer != nil {
		ls.timer.Stop()
	}
	m.mu.Unlock()
	m.dropClient(id)
	if err := m.driver.Pause(ctx, id); err != nil {
		if m.endingOrGone(ls) {
			return nil, ErrNotFound // killed during the call: nothing to undo
		}
		m.mu.Lock()
		ls.paused = false
		if ls.timer != nil {
			ls.timer.Reset(ls.remaining)
		}
		m.mu.Unlock()
		return nil, err
	}
	if err := m.store.SetState(ctx, id, store.StatePaused, time.Now().Add(remaining)); err != nil {
		return nil, err
	}
	m.log.Info("sandbox paused", "id", id)
	return m.store.GetSandbox(ctx, id)
}

// Resume thaws a paused sandbox and restarts its lifetime clock with ttl
// (or what was left when it was paused, if ttl is 0); a persisted
// sandbox (paused to disk) is started again. Resuming a running sandbox
// is ErrConflict. A resume is work Shutdown waits for (beginWork); once
// Shutdown has begun it is refused with ErrShuttingDown and the sandbox
// stays paused for the next start.
func (m *Manager) Resume(ctx context.Context, id string, ttl time.Duration) (*store.Sandbox, error) {
	if ttl < 0 || ttl > MaxTTL {
		return nil, invalid("timeout must be between 1 and %d seconds", int64(MaxTTL/time.Second))
	}
	done, ok := m.beginWork()
	if !ok {
		return nil, ErrShuttingDown
	}
	defer done()
	ls, unlock, err := m.lockOp(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	m.mu.Lock()
	if !ls.paused {
		m.mu.Unlock()
		return nil, ErrConflict
	}
	stopped := ls.stopped
	m.mu.Unlock()
	if stopped {
		if err := m.restart(ctx, ls); err != nil {
			return nil, err
		}
	} else if err := m.driver.Resume(ctx, id); err != nil {
		return nil, m.goneOr(ls, err)
	}
	m.mu.Lock()
	if ttl == 0 {
		ttl = ls.remaining
	}
	at := time.Now().Add(ttl).UTC()
	ls.paused = false
	ls.rec.ExpiresAt = at
	// The time paused is not idle time: the idle limit counts from now.
	ls.lastActive = time.Now()
	if ls.timer == nil {
		ls.timer = time.AfterFunc(ttl, func() { m.expire(id) })
	} else {
		ls.timer.Reset(ttl)
	}
	// Written under the lock, as SetTimeout does, so that a concurrent
	// SetTimeout's expiry is not overwritten by this one.
	err = m.store.SetState(ctx, id, store.StateRunning, at)
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	m.log.Info("sandbox resumed", "id", id)
	return m.store.GetSandbox(ctx, id)
}

// Stats reads a running sandbox's cgroup counters.
func (m *Manager) Stats(id string) (runtime.Stats, error) {
	if !m.Running(id) {
		return runtime.Stats{}, ErrNotFound
	}
	return m.driver.Stats(id)
}

// Reconcile compares the store with the host after a (re)start: running
// records of this node whose sandbox is still alive are adopted (their
// TTL re-armed), the rest are ended as orphaned; sandboxes the host holds
// without a running record are torn down. The stored team quotas are
// applied first, and records made before records named their node are
// given to this one.
//
// Other nodes' records are never adopted. With a host-local driver they
// are not even read: their sandboxes are on other hosts. With a shared
// driver (Kubernetes) this node sees their sandboxes too and leaves them
// to their node, unless one is overdue (checkForeign).
func (m *Manager) Reconcile(ctx context.Context) error {
	if err := m.LoadTeamQuotas(ctx); err != nil {
		return err
	}
	if n, err := m.store.AssignUnowned(ctx, m.cfg.Node); err != nil {
		return err
	} else if n > 0 {
		m.log.Info("sandbox records without a node are this node's now", "node", m.cfg.Node, "records", n)
	}
	// The runtime first, the records second: a create inserts its record
	// before it starts the sandbox, so every sandbox held here whose
	// create is still running on another node has its record in the
	// listing below (listed the other way round, a record inserted
	// between the two would be missing and its sandbox reclaimed as an
	// orphan under its creator).
	held, err := m.driver.List(ctx)
	if err != nil {
		return fmt.Errorf("list runtime sandboxes: %w", err)
	}
	f := store.SandboxFilter{States: []string{store.StateRunning, store.StatePaused}}
	if !m.shared {
		f.Node = m.cfg.Node
	}
	recs, err := m.store.ListSandboxes(ctx, f)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	var foreign []*store.Sandbox
	for _, rec := range recs {
		known[rec.ID] = true
		if rec.Node != m.cfg.Node {
			foreign = append(foreign, rec)
			continue
		}
		// Commands whose stream the last run held are lost to it: their
		// processes may still run (adopted sandbox) or not (orphaned),
		// but nobody will see their end. Close the records.
		if open, err := m.store.EndOpenCommands(ctx, rec.ID, "control_plane_restarted", time.Now()); err == nil {
			for _, c := range open {
				m.audit(rec.ID, "command.interrupted", map[string]any{
					"command": clipCommand(c.Command), "started": c.StartedAt,
					"reason": "the control plane stopped while the command ran; its end was not observed"})
			}
		}
		if rec.State == store.StatePaused && m.driver.Alive(rec.ID) {
			m.adoptPaused(rec, false)
			continue
		}
		if rec.State == store.StatePaused && rec.Persisted != "" && !m.driver.Alive(rec.ID) {
			// Persisted: its processes were stopped on purpose.
			m.adoptPaused(rec, true)
			continue
		}
		if m.driver.Alive(rec.ID) && time.Now().Before(rec.ExpiresAt) {
			if c, err := m.driver.Dial(ctx, rec.ID); err == nil {
				c.Close()
				m.adopt(rec)
				continue
			}
		}
		reason := EndOrphaned
		if !time.Now().Before(rec.ExpiresAt) {
			reason = EndTTL
		}
		detail := ""
		if lr, ok := m.driver.(runtime.LossReporter); ok {
			detail = lr.LostReason(rec.ID)
		}
		if err := m.driver.Stop(ctx, rec.ID, 0); err != nil {
			m.log.Error("reclaim sandbox", "id", rec.ID, "err", err)
		}
		if _, err := m.recordEnd(ctx, rec.ID, reason, detail, map[string]any{"reason": reason, "reclaimed_at_start": true}); err != nil {
			return err
		}
		m.log.Info("reclaimed sandbox", "id", rec.ID, "reason", reason)
	}
	for _, id := range held {
		if known[id] {
			continue
		}
		if err := m.driver.Stop(ctx, id, 0); err != nil {
			m.log.Error("reclaim orphan", "id", id, "err", err)
			continue
		}
		m.log.Info("reclaimed orphan without record", "id", id)
		m.audit(id, "reaper.reclaimed", map[string]any{"what": "runtime state without a record", "reason": "no_record"})
	}
	m.checkForeign(ctx, foreign)
	m.restoreNetworks(ctx)
	if !m.shared {
		m.pools.Load(ctx)
	}
	return nil
}

func (m *Manager) adopt(rec *store.Sandbox) {
	m.mu.Lock()
	id := rec.ID
	m.addLive(&liveSandbox{rec: rec, timer: time.AfterFunc(time.Until(rec.ExpiresAt), func() { m.expire(id) })})
	m.mu.Unlock()
	m.adoptGoverned(rec)
	m.log.Info("adopted running sandbox", "id", id)
	m.audit(id, "sandbox.adopted", map[string]any{"state": rec.State})
}

// adoptGoverned counts an adopted sandbox in admission and in its task.
func (m *Manager) adoptGoverned(rec *store.Sandbox) {
	agent := ""
	if m.cfg.Governor != nil && rec.TaskID != "" {
		if t, err := m.cfg.Governor.Get(context.Background(), rec.TaskID); err == nil {
			agent = t.Agent
		}
		m.cfg.Governor.AdoptSandbox(context.Background(), rec.TaskID, rec.ID)
	}
	tk := m.cfg.Admission.Adopt(admissionRequest(rec, agent))
	m.mu.Lock()
	m.tickets[rec.ID] = tk
	m.mu.Unlock()
}

func (m *Manager) adoptPaused(rec *store.Sandbox, stopped bool) {
	m.mu.Lock()
	// stopped is set before the sandbox is visible, so that the death
	// check never takes a persisted sandbox for a dead one.
	m.addLive(&liveSandbox{rec: rec, paused: true, stopped: stopped, remaining: max(time.Until(rec.ExpiresAt), time.Minute)})
	m.mu.Unlock()
	m.adoptGoverned(rec)
	m.log.Info("adopted paused sandbox", "id", rec.ID)
	m.audit(rec.ID, "sandbox.adopted", map[string]any{"state": rec.State})
}

// watch notices sandboxes whose init died (for example OOM-killed) and
// ends them with the right reason.
func (m *Manager) watch() {
	defer close(m.done)
	t := time.NewTicker(m.cfg.WatchInterval)
	defer t.Stop()
	reap := 0
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		m.mu.Lock()
		var ids []string
		for id, ls := range m.live {
			if !ls.ending && !ls.stopped {
				ids = append(ids, id)
			}
		}
		m.mu.Unlock()
		for _, id := range ids {
			m.EndIfDead(context.Background(), id, 0)
		}
		m.chargeCPU()
		if gw := m.cfg.Gateway; gw != nil {
			if restored, err := gw.Ensure(); err != nil {
				m.log.Error("sandbox firewall", "err", err)
			} else if restored {
				m.log.Warn("the sandbox nftables table was missing and has been restored")
				m.audit("", "network.table_restored", map[string]any{"note": "the nftables table was missing (flushed?) and was reinstalled"})
			}
		}
		go m.pools.Refill()
		if reap++; time.Duration(reap)*m.cfg.WatchInterval >= ReapInterval {
			reap = 0
			m.Reap(context.Background())
		}
	}
}

// Shutdown stops the watcher. Sandboxes keep running; a restarted server
// adopts them (Reconcile). With killAll, every sandbox is killed first.
// It returns once the work in flight (beginWork) has finished, or when
// ctx is done.
func (m *Manager) Shutdown(ctx context.Context, killAll bool) {
	m.mu.Lock()
	m.closing = true // creates in flight (waiting for admission, say) start nothing
	m.mu.Unlock()
	if killAll {
		m.mu.Lock()
		var ids []string
		for id := range m.live {
			ids = append(ids, id)
		}
		m.mu.Unlock()
		for _, id := range ids {
			_ = m.end(ctx, id, EndShutdown, "")
		}
	}
	close(m.stop)
	<-m.done
	// The pools first: Drain waits for the refills in flight, whose
	// starts are work too, and refuses new ones.
	m.pools.Drain()
	m.waitWork(ctx)
	m.mu.Lock()
	for _, ls := range m.live {
		if ls.timer != nil {
			ls.timer.Stop()
		}
	}
	m.mu.Unlock()
}

// beginWork counts work in flight that starts or changes sandboxes, or
// writes their files or records, on its own (a create, a pool refill's
// start, a TTL expiry with its auto-pause, a pause, a resume, a
// snapshot, a template saved from a sandbox, a new timeout) for
// Shutdown to wait for;
// false (nothing counted) once Shutdown has begun: such work then starts
// nothing. The caller calls done when the work has finished or been
// undone.
//
// It is the one way Shutdown learns of work in flight, and defends
// against that work outliving the shutdown half-made: its runtime Start
// or Stop, or its record's write, finishing after the server closed its
// store and driver (a leaked overlay mount, a runc container and
// supervisor nobody stops, a record written to a closed store). Ends
// are counted too (endIf, with countWorkLocked), also once Shutdown has
// begun: its own killAll ends and a kill or watchdog end racing it must
// finish before it returns.
func (m *Manager) beginWork() (done func(), ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closing {
		return nil, false
	}
	return m.countWorkLocked(), true
}

// countWorkLocked counts work in flight whatever Shutdown's progress
// (beginWork); m.mu must be held, and not when done is called.
func (m *Manager) countWorkLocked() (done func()) {
	m.work++
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.work--; m.work == 0 && m.idle != nil {
			close(m.idle)
			m.idle = nil
		}
	}
}

// waitWork waits until no work is in flight (beginWork) or ctx is done.
func (m *Manager) waitWork(ctx context.Context) {
	m.mu.Lock()
	if m.work == 0 {
		m.mu.Unlock()
		return
	}
	if m.idle == nil {
		m.idle = make(chan struct{})
	}
	idle := m.idle
	m.mu.Unlock()
	select {
	case <-idle:
	case <-ctx.Done():
	}
}

// Dial connects to a running sandbox's agent.
func (m *Manager) Dial(ctx context.Context, id string) (net.Conn, error) {
	if !m.Running(id) {
		return nil, ErrNotFound
	}
	return m.driver.Dial(ctx, id)
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
