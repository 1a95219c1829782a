package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/corralhq/corral/internal/agent"
)

// newAgentCmd is `corral agent`, the in-sandbox daemon. corral starts it as
// PID 1 of every sandbox (the lean corral-agent binary serves it too, and
// is preferred when installed); it is not meant to be run by hand. Its
// flags are agent.Command's.
func newAgentCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "agent [--socket PATH] [--default-user USER] [--token-file FILE] [--listen ADDR] [--max-upload BYTES]",
		Short:              "Run the in-sandbox agent (started by corral inside each sandbox)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			os.Exit(agent.Command(args, os.Stderr))
			return nil
		},
	}
}
