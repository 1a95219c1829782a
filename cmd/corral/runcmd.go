package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	corral "github.com/corralhq/corral/sdk/go"
)

// commandFlags are the flags of a command run in a sandbox.
type commandFlags struct {
	user, cwd string
	env       []string
	timeout   string
	noStdin   bool
}

func (f *commandFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.user, "user", "", `run as this user: "user" (default) or "root"`)
	fl.StringVar(&f.cwd, "cwd", "", "working directory (default: the user's home)")
	fl.StringVar(&f.timeout, "timeout", "", "per-command timeout, e.g. 30s or 30; 0 = none (default: the sandbox's command_timeout)")
	fl.BoolVar(&f.noStdin, "no-stdin", false, "do not forward stdin (by default it is forwarded when it is not a terminal)")
}

// argvFrom strips a leading "--" that cobra kept (flags parsing stops at
// the first positional argument, so "--" after it is literal).
func argvFrom(args []string) []string {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	return args
}

// stdinForwardable reports whether the CLI's stdin is a pipe or a file (not
// a terminal or a character device such as /dev/null).
func stdinForwardable() bool {
	fi, err := os.Stdin.Stat()
	if err != nil {
		return false
	}
	return fi.Mode()&os.ModeCharDevice == 0
}

// runArgv runs argv in sb, streaming its output to the CLI's stdout and
// stderr, and returns the exit status corral should exit with.
func runArgv(ctx context.Context, sb *corral.Sandbox, argv []string, f *commandFlags, env map[string]string, timeout time.Duration) error {
	opts := corral.RunOptions{
		Args:      append([]string{}, argv[1:]...),
		Cwd:       f.cwd,
		Env:       env,
		User:      f.user,
		Timeout:   timeout,
		MaxOutput: -1,
		OnStdout:  func(b []byte) { os.Stdout.Write(b) },
		OnStderr:  func(b []byte) { os.Stderr.Write(b) },
	}
	if !f.noStdin && stdinForwardable() {
		opts.Stdin = os.Stdin
	}
	res, err := sb.Run(ctx, argv[0], opts)
	if ctx.Err() != nil {
		termPrintln(os.Stderr, "corral: interrupted")
		return exitError{130}
	}
	if res == nil {
		if corral.IsInvalidArgument(err) {
			return usageError(nil, "%v", err)
		}
		return err
	}
	if res.EndReason != "" {
		termPrintf(os.Stderr, "corral: command ended: %s\n", res.EndReason)
	} else if err != nil {
		return err
	}
	code := res.ExitCode
	if code < 0 || code > 255 {
		code = 1
	}
	if code == 0 {
		return nil
	}
	return exitError{code}
}

func newRunCmd(g *clientGlobals) *cobra.Command {
	var sf sandboxFlags
	var cf commandFlags
	cmd := &cobra.Command{
		Use:   "run [flags] -- CMD [ARGS...]",
		Short: "Run a command in a new sandbox, then remove the sandbox",
		Long: `Run creates a sandbox, runs CMD with ARGS in it (as an argv, without a
shell: use "-- bash -c '...'" for shell syntax), streams its stdout and
stderr, kills the sandbox and exits with the command's exit code: 124 when
it timed out, 128+N when killed by signal N (137 for SIGKILL, e.g. out of
memory). When the command did not end on its own, "corral: command ended:
<reason>" (timeout, oom, killed) is printed on stderr. Stdin is forwarded
when it is not a terminal. Ctrl-C kills the sandbox.`,
		Example: `  corral run -- python3 -c 'print(6*7)'
  corral run --tier medium --memory 1g --timeout 2m -- make test
  echo hi | corral run -- cat`,
		Args: argsRange(1, -1, "a command to run (corral run -- CMD ARGS...)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			argv := argvFrom(args)
			if len(argv) == 0 {
				return usageError(cmd, "missing command")
			}
			opts, err := sf.options()
			if err != nil {
				return usageError(cmd, "%v", err)
			}
			timeout, explicitTimeout, err := cf.commandTimeout(cmd)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd)
			defer stop()

			sb, err := c.Create(ctx, opts)
			if err != nil {
				if ctx.Err() != nil {
					return exitError{130}
				}
				return apiFailure(cmd, err)
			}
			printWarnings(sb)
			defer func() {
				kctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := sb.Kill(kctx); err != nil && !corral.IsNotFound(err) {
					termPrintf(os.Stderr, "corral: killing sandbox %s: %v\n", sb.ID, err)
				}
			}()
			if !explicitTimeout {
				timeout = sb.CommandTimeout
			}
			// Keep the sandbox alive for as long as the command may run.
			if opts.Timeout == 0 && timeout > 0 {
				need := timeout + 30*time.Second
				if time.Until(sb.ExpiresAt) < need {
					if err := sb.SetTimeout(ctx, min(need, 24*time.Hour)); err != nil && ctx.Err() == nil {
						return err
					}
				}
			}
			return runArgv(ctx, sb, argv, &cf, nil, timeout)
		},
	}
	cmd.Flags().SetInterspersed(false)
	sf.register(cmd, false)
	cf.register(cmd)
	return cmd
}

func newExecCmd(g *clientGlobals) *cobra.Command {
	var cf commandFlags
	var task string
	cmd := &cobra.Command{
		Use:   "exec [flags] ID -- CMD [ARGS...]",
		Short: "Run a command in a running sandbox",
		Long: `Exec runs CMD with ARGS (an argv, no shell) in sandbox ID, streams its
stdout and stderr and exits with its exit code (124 on timeout, 128+N when
killed by signal N, e.g. 137). Stdin is forwarded when it is not a terminal.
Ctrl-C kills the command.`,
		Example: `  corral sandbox exec sb123 -- ls -la /
  corral sandbox exec --user root --timeout 10s sb123 -- bash -c 'id; uptime'`,
		Args: argsRange(2, -1, "ID and a command (corral sandbox exec ID -- CMD ARGS...)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			argv := argvFrom(args[1:])
			if len(argv) == 0 {
				return usageError(cmd, "missing command")
			}
			env, err := parseKV(cf.env)
			if err != nil {
				return usageError(cmd, "--env: %v", err)
			}
			timeout, explicitTimeout, err := cf.commandTimeout(cmd)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			sb, err := c.Get(ctx, id)
			if err != nil {
				return err
			}
			if !sb.Running() {
				return fmt.Errorf("sandbox %s has ended (%s)", sb.ID, sb.EndReason)
			}
			if task != "" && task != sb.Task {
				return usageError(cmd, "sandbox %s belongs to task %s, not %s", sb.ID, orDash(sb.Task), task)
			}
			if !explicitTimeout {
				timeout = sb.CommandTimeout
			}
			return runArgv(ctx, sb, argv, &cf, env, timeout)
		},
	}
	cmd.Flags().SetInterspersed(false)
	cf.register(cmd)
	cmd.Flags().StringArrayVar(&cf.env, "env", nil, "environment variable K=V for the command (repeatable)")
	cmd.Flags().StringVar(&task, "task", "", "check that the sandbox belongs to this task (its calls count against the sandbox's task)")
	return cmd
}

// commandTimeout parses --timeout; explicit is false when the flag was not
// given (the sandbox's command_timeout applies then).
func (cf *commandFlags) commandTimeout(cmd *cobra.Command) (d time.Duration, explicit bool, err error) {
	if !cmd.Flags().Changed("timeout") {
		return 0, false, nil
	}
	if d, err = parseDurationArg(cf.timeout); err != nil {
		return 0, false, usageError(cmd, "--timeout: %v", err)
	}
	return d, true, nil
}
