// Package server wires corral's parts into the running control plane:
// data directory, store, admin key, base template, runtime driver, network
// gateway (egress proxy, DNS filter, nftables), audit log, sandbox manager
// and the HTTP API.
package server

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/corralhq/corral/internal/api"
	"github.com/corralhq/corral/internal/audit"
	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/gateway"
	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/idrange"
	"github.com/corralhq/corral/internal/metrics"
	"github.com/corralhq/corral/internal/netns"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/runtime/oci"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template"
	"github.com/corralhq/corral/internal/template/registry"
	"github.com/corralhq/corral/internal/usage"
	"github.com/corralhq/corral/internal/volume"
	"github.com/corralhq/corral/internal/watchdog"
)

// Defaults for `corral serve`.
const (
	DefaultListen  = "127.0.0.1:7420"
	DefaultDataDir = "/var/lib/corral"
)

// Config is the server's configuration.
type Config struct {
	// Listen is the HTTP address (default 127.0.0.1:7420).
	Listen string
	// TLSCert and TLSKey are PEM files of the server's certificate (chain)
	// and private key (--tls-cert, --tls-key): both or neither. With them
	// the API is served over HTTPS (TLS 1.2 or later). They are read once
	// at start; a renewed certificate takes a restart.
	TLSCert, TLSKey string
	// Insecure allows serving plain HTTP on an address that is not
	// loopback (--insecure).
	Insecure bool
	// DataDir holds the database, admin key, templates and sandbox state.
	DataDir string
	// Store is the address of a PostgreSQL store (--store, a postgres://
	// or postgresql:// URL) that several control planes may share; ""
	// is the SQLite file DATA/corral.db.
	Store string
	// NodeID names this control plane in the records of the sandboxes it
	// runs (--node-id): stable across restarts (a restarted node adopts
	// its own sandboxes), unique among the control planes sharing one
	// store. Default: the host name and the data dir's instance tag
	// (DefaultNodeID).
	NodeID string
	// TemplateCache holds template builds (default /var/cache/corral/templates).
	TemplateCache string
	// BuildCodeInterpreter builds the code-interpreter template in the
	// background at start when the cache lacks this corral's build
	// (--build-code-interpreter); it registers the build when done.
	BuildCodeInterpreter bool
	// MaxOutput bounds stdout/stderr returned by exec (default 1 MiB each).
	MaxOutput int
	// KillGrace is the time between SIGTERM and SIGKILL when a sandbox is
	// killed (default 3 s).
	KillGrace time.Duration
	// KillOnShutdown kills every sandbox when the server stops; otherwise
	// they keep running and the next start adopts them.
	KillOnShutdown bool
	// AgentBinary is the static binary run as each sandbox's agent and as
	// the sandboxes' supervisor: corral, or the lean corral-agent (default:
	// corral-agent beside the running executable if it is there, else the
	// running executable).
	AgentBinary string
	// Progress receives the base template build's progress display.
	Progress io.Writer
	// NetworkRange numbers sandbox veth pairs (default 10.201.0.0/16).
	NetworkRange netip.Prefix
	// NoNetwork runs without the network gateway: only network "none".
	NoNetwork bool
	// Driver is the runtime driver: DriverOCI (runc/runsc on this host,
	// the default) or DriverKube (Pods on a Kubernetes cluster, Kube).
	// Under kube the host's network gateway is off: the sandboxes'
	// traffic is the cluster's NetworkPolicy's, and with Kube.Egress the
	// cluster egress proxy's (docs/kubernetes.md).
	Driver string
	// Kube configures the kube driver.
	Kube KubeConfig
	// EgressResolver is the DNS server ("HOST:PORT") the egress proxy and
	// DNS filter resolve allowed names with; "" means the host's resolver.
	EgressResolver string
	// EgressUpstreamCA, when set, is a PEM file of CA certificates the
	// proxy trusts (instead of the system's) for upstream TLS when it
	// intercepts a connection to inject a secret.
	EgressUpstreamCA string
	// EgressLimits are the per-sandbox egress caps (zero: defaults).
	EgressLimits egress.Limits
	// RefusalEvents is how many egress refusals per sandbox and
	// RefusalInterval are audit events one by one; past it they are
	// counted in one egress.summary event per sandbox and interval
	// (zero: egress.DefaultSummaryAfter and egress.DefaultSummaryInterval).
	RefusalEvents   int
	RefusalInterval time.Duration
	// AuditRetention bounds the audit log and the command records (zero
	// fields: audit's defaults). Its ArchiveDir defaults to
	// DATA/audit-archive unless NoAuditArchive is set.
	AuditRetention audit.Retention
	// NoAuditArchive deletes events past the retention without writing
	// them to an archive first.
	NoAuditArchive bool
	// RefuseEnvSecrets refuses sandboxes whose env vars look like secrets.
	RefuseEnvSecrets bool
	// E2BInternet is the network mode of an E2B sandbox created with
	// internet access and no allowOut list: "none" (default) or
	// "all-public".
	E2BInternet string
	// PortsDefault is the port access of a sandbox whose create request
	// does not say: "public" (default, as E2B's) or "private" (a
	// request to a port must carry the sandbox's traffic token).
	PortsDefault string
	// Budgets are the default task budgets (zero fields: govern's
	// defaults).
	Budgets govern.Defaults
	// Loop tunes loop detection (zero fields: defaults).
	Loop govern.LoopConfig
	// Admission limits concurrent sandboxes globally (MaxConcurrent, the
	// max-sandboxes flag; 0: govern.DefaultMaxConcurrent, 10) and per
	// agent.
	Admission govern.AdmissionConfig
	// Watchdog tunes the sampler (zero fields: defaults).
	Watchdog watchdog.Config
	// IdleTimeout ends sandboxes idle this long (0: never).
	IdleTimeout time.Duration
	// DeathCheckInterval is how often running sandboxes are checked for a
	// dead init (default 1 s; at most 1 min).
	DeathCheckInterval time.Duration
	// MemoryPressure overrides the host memory check that empties warm
	// pools (sandbox.Config.MemoryPressure); nil: /proc/meminfo.
	MemoryPressure func() bool
	// RunawayAction is "sandbox" (default: kill the sandbox) or "command"
	// (kill its running commands) when the CPU-runaway rule fires.
	RunawayAction string
	// IDRange is the host uid/gid range sandboxes map to (zero: the data
	// dir's recorded range, else corral's entry in /etc/subuid, else a
	// free range; see ResolveIDRange).
	IDRange idrange.Range
	// IDFiles are the subuid, subgid, passwd and group files the range is
	// checked against and recorded in (zero fields: those in /etc).
	IDFiles idrange.Files
	// HTTPHeaderTimeout bounds reading a request's headers (default
	// DefaultHTTPHeaderTimeout, 10 s).
	HTTPHeaderTimeout time.Duration
	// HTTPIdleTimeout closes a keep-alive connection idle this long
	// between requests (default DefaultHTTPIdleTimeout, 2 min).
	HTTPIdleTimeout time.Duration
	// HTTPStallTimeout is how long one read of a request body or one
	// write of a response may block before the connection is cut
	// (default api.DefaultStallTimeout, 1 min). Streams that keep moving
	// are never cut.
	HTTPStallTimeout time.Duration
	// MaxStreamsPerKey bounds the streams one API key, or one sandbox's
	// envd credential, holds open at once (default
	// api.DefaultMaxStreamsPerKey, 256).
	MaxStreamsPerKey int
	// MaxEventStreamsPerKey, MaxEventStreamsPerTeam and MaxEventStreams
	// bound the open event streams (GET /v1/events/stream) of one API
	// key, of one team's keys together and of the server (defaults
	// api.DefaultMaxEventStreamsPerKey 8, api.DefaultMaxEventStreamsPerTeam
	// 32, api.DefaultMaxEventStreams 256).
	MaxEventStreamsPerKey, MaxEventStreamsPerTeam, MaxEventStreams int
	// EventHeartbeat is how often an idle event stream sends a comment
	// and re-checks its key (default api.DefaultEventHeartbeat, 15 s).
	EventHeartbeat time.Duration
	// Runsc is the runsc binary gVisor sandboxes run under (--runsc;
	// default: the pinned build oci.CachedRunsc when present, else runsc
	// in PATH, which the server logs as a fallback).
	Runsc string
	// RunscPlatform is gVisor's platform (--runsc-platform): systrap
	// (default), ptrace, or kvm (needs a usable /dev/kvm). A legacy runsc
	// without systrap defaults to ptrace.
	RunscPlatform string
	// Log is the server's logger.
	Log *slog.Logger
}

// Defaults of the HTTP listener's timeouts (docs/configuration.md).
const (
	DefaultHTTPHeaderTimeout = 10 * time.Second
	DefaultHTTPIdleTimeout   = 2 * time.Minute
	// maxHeaderBytes bounds a request's headers (and URL).
	maxHeaderBytes = 64 << 10
)

// DefaultE2BInternet is the network mode of an E2B sandbox created with
// internet access and no allowOut list (Config.E2BInternet).
const DefaultE2BInternet = "none"

// Bounds [Config.Validate] holds settings to (docs/configuration.md).
const (
	// MaxKillGrace bounds KillGrace (--kill-grace).
	MaxKillGrace = time.Minute
	// MaxDeathCheckInterval bounds DeathCheckInterval
	// (--death-check-interval).
	MaxDeathCheckInterval = time.Minute
)

// StoreAddr is the store's address: Store, or the SQLite file in the data
// dir.
func (c *Config) StoreAddr() string {
	if c.Store != "" {
		return c.Store
	}
	return filepath.Join(c.DataDir, "corral.db")
}

// Validate fills defaults and checks the configuration. Each refusal
// names the setting as its `corral serve` flag (and config-file key), the
// value and the allowed range; all refusals are returned together and
// nothing is filled in when there is one.
func (c *Config) Validate() error {
	errs := []error{
		nonNegative("max-output", c.MaxOutput),
		nonNegative("max-sandboxes", c.Admission.MaxConcurrent),
		nonNegative("max-per-agent", c.Admission.MaxPerAgent),
		nonNegative("agent-rate", c.Admission.AgentRate),
		nonNegative("agent-burst", c.Admission.AgentBurst),
		nonNegative("queue-timeout", c.Admission.QueueTimeout),
		within("team-max-sandboxes", c.Admission.Team.MaxSandboxes, 0, govern.MaxQuotaSandboxes),
		within("team-max-per-agent", c.Admission.Team.MaxPerAgent, 0, govern.MaxQuotaSandboxes),
		within("team-max-cpus", c.Admission.Team.MaxCPUs, 0, govern.MaxQuotaCPUs),
		within("team-max-memory-mb", c.Admission.Team.MaxMemoryMB, 0, govern.MaxQuotaMemoryMB),
		within("team-create-rate", c.Admission.Team.CreateRate, 0, govern.MaxQuotaRate),
		within("team-create-burst", c.Admission.Team.CreateBurst, 0, govern.MaxQuotaBurst),
		within("task-max-calls", c.Budgets.MaxCalls, 0, govern.MaxCallsCeiling),
		within("task-max-duration", c.Budgets.MaxDuration, 0, govern.MaxDurationCeiling),
		within("task-max-tokens", c.Budgets.MaxTokens, 0, govern.MaxTokensCeiling),
		within("task-max-sandboxes", c.Budgets.MaxSandboxes, 0, govern.MaxSandboxesCeiling),
		within("task-max-cpu", c.Budgets.MaxCPUSeconds, 0, govern.MaxCPUSecondsCeiling),
		within("loop-window", c.Loop.Window, 0, govern.MaxLoopWindow),
		nonNegative("loop-warn", c.Loop.WarnAt),
		nonNegative("loop-trip", c.Loop.TripAt),
		nonNegative("idle-timeout", c.IdleTimeout),
		within("kill-grace", c.KillGrace, 0, MaxKillGrace),
		within("death-check-interval", c.DeathCheckInterval, 0, MaxDeathCheckInterval),
		nonNegative("egress-max-conns", c.EgressLimits.MaxConns),
		nonNegative("egress-max-bytes", c.EgressLimits.MaxBytes),
		nonNegative("egress-rpm", c.EgressLimits.RequestsPerMinute),
		nonNegative("egress-refusal-interval", c.RefusalInterval),
		nonNegative("audit-prune-interval", c.AuditRetention.Interval),
		nonNegative("http-header-timeout", c.HTTPHeaderTimeout),
		nonNegative("http-idle-timeout", c.HTTPIdleTimeout),
		nonNegative("http-stall-timeout", c.HTTPStallTimeout),
		nonNegative("max-streams-per-key", c.MaxStreamsPerKey),
		nonNegative("max-event-streams-per-key", c.MaxEventStreamsPerKey),
		nonNegative("max-event-streams-per-team", c.MaxEventStreamsPerTeam),
		nonNegative("max-event-streams", c.MaxEventStreams),
		nonNegative("event-heartbeat", c.EventHeartbeat),
	}
	switch c.Driver {
	case "", DriverOCI:
	case DriverKube:
		if err := c.Kube.validate(); err != nil {
			errs = append(errs, err)
		}
	default:
		errs = append(errs, fmt.Errorf("driver %q: use %s or %s", c.Driver, DriverOCI, DriverKube))
	}
	switch c.RunawayAction {
	case "", sandbox.RunawayKillSandbox, sandbox.RunawayKillCommands:
	default:
		errs = append(errs, fmt.Errorf("cpu-runaway-action %q: use %s or %s", c.RunawayAction, sandbox.RunawayKillSandbox, sandbox.RunawayKillCommands))
	}
	switch c.PortsDefault {
	case "", "public", "private":
	default:
		errs = append(errs, fmt.Errorf("ports-default %q: use public or private", c.PortsDefault))
	}
	switch c.RunscPlatform {
	case "", oci.PlatformSystrap, oci.PlatformPtrace, oci.PlatformKVM:
	default:
		errs = append(errs, fmt.Errorf("runsc-platform %q: use %s, %s or %s", c.RunscPlatform, oci.PlatformSystrap, oci.PlatformPtrace, oci.PlatformKVM))
	}
	switch c.E2BInternet {
	case "", "none", "all-public":
	default:
		errs = append(errs, fmt.Errorf("e2b-internet %q: use none or all-public", c.E2BInternet))
	}
	errs = append(errs, c.checkTLS())
	if c.NodeID != "" && !nodeIDRe.MatchString(c.NodeID) {
		errs = append(errs, fmt.Errorf("node-id %q: 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit", c.NodeID))
	}
	if c.Store != "" && !store.IsPostgres(c.Store) {
		errs = append(errs, fmt.Errorf("store: want a postgres:// or postgresql:// URL (the default store is the SQLite file DATA/corral.db)"))
	}
	if c.EgressResolver != "" {
		if _, _, err := net.SplitHostPort(c.EgressResolver); err != nil {
			errs = append(errs, fmt.Errorf("egress-resolver %q: %w", c.EgressResolver, err))
		}
	}
	if c.NetworkRange.IsValid() {
		if err := netns.CheckRange(c.NetworkRange); err != nil {
			errs = append(errs, fmt.Errorf("sandbox-net: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.HTTPHeaderTimeout == 0 {
		c.HTTPHeaderTimeout = DefaultHTTPHeaderTimeout
	}
	if c.HTTPIdleTimeout == 0 {
		c.HTTPIdleTimeout = DefaultHTTPIdleTimeout
	}
	abs, err := filepath.Abs(c.DataDir)
	if err != nil {
		return fmt.Errorf("data %q: %w", c.DataDir, err)
	}
	c.DataDir = abs
	if c.NodeID == "" {
		c.NodeID = DefaultNodeID(c.DataDir)
	}
	if c.NoAuditArchive {
		c.AuditRetention.ArchiveDir = ""
	} else if c.AuditRetention.ArchiveDir == "" {
		c.AuditRetention.ArchiveDir = filepath.Join(c.DataDir, "audit-archive")
	}
	return nil
}

// number is a setting's numeric type.
type number interface {
	~int | ~int64 | ~float64
}

// nonNegative refuses a negative (or not finite) value of setting key.
func nonNegative[T number](key string, v T) error {
	if f := float64(v); math.IsInf(f, 0) {
		return fmt.Errorf("%s %v: must be a finite number", key, v)
	} else if !(f >= 0) {
		return fmt.Errorf("%s %v: must not be negative", key, v)
	}
	return nil
}

// within refuses a value of setting key outside lo..hi (or not a number).
func within[T number](key string, v, lo, hi T) error {
	if !(v >= lo && v <= hi) {
		return fmt.Errorf("%s %v: must be %v..%v", key, v, lo, hi)
	}
	return nil
}

// Server is a started control plane.
type Server struct {
	cfg     Config
	Store   *store.Store
	Manager *sandbox.Manager
	// Volumes is the volume service.
	Volumes *volume.Service
	Handler http.Handler
	// AdminKey is the admin API key.
	AdminKey string
	// Gateway is the network gateway; nil when networking is off.
	Gateway *gateway.Gateway
	// Audit is the audit log writer.
	Audit *audit.Log
	// Redactor holds every registered secret value.
	Redactor *egress.Redactor
	// Governor keeps tasks, budgets and breakers.
	Governor *govern.Governor
	// Watchdog samples running sandboxes.
	Watchdog *watchdog.Watchdog
	// Usage meters what sandboxes use (GET /v1/usage, the
	// corral_usage_* counters).
	Usage *usage.Meter
	// summary summarises egress refusals; nil without a gateway.
	summary *egress.Summarizer

	stopWatchdog  context.CancelFunc
	stopRetention func() // stops the retention loop and waits for it
	stopBuild     func() // cancels a background code-interpreter build and waits for it

	templates *registry.Registry
	// driver runs the sandboxes (an *oci.Driver or a *kube.Driver);
	// Close closes it (a kube driver's Pods keep running).
	driver closingDriver
}

// closingDriver is a runtime driver the server closes when it stops.
type closingDriver interface {
	runtime.Driver
	Close() error
}

// IDRange is the host uid/gid range the server's sandboxes map to.
func (s *Server) IDRange() idrange.Range { return s.cfg.IDRange }

// Open prepares everything but the listener: it creates the data dir,
// opens the store, ensures the admin key and base template, and
// reconciles sandboxes left from a previous run.
func Open(ctx context.Context, cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := keepInheritedFDs(); err != nil {
		return nil, fmt.Errorf("mark inherited descriptors close-on-exec: %w", err)
	}
	if cfg.Driver != DriverKube { // a kube driver's sandboxes run on the cluster's nodes
		maxSandboxes := cfg.Admission.MaxConcurrent
		if maxSandboxes <= 0 {
			maxSandboxes = govern.DefaultMaxConcurrent
		}
		kq, err := ensureKeyQuota(procKeys{"/proc"}, maxSandboxes, cfg.Log)
		if err != nil {
			return nil, err
		}
		cfg.Admission.MaxConcurrent, cfg.Admission.MaxConcurrentNote = kq.Capacity, kq.Note
	}
	if err := os.MkdirAll(cfg.DataDir, 0o711); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	if err := os.Chmod(cfg.DataDir, 0o711); err != nil {
		return nil, err
	}
	// Before the store: a data dir with a database and no recorded range
	// is one made with the legacy range.
	ids, err := ResolveIDRange(cfg.DataDir, cfg.IDRange, cfg.IDFiles)
	if err != nil {
		return nil, err
	}
	cfg.IDRange = ids
	st, err := store.Open(cfg.StoreAddr())
	if err != nil {
		return nil, err
	}
	key, revoked, err := ensureAdminKey(ctx, st, filepath.Join(cfg.DataDir, "admin.key"))
	if err != nil {
		st.Close()
		return nil, err
	}
	if revoked {
		cfg.Log.Warn("DATA/admin.key holds a revoked key: it authenticates nothing (use another admin key, or remove the file and restart to make a new one)", "key_id", store.KeyID(store.HashKey(key)))
	}
	// Every secret value is redacted from the log and the audit log.
	red := &egress.Redactor{}
	secrets, err := st.ListSecrets(ctx, "")
	if err != nil {
		st.Close()
		return nil, err
	}
	for _, sec := range secrets {
		_ = red.AddFor(sec.Team, sec.Name, sec.Value)
	}
	cfg.Log = slog.New(egress.NewSlogHandler(cfg.Log.Handler(), red))
	al := audit.New(st, red, cfg.Log)
	meter, err := usage.New(ctx, st, usage.Config{Log: cfg.Log})
	if err != nil {
		al.Close()
		st.Close()
		return nil, err
	}
	reg := registry.New(st, registry.Config{Dir: filepath.Join(cfg.DataDir, "template-versions"), IDBase: ids.Base, Audit: al, Log: cfg.Log})
	if err := ensureBase(ctx, cfg, reg); err != nil {
		al.Close()
		st.Close()
		return nil, err
	}
	built, err := registerCodeInterpreter(ctx, cfg, reg)
	if err != nil {
		al.Close()
		st.Close()
		return nil, err
	}
	stopBuild := func() {}
	if cfg.BuildCodeInterpreter && !built {
		stopBuild = buildCodeInterpreter(cfg, reg)
	}
	lockDownDirs(cfg)
	agentBin, err := installAgent(cfg.AgentBinary, cfg.DataDir)
	if err != nil {
		al.Close()
		st.Close()
		return nil, err
	}
	var drv closingDriver
	gvisorLegacy := false
	if cfg.Driver == DriverKube {
		drv, err = openKube(ctx, cfg.Kube, cfg.NodeID, reg, cfg.Log)
		cfg.NoNetwork = true
	} else {
		var runsc oci.Runsc
		if runsc, err = findRunsc(cfg); err == nil {
			var od *oci.Driver
			od, err = oci.New(oci.Options{StateDir: filepath.Join(cfg.DataDir, "sandboxes"), AgentBinary: agentBin, UIDBase: ids.Base,
				RunscPath: runsc.Path, RunscLegacy: runsc.Legacy, RunscPlatform: cfg.RunscPlatform})
			if err == nil { // a nil *oci.Driver in the interface would not be nil
				drv, gvisorLegacy = od, od.GVisorLegacy()
			}
		}
	}
	if err != nil {
		al.Close()
		st.Close()
		return nil, err
	}
	var mgr *sandbox.Manager
	var volSvc *volume.Service
	adm := govern.NewAdmission(cfg.Admission)
	met := metrics.New(metrics.Config{
		Sandboxes: func(ctx context.Context) (map[string]int, error) { return st.CountSandboxes(ctx) },
		Pools: func() []metrics.Pool {
			var out []metrics.Pool
			for _, p := range mgr.Pools() {
				out = append(out, metrics.Pool{Team: p.Team, Template: p.Template, Idle: p.Idle, Target: p.Target, Hits: p.Hits, Misses: p.Misses,
					Refills: p.Refills, RefillSecondsAvg: p.RefillMSAvg / 1000})
			}
			return out
		},
		Admission: func() (int, int) { s := adm.Stats(); return s.Running, s.Waiting },
		Audit:     al.Stats,
		Teams: func() map[string]int {
			out := map[string]int{}
			for team, ts := range adm.Stats().Teams {
				out[team] = ts.Running
			}
			return out
		},
		Volumes: func(ctx context.Context) (n int, used, size int64, err error) {
			vs, err := volSvc.List(ctx, "")
			if err != nil {
				return 0, 0, 0, err
			}
			for _, v := range vs {
				if u, sz, err := volSvc.Usage(v); err == nil {
					used, size = used+u, size+sz
				}
			}
			return len(vs), used, size, nil
		},
		Usage: func(ctx context.Context) (map[string]metrics.TeamUsage, error) {
			totals, err := meter.TeamTotals(ctx)
			out := make(map[string]metrics.TeamUsage, len(totals))
			for team, t := range totals {
				out[team] = metrics.TeamUsage{CPUSeconds: t.CPUSeconds, MemoryGiBSeconds: t.MemoryGiBSeconds, SandboxSeconds: t.SandboxSeconds,
					EgressBytes: t.EgressBytesUp + t.EgressBytesDown, Commands: t.Commands}
			}
			return out, err
		},
	})
	al.Observe(func(ev *store.Event) {
		met.Event(ev)
		if ev.Kind == "sandbox.ended" {
			meter.Kick() // its last amounts reach the store soon
		}
	})
	var gw *gateway.Gateway
	var sum *egress.Summarizer
	if !cfg.NoNetwork {
		sum = egress.NewSummarizer(egress.SummaryConfig{Interval: cfg.RefusalInterval, After: cfg.RefusalEvents, Log: cfg.Log,
			OnSummary: func(s egress.Summary) { al.Record(s.Sandbox, "egress.summary", summaryData(s)) }})
		gw, err = openGateway(cfg, al, sum, meter)
		if err != nil {
			// Sandboxes without a network still work; asking for one
			// fails with a clear error.
			cfg.Log.Error("sandbox networking unavailable", "err", err)
			gw = nil
		}
	}
	gov := govern.New(govern.Config{Defaults: cfg.Budgets, Loop: cfg.Loop, Audit: al, Log: cfg.Log,
		OnTrip: func(t *store.Task) { mgr.OnTrip(t) }}, st)
	// Volumes need loop devices and mkfs.ext4; without them the server
	// runs and volume calls fail with a clear error.
	vols, err := volume.New(filepath.Join(cfg.DataDir, "volumes"), int(ids.Base)+idrange.SandboxUser, int(ids.Base))
	if err != nil {
		cfg.Log.Warn("volumes unavailable", "err", err)
		vols = nil
	}
	volSvc = volume.NewService(vols, st, al, cfg.Log)
	var wd *watchdog.Watchdog
	mcfg := sandbox.Config{
		KillGrace: cfg.KillGrace, EgressLimits: cfg.EgressLimits, RefuseEnvSecrets: cfg.RefuseEnvSecrets, Audit: al,
		PrivatePorts: cfg.PortsDefault == "private",
		Governor:     gov, Admission: adm, ArtifactDir: filepath.Join(cfg.DataDir, "artifacts"), MaxOutput: cfg.MaxOutput,
		IdleTimeout: cfg.IdleTimeout, WatchInterval: cfg.DeathCheckInterval, MemoryPressure: cfg.MemoryPressure, Volumes: volSvc, RunawayAction: cfg.RunawayAction, SnapshotDir: filepath.Join(cfg.DataDir, "snapshots"),
		IDBase: ids.Base, OnCommand: meter.Command, GVisorLegacy: gvisorLegacy, Node: cfg.NodeID,
	}
	if gw != nil { // a nil *Gateway in the interface would not be nil
		mcfg.Gateway = gw
	}
	if cfg.Driver == DriverKube && cfg.Kube.Egress {
		mcfg.RemoteProxyEnv = cfg.Kube.proxyEnv()
		if mcfg.RemoteCA, err = cfg.Kube.egressCA(); err != nil {
			return nil, err
		}
	}
	mgr = sandbox.New(mcfg, st, drv, reg, cfg.Log)
	wcfg := cfg.Watchdog
	if hook := wcfg.OnSample; hook != nil {
		wcfg.OnSample = func(id string, smp watchdog.Sample) { meter.Sample(id, smp); hook(id, smp) }
	} else {
		wcfg.OnSample = meter.Sample
	}
	wd = watchdog.New(wcfg, mgr, mgr.OnWatchdogEvent, mgr.OnRunaway)
	mgr.SetWatchdog(wd)
	wctx, wcancel := context.WithCancel(context.Background())
	go wd.Run(wctx)
	// A marker file lives while the server runs; finding it at start means
	// the last run did not stop cleanly (a crash or kill -9).
	marker := filepath.Join(cfg.DataDir, "server.running")
	_, statErr := os.Stat(marker)
	crashed := statErr == nil
	if err := os.WriteFile(marker, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		cfg.Log.Warn("write run marker", "err", err)
	}
	al.Record("", "server.started", map[string]any{"pid": os.Getpid(), "after_crash": crashed})
	if err := mgr.Reconcile(ctx); err != nil {
		wcancel()
		mgr.Shutdown(ctx, false)
		if gw != nil {
			gw.Close()
		}
		sum.Close()
		al.Close()
		st.Close()
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	if crashed {
		al.Record("", "server.recovered", map[string]any{"reconciled": true,
			"note": "the previous run did not stop cleanly; running sandboxes were adopted, dead ones ended as orphaned, state without a record reclaimed"})
	}
	rctx, rcancel := context.WithCancel(context.Background())
	rdone := make(chan struct{})
	go func() { defer close(rdone); al.RunRetention(rctx, cfg.AuditRetention) }()
	h := api.New(api.Config{MaxOutput: cfg.MaxOutput, Redactor: red, Audit: al, E2BInternet: cfg.E2BInternet,
		Governor: gov, Metrics: met.Handler(), StallTimeout: cfg.HTTPStallTimeout, MaxStreamsPerKey: cfg.MaxStreamsPerKey, Templates: reg, Volumes: volSvc,
		Usage: meter, MaxEventStreamsPerKey: cfg.MaxEventStreamsPerKey, MaxEventStreamsPerTeam: cfg.MaxEventStreamsPerTeam,
		MaxEventStreams: cfg.MaxEventStreams, EventHeartbeat: cfg.EventHeartbeat}, mgr, st, cfg.Log)
	meter.Start()
	return &Server{cfg: cfg, driver: drv, Store: st, Manager: mgr, Volumes: volSvc, Handler: h, AdminKey: key, Gateway: gw, Audit: al,
		Redactor: red, Governor: gov, Watchdog: wd, Usage: meter, stopWatchdog: wcancel, templates: reg, summary: sum,
		stopRetention: func() { rcancel(); <-rdone }, stopBuild: stopBuild}, nil
}

// InstanceTagLen is the length of a server's instance tag: 5 hex digits
// (about a million values), so that servers on one host do not collide;
// interface names keep 8 hex digits of the sandbox id.
const InstanceTagLen = 5

// instanceTag tells corral servers with different data dirs apart on one
// host (nftables table and interface names).
func instanceTag(dataDir string) string {
	sum := sha256.Sum256([]byte(dataDir))
	return hex.EncodeToString(sum[:])[:InstanceTagLen]
}

// nodeIDRe is what --node-id accepts (a Kubernetes label value's
// alphabet, so that it can name the replica on the Pods it claims).
var nodeIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// DefaultNodeID is the node id of a server given no --node-id: its host
// name and the instance tag of its data dir (two servers on one host
// with their own data dirs are two nodes), made a valid node id.
func DefaultNodeID(dataDir string) string {
	h := sandbox.DefaultNode()
	h = strings.Map(func(r rune) rune {
		if r < 128 && (r == '.' || r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return r
		}
		return '-'
	}, h)
	h = strings.TrimLeft(h, "._-")
	if len(h) > 63-1-InstanceTagLen {
		h = h[:63-1-InstanceTagLen]
	}
	if h == "" {
		h = "corral"
	}
	return h + "-" + instanceTag(dataDir)
}

// openGateway starts the network gateway: egress CA, resolver, listeners
// and the nftables table.
func openGateway(cfg Config, al *audit.Log, sum *egress.Summarizer, meter *usage.Meter) (*gateway.Gateway, error) {
	dir := filepath.Join(cfg.DataDir, "net")
	ca, err := egress.LoadOrCreateCA(filepath.Join(cfg.DataDir, "ca"))
	if err != nil {
		return nil, err
	}
	var resolver egress.Resolver
	if cfg.EgressResolver != "" {
		addr := cfg.EgressResolver
		resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}}
	}
	var roots *x509.CertPool
	if cfg.EgressUpstreamCA != "" {
		pem, err := os.ReadFile(cfg.EgressUpstreamCA)
		if err != nil {
			return nil, fmt.Errorf("egress upstream CA: %w", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("egress upstream CA %s: no certificates", cfg.EgressUpstreamCA)
		}
	}
	return gateway.New(gateway.Config{
		Range: cfg.NetworkRange, Instance: instanceTag(cfg.DataDir), Dir: dir,
		Resolver: resolver, CA: ca, UpstreamRoots: roots, Log: cfg.Log,
		// Every egress event is metered and recorded: the usage's egress
		// bytes are the sum of the audit log's egress records.
		OnEvent: func(ev egress.Event) {
			meter.Egress(ev.Sandbox, ev.BytesUp, ev.BytesDown)
			al.Record(ev.Sandbox, eventKind(ev), eventData(ev))
		},
		Summary: sum,
	})
}

// Close stops the manager (killing sandboxes if configured), the network
// gateway (removing every veth pair and the nftables table), the audit
// log and the store.
func (s *Server) Close(ctx context.Context) error {
	s.stopWatchdog()
	s.stopRetention()
	s.stopBuild()
	s.Manager.Shutdown(ctx, s.cfg.KillOnShutdown)
	var errs []error
	if err := s.driver.Close(); err != nil {
		errs = append(errs, err)
	}
	if s.Gateway != nil {
		if err := s.Gateway.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	s.summary.Close() // the last windows' summaries, before the log closes
	s.Audit.Record("", "server.stopped", map[string]any{"kill_on_shutdown": s.cfg.KillOnShutdown})
	s.Audit.Close()
	if err := s.Usage.Close(); err != nil { // the last amounts, before the store closes
		errs = append(errs, fmt.Errorf("usage: %w", err))
	}
	_ = os.Remove(filepath.Join(s.cfg.DataDir, "server.running"))
	if err := s.Store.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkTLS checks --listen, --tls-cert, --tls-key and --insecure. It
// defends against API keys and sandbox tokens crossing a network in clear
// text: a plain-HTTP listener on an address that is not loopback is
// refused unless --insecure says so. A certificate and key that do not
// load as a pair are refused at start (naming the files, never their
// contents) rather than at the first handshake.
func (c *Config) checkTLS() error {
	listen := c.Listen
	if listen == "" {
		listen = DefaultListen
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("listen %q: %w", listen, err)
	}
	switch {
	case c.TLSCert == "" && c.TLSKey == "":
		if !c.Insecure && !IsLoopbackHost(host) {
			return fmt.Errorf("listen %q is not a loopback address and no TLS is configured: API keys and sandbox tokens would cross the network in clear text; give --tls-cert and --tls-key, or --insecure to serve plain HTTP anyway (for example behind a TLS-terminating proxy)", listen)
		}
		return nil
	case c.TLSCert == "":
		return errors.New("tls-key is set without tls-cert: give both or neither")
	case c.TLSKey == "":
		return errors.New("tls-cert is set without tls-key: give both or neither")
	}
	for _, f := range []struct{ flag, path string }{{"tls-cert", c.TLSCert}, {"tls-key", c.TLSKey}} {
		fh, err := os.Open(f.path)
		if err != nil {
			return fmt.Errorf("%s %s: %w", f.flag, f.path, err)
		}
		fh.Close()
	}
	if _, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey); err != nil {
		// The crypto/tls errors describe the PEM blocks and the mismatch,
		// not the key's bytes.
		return fmt.Errorf("tls-cert %s and tls-key %s are not a valid certificate and private key pair: %w", c.TLSCert, c.TLSKey, err)
	}
	return nil
}

// IsLoopbackHost reports whether host (from HOST:PORT) is "localhost" or
// an address in 127.0.0.0/8 or ::1. The empty host and 0.0.0.0 or ::
// (every interface) are not loopback.
func IsLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// HTTPServer returns the HTTP server for s.Handler with the listener's
// bounds: headers must arrive within HTTPHeaderTimeout and stay under
// 64 KiB, idle keep-alive connections close after HTTPIdleTimeout. There
// is no ReadTimeout or WriteTimeout: they run from a request's start and
// would cut every stream (commands, watches, downloads, WebSockets); the
// API bounds each read and write instead (HTTPStallTimeout).
func (s *Server) HTTPServer() *http.Server {
	hs := &http.Server{Handler: s.Handler, ReadHeaderTimeout: s.cfg.HTTPHeaderTimeout,
		IdleTimeout: s.cfg.HTTPIdleTimeout, MaxHeaderBytes: maxHeaderBytes}
	if a, ok := s.Handler.(*api.Server); ok {
		// Event streams never go idle: end them, or Shutdown waits its
		// whole timeout for an open console tab.
		hs.RegisterOnShutdown(a.EndEventStreams)
	}
	return hs
}

// Run serves until ctx is done, then shuts down gracefully.
func Run(ctx context.Context, cfg Config) error {
	s, err := Open(ctx, cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		s.Close(context.Background())
		return fmt.Errorf("listen: %w", err)
	}
	hs := s.HTTPServer()
	scheme := "http"
	if s.cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(s.cfg.TLSCert, s.cfg.TLSKey)
		if err != nil {
			ln.Close()
			s.Close(context.Background())
			return fmt.Errorf("tls-cert %s and tls-key %s: %w", s.cfg.TLSCert, s.cfg.TLSKey, err)
		}
		hs.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
		ln = tls.NewListener(ln, hs.TLSConfig)
		scheme = "https"
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	s.cfg.Log.Info("corral serving", "listen", ln.Addr().String(), "scheme", scheme, "data", s.cfg.DataDir)
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	if cerr := s.Close(sctx); err == nil {
		err = cerr
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// ensureAdminKey reads DIR/admin.key or creates it (mode 0600) with a
// new key (store.NewKeyValue: E2B's shape, e2b_ + 40 hex), and adds it to
// the store as an admin key of team default unless it is stored already.
// A stored key is never changed: a revoked admin key stays revoked
// across restarts (it defends against a restart reviving a revoked key).
// It returns the key and whether it is revoked.
func ensureAdminKey(ctx context.Context, st *store.Store, path string) (string, bool, error) {
	b, err := os.ReadFile(path)
	key := strings.TrimSpace(string(b))
	if errors.Is(err, os.ErrNotExist) || key == "" {
		key = store.NewKeyValue()
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return "", false, fmt.Errorf("write admin key: %w", err)
		}
		if _, err := f.WriteString(key + "\n"); err != nil {
			f.Close()
			return "", false, fmt.Errorf("write admin key: %w", err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return "", false, err
		}
		f.Close()
	} else if err != nil {
		return "", false, fmt.Errorf("read admin key: %w", err)
	}
	if err := st.AddAPIKey(ctx, "admin", key, store.DefaultTeam, store.RoleAdmin); err != nil {
		return "", false, err
	}
	k, err := st.GetAPIKey(ctx, store.KeyID(store.HashKey(key)))
	if err != nil {
		return "", false, fmt.Errorf("admin key: %w", err)
	}
	return key, k.RevokedAt != nil, nil
}

// ensureBase makes sure the registry has a current base version whose
// build is on disk, building it (cached by content and uid range base)
// when it is missing, after moving an old data dir's template links
// (DATA/templates) into the registry. A base shifted to another range
// than the data dir's is refused.
func ensureBase(ctx context.Context, cfg Config, reg *registry.Registry) error {
	if err := reg.MigrateLinks(ctx, filepath.Join(cfg.DataDir, "templates")); err != nil {
		return err
	}
	if t, err := reg.Base(ctx); err == nil {
		return checkTemplateBase(t, cfg.IDRange)
	} else if !errors.Is(err, registry.ErrNotFound) {
		return err
	}
	t, err := template.BuildBase(ctx, cfg.TemplateCache, template.BaseOptions{Progress: cfg.Progress, IDBase: cfg.IDRange.Base})
	if err != nil {
		return err
	}
	return reg.RegisterBase(ctx, t)
}

// registerCodeInterpreter registers the cached build of this corral's
// code-interpreter recipe for the data dir's uid range, if there is one
// (corral template build-code-interpreter makes it), and reports whether
// there was: a new data dir finds the template without a build, and a
// corral with a new interpreter server makes its build current. Nothing
// is built here.
func registerCodeInterpreter(ctx context.Context, cfg Config, reg *registry.Registry) (bool, error) {
	t, err := template.CachedCodeInterpreter(cfg.TemplateCache, template.CodeInterpreterOptions{IDBase: cfg.IDRange.Base})
	if err != nil {
		return false, nil // not built: creates naming it are refused as unknown
	}
	if err := checkTemplateBase(t, cfg.IDRange); err != nil {
		return false, err
	}
	return true, reg.RegisterCodeInterpreter(ctx, t)
}

// buildCodeInterpreter builds and registers the code-interpreter template
// in the background (--build-code-interpreter); until it is done, creates
// naming it are refused as unknown. The returned func cancels the build
// (which then leaves nothing behind) and waits for it.
func buildCodeInterpreter(cfg Config, reg *registry.Registry) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		cfg.Log.Info("building the code-interpreter template in the background")
		t, err := template.BuildCodeInterpreter(ctx, cfg.TemplateCache, template.CodeInterpreterOptions{Progress: cfg.Progress, IDBase: cfg.IDRange.Base})
		if err == nil {
			err = reg.RegisterCodeInterpreter(ctx, t)
		}
		if err != nil {
			if ctx.Err() == nil {
				cfg.Log.Error("code-interpreter template build", "err", err)
			}
			return
		}
		cfg.Log.Info("code-interpreter template ready", "version", t.Version, "bytes", t.Size)
	}()
	return func() { cancel(); <-done }
}

// checkTemplateBase refuses a template whose files are shifted to another
// uid range than the server's: its files would belong to strangers inside
// the sandbox (and to whoever holds those ids outside).
func checkTemplateBase(t template.Template, r idrange.Range) error {
	if t.IDBase != r.Base {
		return fmt.Errorf("template %s (%s) is owned by the uid range based at %d, but the data dir's range is %s: register a base built for this range (corral template build-base) or use the matching --data dir", t.Name, t.Dir, t.IDBase, r)
	}
	return nil
}

// installAgent copies the agent binary into the data dir, from where it
// is bind-mounted read-only into sandboxes. The copy lives on a path
// sandbox root can traverse, unlike a binary under /root. Without one
// configured it is the lean corral-agent installed beside the running
// binary (an idle agent costs the host less memory: docs/performance.md,
// "Idle sandbox density") or, if there is none, the running binary
// itself (corral agent).
func installAgent(bin, dataDir string) (string, error) {
	if bin == "" {
		self, err := os.Executable()
		if err != nil {
			return "", err
		}
		bin = self
		if lean := filepath.Join(filepath.Dir(self), LeanAgentName); isExecutable(lean) {
			bin = lean
		}
	}
	return InstallAgentBinary(bin, dataDir)
}

// LeanAgentName is the lean agent binary's name (cmd/corral-agent).
const LeanAgentName = "corral-agent"

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// InstallAgentBinary copies bin to DATA/bin/corral-agent (atomically).
func InstallAgentBinary(bin, dataDir string) (string, error) {
	dir := filepath.Join(dataDir, "bin")
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", err
	}
	src, err := os.Open(bin)
	if err != nil {
		return "", fmt.Errorf("agent binary: %w", err)
	}
	defer src.Close()
	tmp, err := os.CreateTemp(dir, ".agent-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, src); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	dst := filepath.Join(dir, "corral-agent")
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", err
	}
	return dst, nil
}

// TemplateRootFS returns the rootfs directory of a registered template.
func (s *Server) TemplateRootFS(name string) (string, error) {
	return s.templates.RootFS(context.Background(), name)
}

// lockDownDirs keeps host users out of the trees that hold files owned by
// the shifted sandbox root (setuid sudo among them), also on data dirs made
// by older versions: template builds, imports, snapshot and template
// layers are root-only; each sandbox's dir is root:BASE mode 0710 (BASE:
// the uid range's base; the sandbox's root must reach its rootfs and run
// dir).
func lockDownDirs(cfg Config) {
	cache := cfg.TemplateCache
	if cache == "" {
		cache = template.DefaultCacheDir()
	}
	for _, d := range []string{cache, filepath.Join(cfg.DataDir, "snapshots"), filepath.Join(cfg.DataDir, "template-versions")} {
		if _, err := os.Stat(d); err == nil {
			if err := template.PrivateDir(d); err != nil {
				cfg.Log.Warn("lock down directory", "dir", d, "err", err)
			}
		}
	}
	ents, _ := os.ReadDir(filepath.Join(cfg.DataDir, "sandboxes"))
	for _, e := range ents {
		p := filepath.Join(cfg.DataDir, "sandboxes", e.Name())
		if e.IsDir() {
			_ = os.Chown(p, 0, int(cfg.IDRange.Base))
			_ = os.Chmod(p, 0o710)
		}
	}
}

// findRunsc picks the runsc binary (oci.FindRunsc) and says at start
// which one gVisor sandboxes get, warning when it is the fallback. A
// host without any runsc still serves runc sandboxes (gVisor ones fail to
// start, naming the missing binary); a --runsc that cannot be run is an
// error.
func findRunsc(cfg Config) (oci.Runsc, error) {
	r, err := oci.FindRunsc(cfg.Runsc, "")
	switch {
	case err != nil && cfg.Runsc != "":
		return r, err
	case err != nil:
		cfg.Log.Warn("gVisor unavailable", "err", err)
		return oci.Runsc{Path: "runsc"}, nil
	case r.Legacy || (cfg.Runsc == "" && r.Path != oci.CachedRunsc("")):
		cfg.Log.Warn("gVisor runtime: fallback runsc", "runsc", r.Path, "note", r.Note)
	default:
		cfg.Log.Info("gVisor runtime", "runsc", r.Path, "note", r.Note, "kvm", oci.KVMAvailable())
	}
	return r, nil
}
