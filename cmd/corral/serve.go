package main

import (
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/corralhq/corral/internal/api"
	"github.com/corralhq/corral/internal/idrange"
	"github.com/corralhq/corral/internal/server"
)

// newServeCmd is `corral serve`: the control plane.
func newServeCmd() *cobra.Command {
	var cfg server.Config
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the corral server (needs root)",
		Long: `Run the corral control plane. On first start it creates DATA/admin.key
(mode 0600) and builds the base template (cached by content under
/var/cache/corral/templates), then serves the REST API on --listen.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			cfg.Progress = os.Stderr
			cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
			return server.Run(ctx, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", server.DefaultListen, "HOST:PORT to serve the API on")
	f.StringVar(&cfg.DataDir, "data", envOr("CORRAL_DATA", server.DefaultDataDir), "data directory (database, admin key, sandbox state)")
	f.StringVar(&cfg.TemplateCache, "template-cache", "", "template build cache (default /var/cache/corral/templates or $CORRAL_TEMPLATE_CACHE)")
	f.IntVar(&cfg.MaxOutput, "max-output", 1<<20, "bytes of stdout and of stderr an exec call returns (the tail is kept)")
	f.IntVar(&cfg.MaxSandboxes, "max-sandboxes", 10, "maximum number of running sandboxes (global admission limit)")
	f.IntVar(&cfg.Admission.MaxPerAgent, "max-per-agent", 0, "running sandboxes per named agent (default 5; sandboxes without an agent count only globally)")
	f.Float64Var(&cfg.Admission.AgentRate, "agent-rate", 0, "sandbox creates per second per named agent (token bucket; default 1)")
	f.IntVar(&cfg.Admission.AgentBurst, "agent-burst", 0, "burst of creates per named agent (default 5)")
	f.DurationVar(&cfg.Admission.QueueTimeout, "queue-timeout", 0, "how long a create may wait for a free slot before capacity_exceeded (default 0: fail at once)")
	f.Int64Var(&cfg.Budgets.MaxCalls, "task-max-calls", 0, "default tool-call budget of a task (default 30)")
	f.DurationVar(&cfg.Budgets.MaxDuration, "task-max-duration", 0, "default wall-time budget of a task (default 1h)")
	f.Int64Var(&cfg.Budgets.MaxTokens, "task-max-tokens", 0, "default token budget of a task (default 2000000)")
	f.Int64Var(&cfg.Budgets.MaxSandboxes, "task-max-sandboxes", 0, "default limit of a task's sandboxes at once (default 5)")
	f.Float64Var(&cfg.Budgets.MaxCPUSeconds, "task-max-cpu", 0, "default CPU-seconds budget of a task (default 3600)")
	f.IntVar(&cfg.Loop.Window, "loop-window", 0, "tool calls the loop detector looks back over (default 10)")
	f.IntVar(&cfg.Loop.WarnAt, "loop-warn", 0, "near-identical calls in the window that give loop_suspected (default 4)")
	f.Float64Var(&cfg.Loop.TripAt, "loop-trip", 0, "weighted repeat score that opens the breaker with loop_detected (default 8; a repeat counts 1, 2 when it failed with the same exit code)")
	f.DurationVar(&cfg.Watchdog.CPURunawayFor, "cpu-runaway-for", 0, "CPU-bound this long (90% of its quota used, or demanded while waiting for a CPU) kills the sandbox as cpu_runaway (default 30s; negative disables)")
	f.StringVar(&cfg.RunawayAction, "cpu-runaway-action", "sandbox", "what the CPU-runaway rule kills: sandbox or command (its running commands; the sandbox lives on)")
	f.DurationVar(&cfg.IdleTimeout, "idle-timeout", 0, "end sandboxes with no command for this long (default 0: never)")
	f.DurationVar(&cfg.KillGrace, "kill-grace", 3*time.Second, "time between SIGTERM and SIGKILL when a sandbox is killed (0..1m)")
	f.DurationVar(&cfg.DeathCheckInterval, "death-check-interval", time.Second, "how often running sandboxes are checked for a dead init, ended with reason error or oom (0..1m)")
	f.BoolVar(&cfg.KillOnShutdown, "kill-on-shutdown", false, "kill all sandboxes when the server stops (default: keep them; the next start adopts them)")
	f.Var(prefixFlag{&cfg.NetworkRange}, "sandbox-net", "IPv4 range for sandbox veth pairs, a /28 or larger (default 10.201.0.0/16)")
	f.BoolVar(&cfg.NoNetwork, "no-network", false, "run without the network gateway: sandboxes can only have --net none")
	f.StringVar(&cfg.EgressResolver, "egress-resolver", "", "DNS server HOST:PORT for names sandboxes may reach (default: the host's resolver)")
	f.StringVar(&cfg.EgressUpstreamCA, "egress-upstream-ca", "", "PEM file of CAs to trust for upstream TLS when injecting secrets (default: the system's)")
	f.IntVar(&cfg.EgressLimits.MaxConns, "egress-max-conns", 0, "concurrent egress connections per sandbox (default 64)")
	f.Int64Var(&cfg.EgressLimits.MaxBytes, "egress-max-bytes", 0, "egress bytes up+down per sandbox over its life (default 1 GiB)")
	f.IntVar(&cfg.EgressLimits.RequestsPerMinute, "egress-rpm", 0, "egress requests/connections per minute per sandbox (default 600)")
	f.IntVar(&cfg.RefusalEvents, "egress-refusal-events", 0, "egress refusals per sandbox and interval recorded one by one; the rest are counted in one egress.summary event (default 60; negative: none)")
	f.DurationVar(&cfg.RefusalInterval, "egress-refusal-interval", 0, "the interval of --egress-refusal-events (default 1m)")
	f.DurationVar(&cfg.AuditRetention.MaxAge, "audit-max-age", 0, "delete audit events and ended command records older than this (default 720h = 30 days; negative: keep)")
	f.Int64Var(&cfg.AuditRetention.MaxEvents, "audit-max-events", 0, "most audit events kept, oldest deleted first (default 1000000; negative: no limit)")
	f.Int64Var(&cfg.AuditRetention.MaxCommands, "audit-max-commands", 0, "most command records kept, oldest deleted first (default 1000000; negative: no limit)")
	f.StringVar(&cfg.AuditRetention.ArchiveDir, "audit-archive", "", "directory that receives audit events before retention deletes them, as gzip JSON Lines (default DATA/audit-archive)")
	f.BoolVar(&cfg.NoAuditArchive, "no-audit-archive", false, "delete audit events past the retention without archiving them")
	f.DurationVar(&cfg.AuditRetention.Interval, "audit-prune-interval", 0, "time between retention runs; the first runs at start (default 1h)")
	f.StringVar(&cfg.E2BInternet, "e2b-internet", "none", "network mode of E2B sandboxes created with internet access and no allowOut: none or all-public")
	f.DurationVar(&cfg.HTTPHeaderTimeout, "http-header-timeout", server.DefaultHTTPHeaderTimeout, "time a client has to send a request's headers")
	f.DurationVar(&cfg.HTTPIdleTimeout, "http-idle-timeout", server.DefaultHTTPIdleTimeout, "keep-alive connections idle this long between requests are closed")
	f.DurationVar(&cfg.HTTPStallTimeout, "http-stall-timeout", api.DefaultStallTimeout, "one read of a request body or one write of a response blocked this long cuts the connection (streams that keep moving are never cut)")
	f.IntVar(&cfg.MaxStreamsPerKey, "max-streams-per-key", api.DefaultMaxStreamsPerKey, "streams (commands, watches, file transfers, exec calls, template builds) one API key or one sandbox's envd credential may hold open; more get 429 too_many_streams")
	f.BoolVar(&cfg.RefuseEnvSecrets, "refuse-env-secrets", false, "refuse sandboxes whose env vars look like secrets (default: accept with a warning)")
	f.Var(idRangeFlag{&cfg.IDRange}, "uid-range", "host uid/gid range sandboxes map to, BASE[:65536]; must not overlap /etc/subuid, /etc/subgid or a user or group (default: the data dir's, else corral's entry in /etc/subuid, else a free one from 1073741824 up, recorded there)")
	f.Var(idFilesFlag{&cfg.IDFiles}, "id-files", "read subuid, subgid, passwd and group from DIR instead of /etc (for tests)")
	_ = f.MarkHidden("id-files")
	return cmd
}

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

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
