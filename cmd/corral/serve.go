package main

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/corralhq/corral/internal/api"
	"github.com/corralhq/corral/internal/audit"
	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/flagfile"
	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/idrange"
	"github.com/corralhq/corral/internal/netns"
	"github.com/corralhq/corral/internal/runtime/oci"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/server"
	"github.com/corralhq/corral/internal/template"
	"github.com/corralhq/corral/internal/watchdog"
)

// serveEnv are the environment variables `corral serve` reads, each for
// one flag the command line did not set (docs/configuration.md).
var serveEnv = []flagfile.EnvVar{
	{Var: "CORRAL_CONFIG", Flag: "config"},
	{Var: "CORRAL_LISTEN", Flag: "listen"},
	{Var: "CORRAL_DATA", Flag: "data"},
	{Var: "CORRAL_STORE", Flag: "store"},
	{Var: "CORRAL_NODE_ID", Flag: "node-id"},
	{Var: template.CacheEnv, Flag: "template-cache"},
	{Var: "CORRAL_LOG_LEVEL", Flag: "log-level"},
}

// serveOptions are the settings of `corral serve`.
type serveOptions struct {
	cfg server.Config
	// config is the configuration file (--config).
	config string
	// logLevel is the server log's level (--log-level).
	logLevel slog.Level
}

// serveSources fill o's flag set from the environment and the --config
// file.
func serveSources(getenv func(string) string) flagfile.Sources {
	return flagfile.Sources{Env: serveEnv, Getenv: getenv, FileFlag: "config"}
}

// load applies the environment and the configuration file to the flags
// fs left unset, then checks the configuration.
func (o *serveOptions) load(fs *pflag.FlagSet, getenv func(string) string) error {
	if err := serveSources(getenv).Apply(fs); err != nil {
		return err
	}
	return o.cfg.Validate()
}

// newServeCmd is `corral serve`: the control plane.
func newServeCmd() *cobra.Command {
	var o serveOptions
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the corral server (needs root)",
		Long: `Run the corral control plane. On first start it creates DATA/admin.key
(mode 0600) and builds the base template (cached by content under
/var/cache/corral/templates), then serves the REST API on --listen.

Every flag is also a key of the --config file (TOML; the key is the
flag's name without the leading "--": max-sandboxes = 20). The command line wins over the
environment (CORRAL_CONFIG, CORRAL_LISTEN, CORRAL_DATA,
CORRAL_TEMPLATE_CACHE, CORRAL_LOG_LEVEL), which wins over the file.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.load(cmd.Flags(), os.Getenv); err != nil {
				return usageError(cmd, "%v", err)
			}
			o.cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: o.logLevel}))
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			o.cfg.Progress = os.Stderr
			return server.Run(ctx, o.cfg)
		},
	}
	cmd.Flags().AddFlagSet(serveFlags(&o))
	return cmd
}

// serveFlags is the table of `corral serve`'s settings: each flag's name
// (also its config-file key), its default (a named constant of the
// package that applies it, the same constant that package falls back to
// for a zero value) and where it is stored. The help text, the config file
// keys and docs/configuration.md (TestConfigurationDocs) all come from it.
func serveFlags(o *serveOptions) *pflag.FlagSet {
	cfg := &o.cfg
	f := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	f.StringVar(&o.config, "config", "", "TOML file of settings: keys are these flags' names (max-sandboxes = 20); flags and environment variables override it")
	f.Var(logLevelFlag{&o.logLevel}, "log-level", "least severe messages logged: debug, info, warn or error")
	f.StringVar(&cfg.Listen, "listen", server.DefaultListen, "HOST:PORT to serve the API on")
	f.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM certificate (chain) file: serve HTTPS (TLS 1.2+) with --tls-key; read once at start")
	f.StringVar(&cfg.TLSKey, "tls-key", "", "PEM private key file of --tls-cert")
	f.BoolVar(&cfg.Insecure, "insecure", false, "allow plain HTTP on a --listen address that is not loopback (API keys would cross the network in clear text)")
	f.StringVar(&cfg.DataDir, "data", server.DefaultDataDir, "data directory (database, admin key, sandbox state)")
	f.StringVar(&cfg.NodeID, "node-id", "", "this control plane's id in the records of its sandboxes: stable across restarts, unique among the control planes sharing a --store (default: host name and a tag of the data dir)")
	f.StringVar(&cfg.Store, "store", "", "PostgreSQL store shared by several control planes, postgres://USER@HOST:PORT/DB?... (password in PGPASSWORD or ~/.pgpass, not here); default: the SQLite file DATA/corral.db")
	f.StringVar(&cfg.TemplateCache, "template-cache", template.DefaultCache, "template build cache")
	f.BoolVar(&cfg.BuildCodeInterpreter, "build-code-interpreter", false, "build the code-interpreter template in the background at start when the cache lacks it (fetches Debian packages; corral template build-code-interpreter does it in the foreground)")
	f.IntVar(&cfg.MaxOutput, "max-output", api.DefaultMaxOutput, "bytes of stdout and of stderr an exec call returns (the tail is kept)")
	f.IntVar(&cfg.Admission.MaxConcurrent, "max-sandboxes", govern.DefaultMaxConcurrent, "maximum number of running sandboxes (global admission limit)")
	f.IntVar(&cfg.Admission.MaxPerAgent, "max-per-agent", govern.DefaultMaxPerAgent, "running sandboxes per named agent (sandboxes without an agent count only globally)")
	f.Float64Var(&cfg.Admission.AgentRate, "agent-rate", govern.DefaultAgentRate, "sandbox creates per second per named agent (token bucket)")
	f.IntVar(&cfg.Admission.AgentBurst, "agent-burst", govern.DefaultAgentBurst, "burst of creates per named agent")
	f.DurationVar(&cfg.Admission.QueueTimeout, "queue-timeout", 0, "how long a create may wait for a free slot before capacity_exceeded (0: fail at once)")
	f.IntVar(&cfg.Admission.Team.MaxSandboxes, "team-max-sandboxes", 0, "running sandboxes per team (0: no team limit); corral team quota overrides it per team")
	f.IntVar(&cfg.Admission.Team.MaxPerAgent, "team-max-per-agent", 0, "running sandboxes per named agent of a team, below --max-per-agent (0: no team limit)")
	f.Float64Var(&cfg.Admission.Team.MaxCPUs, "team-max-cpus", 0, "CPUs (sum of resources.cpu) of a team's running sandboxes (0: no team limit)")
	f.Int64Var(&cfg.Admission.Team.MaxMemoryMB, "team-max-memory-mb", 0, "memory in MiB (sum of resources.memory_mb) of a team's running sandboxes (0: no team limit)")
	f.Float64Var(&cfg.Admission.Team.CreateRate, "team-create-rate", 0, "sandbox creates per second per team, token bucket (0: no team limit)")
	f.IntVar(&cfg.Admission.Team.CreateBurst, "team-create-burst", 0, "burst of --team-create-rate (0: the rate rounded up, at least 1)")
	f.Int64Var(&cfg.Budgets.MaxCalls, "task-max-calls", govern.DefaultMaxCalls, "default tool-call budget of a task")
	f.DurationVar(&cfg.Budgets.MaxDuration, "task-max-duration", govern.DefaultMaxDuration, "default wall-time budget of a task")
	f.Int64Var(&cfg.Budgets.MaxTokens, "task-max-tokens", govern.DefaultMaxTokens, "default token budget of a task")
	f.Int64Var(&cfg.Budgets.MaxSandboxes, "task-max-sandboxes", govern.DefaultMaxSandboxes, "default limit of a task's sandboxes at once")
	f.Float64Var(&cfg.Budgets.MaxCPUSeconds, "task-max-cpu", govern.DefaultMaxCPUSeconds, "default CPU-seconds budget of a task")
	f.IntVar(&cfg.Loop.Window, "loop-window", govern.DefaultLoopWindow, "tool calls the loop detector looks back over")
	f.IntVar(&cfg.Loop.WarnAt, "loop-warn", govern.DefaultLoopWarnAt, "near-identical calls in the window that give loop_suspected")
	f.Float64Var(&cfg.Loop.TripAt, "loop-trip", govern.DefaultLoopTripAt, "weighted repeat score that opens the breaker with loop_detected (a repeat counts 1, 2 when it failed with the same exit code)")
	f.DurationVar(&cfg.Watchdog.CPURunawayFor, "cpu-runaway-for", watchdog.DefaultCPURunawayFor, "CPU-bound this long (90% of its quota used, or demanded while waiting for a CPU) kills the sandbox as cpu_runaway (negative disables)")
	f.StringVar(&cfg.RunawayAction, "cpu-runaway-action", sandbox.RunawayKillSandbox, "what the CPU-runaway rule kills: sandbox or command (its running commands; the sandbox lives on)")
	f.DurationVar(&cfg.IdleTimeout, "idle-timeout", 0, "end sandboxes with no command for this long (0: never)")
	f.DurationVar(&cfg.KillGrace, "kill-grace", sandbox.DefaultKillGrace, "time between SIGTERM and SIGKILL when a sandbox is killed (0.."+server.MaxKillGrace.String()+")")
	f.DurationVar(&cfg.DeathCheckInterval, "death-check-interval", sandbox.DefaultWatchInterval, "how often running sandboxes are checked for a dead init, ended with reason error or oom (0.."+server.MaxDeathCheckInterval.String()+")")
	f.BoolVar(&cfg.KillOnShutdown, "kill-on-shutdown", false, "kill all sandboxes when the server stops (default: keep them; the next start adopts them)")
	cfg.NetworkRange = netns.DefaultRange
	f.Var(prefixFlag{&cfg.NetworkRange}, "sandbox-net", fmt.Sprintf("IPv4 range for sandbox veth pairs, a /%d or larger", netns.MaxRangeBits))
	f.BoolVar(&cfg.NoNetwork, "no-network", false, "run without the network gateway: sandboxes can only have --net none")
	f.StringVar(&cfg.Driver, "driver", server.DriverOCI, "runtime driver: oci (runc/runsc on this host) or kube (a Pod per sandbox on a Kubernetes cluster; docs/kubernetes.md)")
	f.StringVar(&cfg.Kube.Kubeconfig, "kubeconfig", "", "kubeconfig file of the kube driver (empty: the in-cluster service account)")
	f.StringVar(&cfg.Kube.Namespace, "kube-namespace", server.DefaultKubeNamespace, "namespace of the sandbox Pods")
	f.StringVar(&cfg.Kube.Image, "kube-image", "", "sandbox image of templates --kube-images does not name (needed with --driver kube)")
	f.StringVar(&cfg.Kube.Images, "kube-images", "", "sandbox images per template: TEMPLATE=IMAGE,...")
	f.StringVar(&cfg.Kube.AgentImage, "kube-agent-image", "", "image holding the corral binary at /corral (and cp), copied into each Pod by an init container (empty: the sandbox images hold it at /opt/corral/corral)")
	f.StringVar(&cfg.Kube.RuntimeClass, "kube-runtime-class", server.DefaultKubeRuntimeClass, "RuntimeClass of gvisor sandboxes (runc sandboxes get the cluster's default runtime)")
	f.StringVar(&cfg.Kube.RuntimeClasses, "kube-runtime-classes", "", "RuntimeClass per template, over --kube-runtime-class: TEMPLATE=CLASS,...")
	f.StringVar(&cfg.Kube.ReadOnlyRoot, "kube-read-only-root", "", "templates whose Pods get a read-only root file system: TEMPLATE,...")
	f.StringVar(&cfg.Kube.Pools, "kube-pools", "", "warm pools of ready Pods: TEMPLATE=N,... (serve creates with the default tier, runtime and user)")
	f.BoolVar(&cfg.Kube.Egress, "kube-egress", false, "let sandbox Pods reach the egress proxy Pods (app.kubernetes.io/name=corral-egress in --kube-control-plane-namespace, ports 3128 and 53); needs a CNI that enforces NetworkPolicy")
	f.StringVar(&cfg.Kube.DNS, "kube-dns", "", "the DNS filter's Service IP, the only name server of sandbox Pods (with --kube-egress)")
	f.StringVar(&cfg.Kube.EgressCA, "kube-egress-ca", "", "PEM file of the egress proxy's CA certificate (ca.pem, never the key): sandboxes with secrets get it installed by their agent (with --kube-egress)")
	f.StringVar(&cfg.Kube.ControlPlaneNamespace, "kube-control-plane-namespace", server.DefaultKubeCPNamespace, "namespace of the control plane and the egress proxy (the NetworkPolicy admits them)")
	f.BoolVar(&cfg.Kube.NetworkPolicyEnforced, "kube-networkpolicy-enforced", false, "assert that the cluster's CNI enforces NetworkPolicy when the detection (docs/kubernetes.md) does not find it")
	f.Float64Var(&cfg.Kube.QPS, "kube-qps", server.DefaultKubeQPS, "API requests per second the kube driver may send (client-go rate limit)")
	f.IntVar(&cfg.Kube.Burst, "kube-burst", server.DefaultKubeBurst, "burst of --kube-qps")
	f.StringVar(&cfg.EgressResolver, "egress-resolver", "", "DNS server HOST:PORT for names sandboxes may reach (default: the host's resolver)")
	f.StringVar(&cfg.EgressUpstreamCA, "egress-upstream-ca", "", "PEM file of CAs to trust for upstream TLS when injecting secrets (default: the system's)")
	f.IntVar(&cfg.EgressLimits.MaxConns, "egress-max-conns", egress.DefaultMaxConns, "concurrent egress connections per sandbox")
	f.Int64Var(&cfg.EgressLimits.MaxBytes, "egress-max-bytes", egress.DefaultMaxBytes, "egress bytes up+down per sandbox over its life")
	f.IntVar(&cfg.EgressLimits.RequestsPerMinute, "egress-rpm", egress.DefaultRequestsPerMinute, "egress requests/connections per minute per sandbox")
	f.IntVar(&cfg.RefusalEvents, "egress-refusal-events", egress.DefaultSummaryAfter, "egress refusals per sandbox and interval recorded one by one; the rest are counted in one egress.summary event (negative: none)")
	f.DurationVar(&cfg.RefusalInterval, "egress-refusal-interval", egress.DefaultSummaryInterval, "the interval of --egress-refusal-events")
	f.DurationVar(&cfg.AuditRetention.MaxAge, "audit-max-age", audit.DefaultMaxAge, "delete audit events and ended command records older than this (negative: keep)")
	f.Int64Var(&cfg.AuditRetention.MaxEvents, "audit-max-events", audit.DefaultMaxEvents, "most audit events kept, oldest deleted first (negative: no limit)")
	f.Int64Var(&cfg.AuditRetention.MaxCommands, "audit-max-commands", audit.DefaultMaxCommands, "most command records kept, oldest deleted first (negative: no limit)")
	f.StringVar(&cfg.AuditRetention.ArchiveDir, "audit-archive", "", "directory that receives audit events before retention deletes them, as gzip JSON Lines (default DATA/audit-archive)")
	f.BoolVar(&cfg.NoAuditArchive, "no-audit-archive", false, "delete audit events past the retention without archiving them")
	f.DurationVar(&cfg.AuditRetention.Interval, "audit-prune-interval", audit.DefaultPruneInterval, "time between retention runs; the first runs at start")
	f.StringVar(&cfg.PortsDefault, "ports-default", "public", "port access of a sandbox whose create request does not say: public or private (a request to a port must carry the sandbox's traffic token)")
	f.StringVar(&cfg.E2BInternet, "e2b-internet", server.DefaultE2BInternet, "network mode of E2B sandboxes created with internet access and no allowOut: none or all-public")
	f.DurationVar(&cfg.HTTPHeaderTimeout, "http-header-timeout", server.DefaultHTTPHeaderTimeout, "time a client has to send a request's headers")
	f.DurationVar(&cfg.HTTPIdleTimeout, "http-idle-timeout", server.DefaultHTTPIdleTimeout, "keep-alive connections idle this long between requests are closed")
	f.DurationVar(&cfg.HTTPStallTimeout, "http-stall-timeout", api.DefaultStallTimeout, "one read of a request body or one write of a response blocked this long cuts the connection (streams that keep moving are never cut)")
	f.IntVar(&cfg.MaxStreamsPerKey, "max-streams-per-key", api.DefaultMaxStreamsPerKey, "streams (commands, watches, file transfers, exec calls, template builds) one API key or one sandbox's envd credential may hold open; more get 429 too_many_streams")
	f.IntVar(&cfg.MaxEventStreamsPerKey, "max-event-streams-per-key", api.DefaultMaxEventStreamsPerKey, "event streams (GET /v1/events/stream: corral top, the console) one API key may hold open; more get 429 too_many_streams")
	f.IntVar(&cfg.MaxEventStreamsPerTeam, "max-event-streams-per-team", api.DefaultMaxEventStreamsPerTeam, "event streams the keys of one team may hold open together; more get 429 too_many_streams")
	f.IntVar(&cfg.MaxEventStreams, "max-event-streams", api.DefaultMaxEventStreams, "event streams the server holds open in all; more get 429 too_many_streams")
	f.DurationVar(&cfg.EventHeartbeat, "event-heartbeat", api.DefaultEventHeartbeat, "an idle event stream sends a comment and re-checks its key this often (a revoked key's stream ends)")
	f.BoolVar(&cfg.RefuseEnvSecrets, "refuse-env-secrets", false, "refuse sandboxes whose env vars look like secrets (default: accept with a warning)")
	f.StringVar(&cfg.Runsc, "runsc", "", "runsc binary for gVisor sandboxes (default: the pinned build "+oci.CachedRunsc("")+" that make runsc installs, else runsc in PATH as a fallback, logged at start)")
	f.StringVar(&cfg.RunscPlatform, "runsc-platform", "", "gVisor platform: systrap (default), ptrace (default of a runsc without systrap) or kvm (needs a usable /dev/kvm; detected, never chosen by itself)")
	f.Var(idRangeFlag{&cfg.IDRange}, "uid-range", "host uid/gid range sandboxes map to, BASE[:65536]; must not overlap /etc/subuid, /etc/subgid or a user or group (default: the data dir's, else corral's entry in /etc/subuid, else a free one from 1073741824 up, recorded there)")
	f.Var(idFilesFlag{&cfg.IDFiles}, "id-files", "read subuid, subgid, passwd and group from DIR instead of /etc (for tests)")
	_ = f.MarkHidden("id-files")
	return f
}

// logLevelFlag is a --log-level flag: debug, info, warn or error.
type logLevelFlag struct{ l *slog.Level }

func (f logLevelFlag) String() string {
	if f.l == nil {
		return ""
	}
	return strings.ToLower(f.l.String())
}

func (f logLevelFlag) Set(s string) error {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return fmt.Errorf("use debug, info, warn or error")
	}
	*f.l = l
	return nil
}

func (f logLevelFlag) Type() string { return "level" }

// idRangeFlag is a --uid-range BASE[:COUNT] flag.
type idRangeFlag struct{ r *idrange.Range }

func (f idRangeFlag) String() string {
	if f.r == nil || f.r.IsZero() {
		return ""
	}
	return f.r.String()
}

func (f idRangeFlag) Set(s string) error {
	r, err := idrange.Parse(s)
	if err != nil {
		return err
	}
	*f.r = r
	return nil
}

func (f idRangeFlag) Type() string { return "BASE[:COUNT]" }

// idFilesFlag is a directory holding subuid, subgid, passwd and group.
type idFilesFlag struct{ f *idrange.Files }

func (f idFilesFlag) String() string {
	if f.f == nil || f.f.SubUID == "" {
		return ""
	}
	return filepath.Dir(f.f.SubUID)
}

func (f idFilesFlag) Set(s string) error {
	*f.f = idrange.InDir(s)
	return nil
}

func (f idFilesFlag) Type() string { return "DIR" }

// prefixFlag is a netip.Prefix flag.
type prefixFlag struct{ p *netip.Prefix }

func (f prefixFlag) String() string {
	if f.p == nil || !f.p.IsValid() {
		return ""
	}
	return f.p.String()
}

func (f prefixFlag) Set(s string) error {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return err
	}
	*f.p = p
	return nil
}

func (f prefixFlag) Type() string { return "cidr" }
