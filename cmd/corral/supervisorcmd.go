package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/corralhq/corral/internal/supervisor"
)

// newSupervisorCmd is `corral supervisor --socket PATH`, the one process
// that reaps what the OCI runtime leaves of every sandbox of a data
// directory (package supervisor). corral starts it; it is not meant to
// be run by hand. Its flags are supervisor.Command's.
func newSupervisorCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "supervisor --socket PATH [--idle-exit DURATION]",
		Short:              "Reap the processes of corral's sandboxes (internal)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			os.Exit(supervisor.Command(args, os.Stderr))
			return nil
		},
	}
}
