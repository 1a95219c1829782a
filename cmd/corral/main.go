// Command corral is the corral sandbox runtime: the server (serve), the
// in-sandbox agent (agent), and the client commands (sandbox, run, template).
package main

import (
	"io"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	root := &cobra.Command{
		Use:           "corral",
		Short:         "Isolated, limited sandboxes for AI agents",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newServeCmd(), newEgressProxyCmd(), newAgentCmd(), newSupervisorCmd())
	addClientCommands(root)
	if err := root.Execute(); err != nil {
		var ec exitCoder
		if asExitCoder(err, &ec) {
			os.Exit(ec.ExitCode())
		}
		printError(os.Stderr, err)
		os.Exit(failureCode(err))
	}
}

// printError prints the error a command returned, as main does: one
// line "corral: MESSAGE" through termSafe (the message may carry what a
// server or a sandbox wrote).
func printError(w io.Writer, err error) {
	termPrintln(w, "corral:", err)
}
