package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	corral "github.com/corralhq/corral/sdk/go"
)

// clientGlobals are the connection flags shared by the client commands.
type clientGlobals struct {
	server  string
	apiKey  string
	dataDir string
}

// addClientCommands registers the client commands (run, sandbox).
func addClientCommands(root *cobra.Command) {
	g := &clientGlobals{}
	for _, c := range []*cobra.Command{newRunCmd(g), newSandboxCmd(g), newSecretCmd(g), newAuditCmd(g), newTaskCmd(g), newDrillCmd(g), newSnapshotCmd(g), newPoolCmd(g), newTemplateCmd(g), newVolumeCmd(g), newKeyCmd(g), newUsageCmd(g), newMCPCmd(g), newTeamCmd(g), newTopCmd(g)} {
		pf := c.PersistentFlags()
		pf.StringVar(&g.server, "server", "", "corral server URL (env CORRAL_URL, default "+corral.DefaultURL+")")
		pf.StringVar(&g.apiKey, "api-key", "", "API key (env CORRAL_API_KEY, else DATA/admin.key for a local server)")
		pf.StringVar(&g.dataDir, "data", "", "server data directory holding admin.key (env CORRAL_DATA, default "+corral.DefaultDataDir+")")
		c.SetFlagErrorFunc(flagErrorFunc)
		wrapClientErrors(c)
		root.AddCommand(c)
	}
}

// wrapClientErrors strips the SDK's "corral: " prefix from errors returned
// by cmd and its subcommands, since main prints "corral: " itself.
func wrapClientErrors(cmd *cobra.Command) {
	if run := cmd.RunE; run != nil {
		cmd.RunE = func(c *cobra.Command, args []string) error {
			err := run(c, args)
			var ec exitCoder
			if err == nil || asExitCoder(err, &ec) {
				return err
			}
			return trimmedError{err}
		}
	}
	for _, sub := range cmd.Commands() {
		wrapClientErrors(sub)
	}
}

// trimmedError is err with its message's "corral: " prefixes removed.
type trimmedError struct{ err error }

func (e trimmedError) Error() string {
	msg := e.err.Error()
	for strings.HasPrefix(msg, "corral: ") {
		msg = strings.TrimPrefix(msg, "corral: ")
	}
	return msg
}

func (e trimmedError) Unwrap() error { return e.err }

// client builds the SDK client from the flags and the environment.
func (g *clientGlobals) client() (*corral.Client, error) {
	server, key, roots, err := g.endpoint()
	if err != nil {
		return nil, err
	}
	opts := []corral.Option{corral.WithUserAgent("corral-cli")}
	if roots != nil {
		opts = append(opts, corral.WithRootCAs(roots))
	}
	return corral.New(server, key, opts...), nil
}

// endpoint resolves the server URL, the API key and the CAs to trust
// (nil: the system's) from the flags and the environment.
func (g *clientGlobals) endpoint() (server, key string, roots *x509.CertPool, err error) {
	server = firstNonEmpty(g.server, os.Getenv("CORRAL_URL"), corral.DefaultURL)
	key = firstNonEmpty(g.apiKey, os.Getenv("CORRAL_API_KEY"))
	if key == "" {
		key, err = corral.LocalAdminKey(server, firstNonEmpty(g.dataDir, os.Getenv("CORRAL_DATA")))
		if err != nil {
			return "", "", nil, err
		}
	}
	if f := os.Getenv(corral.CAFileEnv); f != "" {
		if roots, err = corral.LoadCAFile(f); err != nil {
			return "", "", nil, err
		}
	}
	return server, key, roots, nil
}

func firstNonEmpty(v ...string) string {
	for _, s := range v {
		if s != "" {
			return s
		}
	}
	return ""
}

// signalContext returns a context cancelled on SIGINT/SIGTERM.
func signalContext(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	return signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
}

// apiFailure maps request errors: invalid arguments are usage errors
// (exit 2), the rest are returned for main to print (exit 1, or
// ExitCapacity for a refusal worth retrying: failureCode).
func apiFailure(cmd *cobra.Command, err error) error {
	if corral.IsInvalidArgument(err) {
		return usageError(cmd, "%v", err)
	}
	return err
}

// printCreated prints what a create made: v as JSON under --json, else
// its id alone (for scripts: id=$(corral ... create)).
func printCreated(asJSON bool, v any, id string) error {
	if asJSON {
		return printJSON(v)
	}
	_, err := termPrintln(os.Stdout, id)
	return err
}

// printJSON prints v as indented JSON (writeJSON): --json output.
func printJSON(v any) error { return writeJSON(os.Stdout, v, true) }

// sandboxFlags are the flags that describe a new sandbox.
type sandboxFlags struct {
	template, runtime, tier string
	cpu                     float64
	memory, disk            string
	pids, nofile            int64
	ttl                     string
	commandTimeout          string
	network                 string
	allow, secrets          []string
	task, agent, snapshot   string
	autoPause, pauseMemory  bool
	env, metadata           []string
	volumes                 []string
	privatePorts            bool
	publicPorts             bool
}

func (f *sandboxFlags) register(cmd *cobra.Command, forCreate bool) {
	fl := cmd.Flags()
	fl.StringVar(&f.template, "template", "", `root filesystem template (default "base")`)
	fl.StringVar(&f.runtime, "runtime", "", "runtime: runc (default) or gvisor")
	fl.StringVar(&f.tier, "tier", "", "resource tier: light (default), medium or heavy")
	fl.Float64Var(&f.cpu, "cpu", 0, "CPU cores, fractional (e.g. 0.5; default from the tier)")
	fl.StringVar(&f.memory, "memory", "", "memory limit, e.g. 256m, 1g, 512MiB; a plain number is MiB")
	fl.StringVar(&f.disk, "disk", "", "writable disk limit, e.g. 100m, 2g; a plain number is MiB")
	fl.Int64Var(&f.pids, "pids", 0, "maximum number of processes/threads")
	fl.Int64Var(&f.nofile, "nofile", 0, "open files limit (RLIMIT_NOFILE)")
	fl.StringVar(&f.network, "net", "", `egress: none (default), allow (only --allow) or all-public`)
	fl.StringArrayVar(&f.allow, "allow", nil, "allowed domain pattern (api.github.com, *.pypi.org) or CIDR:port rule; implies --net allow (repeatable)")
	fl.StringVar(&f.task, "task", "", "task the sandbox belongs to (corral task create); its calls count against the task's budgets")
	if forCreate {
		fl.BoolVar(&f.autoPause, "auto-pause", false, "pause instead of kill at the end of the TTL")
		fl.BoolVar(&f.pauseMemory, "pause-memory", false, "with --auto-pause: keep processes frozen (default: save files, stop processes)")
		fl.StringVar(&f.snapshot, "snapshot", "", "start from a snapshot (corral sandbox snapshot) instead of the bare template")
		fl.BoolVar(&f.privatePorts, "private-ports", false, "ports answer only requests with the sandbox's traffic token (header e2b-traffic-access-token; --json prints it as traffic_token)")
		fl.BoolVar(&f.publicPorts, "public-ports", false, "ports answer anyone who can reach the server (overrides a server started with --ports-default private)")
	}
	fl.StringVar(&f.agent, "agent", "", "agent name, for per-agent limits and the audit log")
	fl.StringArrayVar(&f.secrets, "secret", nil, "registered secret the sandbox may use through the egress proxy (repeatable; see corral secret set)")
	fl.StringArrayVar(&f.env, "env", nil, "environment variable K=V for every process (repeatable)")
	fl.StringVar(&f.ttl, "ttl", "", "sandbox lifetime, e.g. 10m or 600 (default 300s)")
	fl.StringArrayVar(&f.metadata, "metadata", nil, "metadata label K=V (repeatable)")
	fl.StringArrayVar(&f.volumes, "volume", nil, "mount a volume, NAME:/path (repeatable; see corral volume create)")
	if forCreate {
		fl.StringVar(&f.commandTimeout, "command-timeout", "", "default per-command timeout for exec (default from the tier)")
	}
}

func (f *sandboxFlags) options() (corral.CreateOptions, error) {
	mode, err := netMode(f.network, f.allow)
	if err != nil {
		return corral.CreateOptions{}, err
	}
	o := corral.CreateOptions{Template: f.template, Runtime: f.runtime, Tier: f.tier, Network: mode,
		Allow: f.allow, Secrets: f.secrets, Task: f.task, Agent: f.agent, Snapshot: f.snapshot,
		AutoPause: f.autoPause, PauseMemory: f.pauseMemory}
	switch {
	case f.privatePorts && f.publicPorts:
		return o, errors.New("--private-ports and --public-ports exclude each other")
	case f.privatePorts || f.publicPorts:
		public := f.publicPorts
		o.PublicTraffic = &public
	}
	switch f.runtime {
	case "", "runc", "gvisor":
	default:
		return o, fmt.Errorf("invalid --runtime %q: use runc or gvisor", f.runtime)
	}
	switch f.tier {
	case "", "light", "medium", "heavy":
	default:
		return o, fmt.Errorf("invalid --tier %q: use light, medium or heavy", f.tier)
	}
	if f.cpu < 0 || f.pids < 0 || f.nofile < 0 {
		return o, errors.New("--cpu, --pids and --nofile must be positive")
	}
	o.Resources = corral.Resources{CPU: f.cpu, Pids: f.pids, Nofile: f.nofile}
	if f.memory != "" {
		if o.Resources.MemoryMB, err = parseSizeMiB(f.memory); err != nil {
			return o, fmt.Errorf("--memory: %w", err)
		}
	}
	if f.disk != "" {
		if o.Resources.DiskMB, err = parseSizeMiB(f.disk); err != nil {
			return o, fmt.Errorf("--disk: %w", err)
		}
	}
	if f.ttl != "" {
		if o.Timeout, err = parseDurationArg(f.ttl); err != nil {
			return o, fmt.Errorf("--ttl: %w", err)
		}
		if o.Timeout < time.Second {
			return o, errors.New("--ttl: must be at least 1s")
		}
	}
	if f.commandTimeout != "" {
		if o.CommandTimeout, err = parseDurationArg(f.commandTimeout); err != nil {
			return o, fmt.Errorf("--command-timeout: %w", err)
		}
	}
	if o.Env, err = parseKV(f.env); err != nil {
		return o, fmt.Errorf("--env: %w", err)
	}
	if o.Metadata, err = parseKV(f.metadata); err != nil {
		return o, fmt.Errorf("--metadata: %w", err)
	}
	for _, v := range f.volumes {
		name, path, ok := strings.Cut(v, ":")
		if !ok || name == "" || !strings.HasPrefix(path, "/") {
			return o, fmt.Errorf("--volume %q: want NAME:/absolute/path", v)
		}
		o.Volumes = append(o.Volumes, corral.VolumeMount{Volume: name, Path: path})
	}
	return o, nil
}

// netMode checks --net and applies "--allow implies allow".
func netMode(mode string, allow []string) (string, error) {
	switch mode {
	case "":
		if len(allow) > 0 {
			return "allow", nil
		}
		return "", nil
	case "none", "all-public":
		if len(allow) > 0 {
			return "", fmt.Errorf("--allow needs --net allow (got --net %s)", mode)
		}
		return mode, nil
	case "allow":
		return mode, nil
	}
	return "", fmt.Errorf("invalid --net %q: use none, allow or all-public", mode)
}

// printWarnings shows the server's warnings about a new sandbox.
func printWarnings(sb *corral.Sandbox) {
	for _, w := range sb.Warnings {
		termPrintln(os.Stderr, "corral: warning:", w)
	}
}

// call makes a cobra RunE for a command that talks to the server: it
// builds the client, gives fn a context that Ctrl-C cancels, and maps API
// errors (invalid arguments are usage errors, exit 2).
func (g *clientGlobals) call(fn func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, err := g.client()
		if err != nil {
			return err
		}
		ctx, stop := signalContext(cmd)
		defer stop()
		if err := fn(ctx, c, cmd, args); err != nil {
			var ae *corral.APIError
			if errors.As(err, &ae) {
				return apiFailure(cmd, err)
			}
			return err
		}
		return nil
	}
}
