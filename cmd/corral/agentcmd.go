package main

import "github.com/spf13/cobra"

func newAgentCmd() *cobra.Command {
	return &cobra.Command{Use: "agent", Short: "Run the in-sandbox agent (started by corral inside each sandbox)", Hidden: true}
}
