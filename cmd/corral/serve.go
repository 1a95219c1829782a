package main

import (
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

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
	f.IntVar(&cfg.MaxSandboxes, "max-sandboxes", 50, "maximum number of running sandboxes")
	f.DurationVar(&cfg.KillGrace, "kill-grace", 3*time.Second, "time between SIGTERM and SIGKILL when a sandbox is killed (0..1m)")
	f.BoolVar(&cfg.KillOnShutdown, "kill-on-shutdown", false, "kill all sandboxes when the server stops (default: keep them; the next start adopts them)")
	return cmd
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
