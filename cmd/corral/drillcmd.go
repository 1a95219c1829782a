package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	corral "github.com/corralhq/corral/sdk/go"
)

// drill is one fault drill: it provokes a runaway and reports whether the
// brake held.
type drill struct {
	name string
	run  func(ctx context.Context, c *corral.Client, task string) (held bool, detail string, sandbox string, err error)
	// kind is the audit event kind that records the brake ("" = none).
	kind string
	// task are the drill task's budgets (zero: 100 calls, 5 minutes).
	task corral.TaskOptions
}

// newDrillCmd is `corral drill`: the seed's runaway drill against a live
// server.
func newDrillCmd(g *clientGlobals) *cobra.Command {
	var only string
	cmd := &cobra.Command{
		Use:   "drill [--only NAME]",
		Short: "Run the runaway drill: provoke each brake and check that it holds",
		Long: `Drill runs, against the server, an infinite loop, a memory bomb, a fork
bomb, a disk fill, an egress attempt to an unlisted domain, an env-var secret,
a looping agent and a spent call budget, each in its own small sandbox of a
drill task. For each it prints whether the brake held (killed, refused or
tripped), how long it took and the audit event that records it. It exits 0
only when every brake held. Sandboxes it creates are killed at the end.`,
		Args: argsRange(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			failed := 0
			for _, d := range drills() {
				if only != "" && d.name != only {
					continue
				}
				// Each drill gets its own task so that one trip does not
				// refuse the next drill's calls.
				to := d.task
				if to.MaxCalls == 0 {
					to.MaxCalls = 100
				}
				to.Agent, to.MaxDuration = "corral-drill", 5*time.Minute
				t, err := c.CreateTask(ctx, to)
				if err != nil {
					return apiFailure(cmd, err)
				}
				start := time.Now()
				held, detail, sb, err := d.run(ctx, c, t.ID)
				took := time.Since(start)
				ev := ""
				if d.kind != "" {
					ev = auditRef(ctx, c, t.ID, sb, d.kind)
				}
				status := "HELD"
				if err != nil {
					held, detail = false, err.Error()
				}
				if !held {
					status = "FAILED"
					failed++
				}
				termPrintf(os.Stdout, "%-7s %-14s %-60s %6.2fs %s\n", status, d.name, detail, took.Seconds(), ev)
				_, _ = c.EndTask(context.WithoutCancel(ctx), t.ID)
			}
			if failed > 0 {
				return exitError{1}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&only, "only", "", "run one drill: loop, memory, forkbomb, disk, egress, envsecret, loopagent, budget")
	return cmd
}

// auditRef finds the audit event that records a brake.
func auditRef(ctx context.Context, c *corral.Client, task, sandbox, kind string) string {
	q := corral.AuditQuery{Task: task, Kind: kind}
	if sandbox != "" && !strings.HasPrefix(kind, "task.") {
		q = corral.AuditQuery{Sandbox: sandbox, Kind: kind}
	}
	evs, err := c.Audit(ctx, q)
	if err != nil || len(evs) == 0 {
		return "(no " + kind + " event)"
	}
	return fmt.Sprintf("event #%d %s", evs[len(evs)-1].ID, kind)
}

// drillSandbox creates a small sandbox in task for a drill.
func drillSandbox(ctx context.Context, c *corral.Client, task string, o corral.CreateOptions) (*corral.Sandbox, func(), error) {
	o.Task = task
	o.Metadata = map[string]string{"corral": "drill"}
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Minute
	}
	// The drills create a sandbox each in quick succession as one agent,
	// so the server's per-agent create rate can answer capacity_exceeded:
	// wait as its Retry-After says, as a well-behaved client does, for up
	// to drillCapacityWait in all.
	deadline := time.Now().Add(drillCapacityWait)
	for {
		sb, err := c.Create(ctx, o)
		var ae *corral.APIError
		if corral.IsCapacityExceeded(err) && errors.As(err, &ae) && ae.RetryAfter > 0 && time.Now().Add(ae.RetryAfter).Before(deadline) {
			select {
			case <-ctx.Done():
				return nil, func() {}, ctx.Err()
			case <-time.After(ae.RetryAfter):
			}
			continue
		}
		if err != nil {
			return nil, func() {}, err
		}
		return sb, func() { _, _ = c.Kill(context.WithoutCancel(ctx), sb.ID) }, nil
	}
}

// drillCapacityWait bounds how long a drill waits for a sandbox slot when
// the server answers capacity_exceeded with a Retry-After.
const drillCapacityWait = time.Minute

func drills() []drill {
	return []drill{
		{name: "loop", kind: "command", run: func(ctx context.Context, c *corral.Client, task string) (bool, string, string, error) {
			sb, done, err := drillSandbox(ctx, c, task, corral.CreateOptions{})
			if err != nil {
				return false, "", "", err
			}
			defer done()
			res, err := sb.Run(ctx, "while :; do :; done", corral.RunOptions{Timeout: 2 * time.Second})
			if err != nil {
				return false, "", sb.ID, err
			}
			return res.TimedOut && res.ExitCode == 124, fmt.Sprintf("infinite loop killed by its 2 s timeout (exit %d)", res.ExitCode), sb.ID, nil
		}},
		{name: "memory", kind: "command", run: func(ctx context.Context, c *corral.Client, task string) (bool, string, string, error) {
			sb, done, err := drillSandbox(ctx, c, task, corral.CreateOptions{Resources: corral.Resources{MemoryMB: 64}})
			if err != nil {
				return false, "", "", err
			}
			defer done()
			res, err := sb.Run(ctx, "python3 -c 'a=[]\nwhile True: a.append(bytearray(1<<20))'", corral.RunOptions{Timeout: 30 * time.Second})
			if err != nil {
				return false, "", sb.ID, err
			}
			return res.EndReason == "oom", fmt.Sprintf("memory bomb stopped at 64 MiB (exit %d, %s)", res.ExitCode, orDash(res.EndReason)), sb.ID, nil
		}},
		{name: "forkbomb", kind: "command", run: func(ctx context.Context, c *corral.Client, task string) (bool, string, string, error) {
			sb, done, err := drillSandbox(ctx, c, task, corral.CreateOptions{Resources: corral.Resources{Pids: 64}})
			if err != nil {
				return false, "", "", err
			}
			defer done()
			_, err = sb.Run(ctx, "bomb() { bomb | bomb & }; bomb", corral.RunOptions{Timeout: 5 * time.Second})
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return false, "", sb.ID, err
			}
			res, err := sb.Run(ctx, "echo alive", corral.RunOptions{Timeout: 10 * time.Second})
			if err != nil {
				return false, "", sb.ID, fmt.Errorf("sandbox did not answer after the bomb: %w", err)
			}
			return strings.TrimSpace(res.Stdout) == "alive", "fork bomb held at 64 tasks; the sandbox still answers", sb.ID, nil
		}},
		{name: "disk", kind: "command", run: func(ctx context.Context, c *corral.Client, task string) (bool, string, string, error) {
			sb, done, err := drillSandbox(ctx, c, task, corral.CreateOptions{Resources: corral.Resources{DiskMB: 32}})
			if err != nil {
				return false, "", "", err
			}
			defer done()
			res, err := sb.Run(ctx, "dd if=/dev/zero of=/tmp/fill bs=1M count=200", corral.RunOptions{Timeout: 30 * time.Second})
			if err != nil {
				return false, "", sb.ID, err
			}
			full := strings.Contains(res.Stderr, "No space left")
			return res.ExitCode != 0 && full, fmt.Sprintf("disk fill stopped at 32 MiB (exit %d, ENOSPC %v)", res.ExitCode, full), sb.ID, nil
		}},
		{name: "egress", kind: "egress.http", run: func(ctx context.Context, c *corral.Client, task string) (bool, string, string, error) {
			sb, done, err := drillSandbox(ctx, c, task, corral.CreateOptions{Network: "allow", Allow: []string{"allowed.invalid"}})
			if err != nil {
				return false, "", "", err
			}
			defer done()
			// The proxy refuses the name before resolving it: nothing
			// leaves the host.
			res, err := sb.Run(ctx, "curl -s -o /dev/null -w '%{http_code}' http://unlisted.example.com/", corral.RunOptions{Timeout: 30 * time.Second})
			if err != nil {
				return false, "", sb.ID, err
			}
			return strings.TrimSpace(res.Stdout) == "403", "unlisted domain refused by the proxy (HTTP " + strings.TrimSpace(res.Stdout) + ")", sb.ID, nil
		}},
		{name: "envsecret", kind: "sandbox.warning", run: func(ctx context.Context, c *corral.Client, task string) (bool, string, string, error) {
			fake := "ghp_" + strings.Repeat("dri11", 8)
			sb, done, err := drillSandbox(ctx, c, task, corral.CreateOptions{Env: map[string]string{"GITHUB_TOKEN": fake}})
			var ae *corral.APIError
			if errors.As(err, &ae) && ae.Code == "env_secret_refused" {
				return true, "env-var secret refused at create", "", nil
			}
			if err != nil {
				return false, "", "", err
			}
			defer done()
			warned := len(sb.Warnings) > 0 && strings.Contains(sb.Warnings[0], "GITHUB_TOKEN") && !strings.Contains(strings.Join(sb.Warnings, " "), fake)
			return warned, "env-var secret flagged at create (warning, value not echoed)", sb.ID, nil
		}},
		{name: "loopagent", kind: "task.breaker_open", run: func(ctx context.Context, c *corral.Client, task string) (bool, string, string, error) {
			sb, done, err := drillSandbox(ctx, c, task, corral.CreateOptions{})
			if err != nil {
				return false, "", "", err
			}
			defer done()
			for i := 1; i <= 40; i++ {
				_, err := sb.Run(ctx, fmt.Sprintf("curl -s https://api.search.invalid/q?query=retry+attempt+%d || exit 6", i), corral.RunOptions{Timeout: 10 * time.Second})
				if corral.IsBrake(err) {
					var ae *corral.APIError
					errors.As(err, &ae)
					return ae.Code == corral.CodeLoopDetected, fmt.Sprintf("looping agent stopped after %d calls (%s)", i-1, ae.Code), sb.ID, nil
				}
				if err != nil {
					return false, "", sb.ID, err
				}
			}
			return false, "40 repeated calls were all admitted", sb.ID, nil
		}},
		{name: "budget", kind: "task.breaker_open", task: corral.TaskOptions{MaxCalls: 3}, run: func(ctx context.Context, c *corral.Client, task string) (bool, string, string, error) {
			sb, done, err := drillSandbox(ctx, c, task, corral.CreateOptions{})
			if err != nil {
				return false, "", "", err
			}
			defer done()
			for i := 1; i <= 4; i++ {
				_, err := sb.Run(ctx, fmt.Sprintf("echo step %d", i), corral.RunOptions{Timeout: 10 * time.Second})
				if corral.IsBrake(err) {
					var ae *corral.APIError
					errors.As(err, &ae)
					return i == 4 && ae.Code == corral.CodeBudgetExhausted, fmt.Sprintf("call %d refused: %s (max_calls 3)", i, ae.Code), sb.ID, nil
				}
				if err != nil {
					return false, "", sb.ID, err
				}
			}
			return false, "a 4th call was admitted with max_calls 3", sb.ID, nil
		}},
	}
}
