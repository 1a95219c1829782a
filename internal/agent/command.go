package agent

import (
	"context"
	"flag"
	"fmt"
	"io"
)

// Command runs `agent [flags]` (the in-sandbox agent, as the driver
// starts it: see runtime/oci's agentArgs) with args after the
// subcommand and returns the process's exit code. Both binaries that
// can serve as the agent (corral, and the lean corral-agent) parse the
// agent's flags here.
func Command(args []string, stderr io.Writer) int {
	var cfg Config
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Socket, "socket", "/run/corral/agent.sock", "unix socket to serve the agent API on")
	fs.StringVar(&cfg.DefaultUser, "default-user", "user", "user for requests that name none")
	fs.StringVar(&cfg.TokenFile, "token-file", "", "file holding the access token (no token: no access check)")
	fs.StringVar(&cfg.Listen, "listen", "", "TCP address to serve on instead of --socket (a Kubernetes Pod's agent; needs --token-file or the bootstrap token in "+bootstrapEnv+")")
	fs.Int64Var(&cfg.MaxUpload, "max-upload", 100<<20, "maximum size of one file upload request in bytes")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "agent: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if err := Main(context.Background(), cfg); err != nil {
		fmt.Fprintln(stderr, "corral:", err)
		return 1
	}
	return 0
}
