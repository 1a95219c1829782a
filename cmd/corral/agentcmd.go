package main

import (
	"github.com/spf13/cobra"

	"github.com/corralhq/corral/internal/agent"
)

// newAgentCmd is `corral agent`, the in-sandbox daemon. corral starts it as
// PID 1 of every sandbox; it is not meant to be run by hand.
func newAgentCmd() *cobra.Command {
	var cfg agent.Config
	cmd := &cobra.Command{
		Use:    "agent",
		Short:  "Run the in-sandbox agent (started by corral inside each sandbox)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return agent.Main(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Socket, "socket", "/run/corral/agent.sock", "unix socket to serve the agent API on")
	f.StringVar(&cfg.DefaultUser, "default-user", "user", "user for requests that name none")
	f.StringVar(&cfg.TokenFile, "token-file", "", "file holding the access token (no token: no access check)")
	f.Int64Var(&cfg.MaxUpload, "max-upload", 100<<20, "maximum size of one file upload request in bytes")
	return cmd
}
