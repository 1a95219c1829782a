package main

import "github.com/spf13/cobra"

// addClientCommands registers the client commands (sandbox, run, ...).
func addClientCommands(root *cobra.Command) {}
