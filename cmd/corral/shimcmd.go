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
		Use:                "shim [--hide-proc-sys-net] -- RUNTIME ARGS...",
		Short:              "Supervise an OCI runtime process (internal)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			hide := false
			if len(args) > 0 && args[0] == shim.HideProcSysNetFlag {
				hide, args = true, args[1:]
			}
			if len(args) > 0 && args[0] == "--" {
				args = args[1:]
			}
			os.Exit(shim.Run(args, hide))
			return nil
		},
	}
}
