package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/corralhq/corral/internal/supervisor"
)

// newSupervisorCmd is `corral supervisor --socket PATH`, the one process
// that reaps what the OCI runtime leaves of every sandbox of a data
// directory (package supervisor). corral starts it; it is not meant to
// be run by hand.
func newSupervisorCmd() *cobra.Command {
	var sock string
	var idle = supervisor.DefaultIdleExit
	cmd := &cobra.Command{
		Use:    "supervisor --socket PATH",
		Short:  "Reap the processes of corral's sandboxes (internal)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			os.Exit(supervisor.Serve(sock, idle))
			return nil
		},
	}
	cmd.Flags().StringVar(&sock, "socket", "", "unix socket to serve on")
	cmd.Flags().DurationVar(&idle, "idle-exit", idle, "exit after this long with nothing to reap and no client")
	_ = cmd.MarkFlagRequired("socket")
	return cmd
}
