package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	corral "github.com/corralhq/corral/sdk/go"
)

// newTaskCmd is `corral task`: agent sessions with budgets and breakers.
func newTaskCmd(g *clientGlobals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "task",
		Short: "Tasks: budgets and circuit breakers for one agent run",
		Long: `A task groups the sandboxes and tool calls of one agent run and enforces
its budgets: tool calls, wall time, tokens (reported by the agent), sandboxes
at once and CPU seconds. When a budget is spent or the agent loops, the
task's breaker opens: further calls fail with budget_exhausted or
loop_detected, and the task's sandboxes are killed (after archiving the
task's artifacts) unless it was created with --on-trip keep.`,
	}
	cmd.AddCommand(newTaskCreateCmd(g), newTaskGetCmd(g), newTaskLsCmd(g), newTaskChangeCmd(g),
		newTaskEndCmd(g), newTaskTokensCmd(g))
	return cmd
}

func newTaskCreateCmd(g *clientGlobals) *cobra.Command {
	var o corral.TaskOptions
	var maxDuration string
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "create [--agent A] [--max-calls N] [--max-duration DUR] [--max-tokens N] [--json]",
		Short:   "Create a task and print its id",
		Example: "  task=$(corral task create --agent researcher --max-calls 50 --max-duration 30m)\n  corral run --task $task -- python3 step1.py",
		Args:    argsRange(0, 0, "no arguments"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			if maxDuration != "" {
				d, err := parseDurationArg(maxDuration)
				if err != nil || d < time.Second {
					return usageError(cmd, "--max-duration: give a duration of at least 1s")
				}
				o.MaxDuration = d
			}
			if o.MaxCalls < 0 || o.MaxTokens < 0 || o.MaxSandboxes < 0 || o.MaxCPUSeconds < 0 {
				return usageError(cmd, "budgets must be positive")
			}
			t, err := c.CreateTask(ctx, o)
			if err != nil {
				return err
			}
			return printCreated(asJSON, t, t.ID)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&o.Agent, "agent", "", "agent name (for per-agent limits and the audit log)")
	f.Int64Var(&o.MaxCalls, "max-calls", 0, "tool calls (commands) at most (server default 30)")
	f.StringVar(&maxDuration, "max-duration", "", "wall time from creation, e.g. 30m (server default 1h)")
	f.Int64Var(&o.MaxTokens, "max-tokens", 0, "model tokens the agent may report (server default 2000000)")
	f.Int64Var(&o.MaxSandboxes, "max-sandboxes", 0, "sandboxes running at once (server default 5)")
	f.Float64Var(&o.MaxCPUSeconds, "max-cpu", 0, "CPU seconds over all the task's sandboxes (server default 3600)")
	f.StringVar(&o.OnTrip, "on-trip", "", "when a breaker opens: kill (default) or keep the task's sandboxes")
	f.StringArrayVar(&o.Artifacts, "artifact", nil, "file to copy out of each sandbox before a kill on trip (repeatable)")
	f.BoolVar(&o.NoLoopCheck, "no-loop-check", false, "turn loop detection off (a task that repeats a call on purpose)")
	f.BoolVar(&asJSON, "json", false, "print the task as JSON")
	return cmd
}

func printTask(t *corral.Task) error {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	termPrintf(tw, "id:\t%s\n", t.ID)
	termPrintf(tw, "agent:\t%s\n", orDash(t.Agent))
	termPrintf(tw, "state:\t%s\n", t.State)
	if t.Breaker.Open {
		termPrintf(tw, "breaker:\topen: %s %s (%s)\n", t.Breaker.Code, t.Breaker.Budget, t.Breaker.Reason)
	}
	b, u := t.Budgets, t.Usage
	termPrintf(tw, "calls:\t%d / %d\n", u.Calls, b.MaxCalls)
	termPrintf(tw, "tokens:\t%d / %d\n", u.Tokens, b.MaxTokens)
	termPrintf(tw, "cpu seconds:\t%.1f / %.0f\n", u.CPUSeconds, b.MaxCPUSeconds)
	termPrintf(tw, "sandboxes:\t%d running (max %d at once), %d created\n", len(t.Sandboxes), b.MaxSandboxes, u.Sandboxes)
	termPrintf(tw, "duration:\t%s / %s\n", time.Since(t.CreatedAt).Round(time.Second), time.Duration(b.MaxDurationS)*time.Second)
	termPrintf(tw, "on trip:\t%s\n", t.OnTrip)
	return tw.Flush()
}

func newTaskGetCmd(g *clientGlobals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "get ID [--json]",
		Short: "Show a task's budgets, usage and breaker",
		Args:  argsRange(1, 1, "a task id"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			t, err := c.GetTask(ctx, args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(t)
			}
			return printTask(t)
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newTaskLsCmd(g *clientGlobals) *cobra.Command {
	var asJSON bool
	var state string
	cmd := &cobra.Command{
		Use:     "ls [--state open|tripped|ended|all] [--json]",
		Aliases: []string{"list"},
		Short:   "List tasks (open and tripped by default)",
		Args:    argsRange(0, 0, "no arguments"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			list, err := c.ListTasks(ctx, state)
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []corral.Task{}
				}
				return printJSON(list)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tAGENT\tSTATE\tCALLS\tSANDBOXES\tBREAKER")
			for _, t := range list {
				br := "-"
				if t.Breaker.Open {
					br = strings.TrimSpace(t.Breaker.Code + " " + t.Breaker.Budget)
				}
				termPrintf(tw, "%s\t%s\t%s\t%d/%d\t%d\t%s\n", t.ID, orDash(t.Agent), t.State, t.Usage.Calls, t.Budgets.MaxCalls, len(t.Sandboxes), br)
			}
			return tw.Flush()
		}),
	}
	cmd.Flags().StringVar(&state, "state", "", "open, tripped, ended or all")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newTaskChangeCmd(g *clientGlobals) *cobra.Command {
	var ch corral.TaskChange
	var calls, tokens, sandboxes int64
	var cpu float64
	var duration string
	cmd := &cobra.Command{
		Use:   "raise ID [--max-calls N] [--max-duration DUR] [--max-tokens N] [--max-sandboxes N] [--max-cpu S] [--reset]",
		Short: "Change a task's budgets and, with --reset, close its breaker (operator)",
		Example: `  corral task raise $task --max-calls 100 --reset
  corral task raise $task --reset          # close the breaker, keep the budgets`,
		Args: argsRange(1, 1, "a task id"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			fl := cmd.Flags()
			if fl.Changed("max-calls") {
				ch.MaxCalls = &calls
			}
			if fl.Changed("max-tokens") {
				ch.MaxTokens = &tokens
			}
			if fl.Changed("max-sandboxes") {
				ch.MaxSandboxes = &sandboxes
			}
			if fl.Changed("max-cpu") {
				ch.MaxCPUSeconds = &cpu
			}
			if duration != "" {
				d, err := parseDurationArg(duration)
				if err != nil {
					return usageError(cmd, "--max-duration: %v", err)
				}
				s := int64(d / time.Second)
				ch.MaxDurationS = &s
			}
			t, err := c.ChangeTask(ctx, args[0], ch)
			if err != nil {
				return err
			}
			return printTask(t)
		}),
	}
	f := cmd.Flags()
	f.Int64Var(&calls, "max-calls", 0, "new tool-call budget")
	f.StringVar(&duration, "max-duration", "", "new wall-time budget from the task's creation")
	f.Int64Var(&tokens, "max-tokens", 0, "new token budget")
	f.Int64Var(&sandboxes, "max-sandboxes", 0, "new limit of sandboxes at once")
	f.Float64Var(&cpu, "max-cpu", 0, "new CPU-seconds budget")
	f.BoolVar(&ch.Reset, "reset", false, "close the breaker and clear the loop window")
	return cmd
}

func newTaskEndCmd(g *clientGlobals) *cobra.Command {
	return &cobra.Command{
		Use:   "end ID",
		Short: "End a task and kill its sandboxes",
		Args:  argsRange(1, 1, "a task id"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			if _, err := c.EndTask(ctx, args[0]); err != nil {
				return err
			}
			return nil
		}),
	}
}

func newTaskTokensCmd(g *clientGlobals) *cobra.Command {
	return &cobra.Command{
		Use:   "tokens ID N",
		Short: "Report N model tokens spent by the task's agent",
		Args:  argsRange(2, 2, "a task id and a number of tokens"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			n, err := strconv.ParseInt(args[1], 10, 64)
			if err != nil || n < 0 {
				return usageError(cmd, "tokens must be a non-negative integer")
			}
			t, err := c.ReportTokens(ctx, args[0], n)
			if err != nil {
				return err
			}
			termPrintf(os.Stdout, "%d / %d tokens\n", t.Usage.Tokens, t.Budgets.MaxTokens)
			return nil
		}),
	}
}
