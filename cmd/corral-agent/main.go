// Command corral-agent is the lean build of what corral runs beside and
// inside its sandboxes: `corral-agent agent` (the in-sandbox agent) and
// `corral-agent supervisor` (the host-wide reaper of sandbox processes).
// They are also subcommands of corral itself; this binary links only
// their packages, so an idle agent costs the host less memory (the
// package initialisers of the whole server are not run in every sandbox:
// docs/performance.md, "Idle sandbox density"). corral serve uses it
// when it is installed beside the corral binary.
package main

import (
	"fmt"
	"os"

	"github.com/corralhq/corral/internal/agent"
	"github.com/corralhq/corral/internal/supervisor"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: corral-agent agent|supervisor [flags]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "agent":
		os.Exit(agent.Command(os.Args[2:], os.Stderr))
	case "supervisor":
		os.Exit(supervisor.Command(os.Args[2:], os.Stderr))
	}
	fmt.Fprintf(os.Stderr, "corral-agent: unknown command %q (agent or supervisor)\n", os.Args[1])
	os.Exit(2)
}
