package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/corralhq/corral/internal/shim"
)

// newShimCmd is `corral shim -- RUNTIME ARGS...`, the supervisor corral
// runs each sandbox's runtime under. Not meant to be run by hand.
func newShimCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "shim -- RUNTIME ARGS...",
		Short:              "Supervise an OCI runtime process (internal)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 && args[0] == "--" {
				args = args[1:]
			}
			os.Exit(shim.Run(args))
			return nil
		},
	}
}
