package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	corral "github.com/corralhq/corral/sdk/go"
)

// newTeamCmd is `corral team ls|quota` (admin keys only).
func newTeamCmd(g *clientGlobals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "team",
		Short: "Teams: their quotas and what their sandboxes use (admin key needed)",
		Long: `Every team's sandboxes are admitted under its quota before the server's
global limits: running sandboxes, sandboxes per agent, CPUs and memory of its
running sandboxes, creates per second. The server's --team-* flags are every
team's default; corral team quota gives one team its own. 0 means no team
limit. Over a quota a create fails with capacity_exceeded (exit 75) naming
the quota (team_sandboxes, team_agent, team_cpu, team_memory, team_rate).`,
	}
	var asJSON bool
	ls := &cobra.Command{
		Use:     "ls [--json]",
		Aliases: []string{"list"},
		Short:   "List teams with their quotas in force and their usage",
		Args:    argsRange(0, 0, "no arguments"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			list, err := c.Teams(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []corral.Team{}
				}
				return printJSON(list)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TEAM\tRUNNING\tWAITING\tCPUS\tMEMORY MB\tMAX SANDBOXES\tMAX PER AGENT\tMAX CPUS\tMAX MEMORY MB\tCREATE RATE")
			for _, t := range list {
				q, u := t.Quota, t.Usage
				termPrintf(tw, "%s\t%d\t%d\t%g\t%d\t%s\t%s\t%s\t%s\t%s\n", t.Team, u.Running, u.Waiting, u.CPUs, u.MemoryMB,
					limit(float64(q.MaxSandboxes)), limit(float64(q.MaxPerAgent)), limit(q.MaxCPUs), limit(float64(q.MaxMemoryMB)), limit(q.CreateRate))
			}
			return tw.Flush()
		}),
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	var reset bool
	var maxSandboxes, maxPerAgent, maxMemory, burst int64
	var maxCPUs, rate float64
	quota := &cobra.Command{
		Use:   "quota TEAM [--max-sandboxes N] [--max-per-agent N] [--max-cpus N] [--max-memory-mb N] [--create-rate R] [--create-burst N] [--reset] [--json]",
		Short: "Show a team's quota, or change it (the flags given; the rest stay)",
		Long: `Without flags, show the team's quota in force, where each value comes from
(its override or the server's default) and what its sandboxes use now. With
flags, change the team's override: the flags given are set (0: no team
limit), the others keep their value; --reset first drops the whole override,
so the server's defaults apply again. It applies to the team's next create.`,
		Example: `  corral team quota research
  corral team quota research --max-sandboxes 20 --max-cpus 16 --max-memory-mb 32768
  corral team quota research --create-rate 2 --create-burst 10
  corral team quota research --reset`,
		Args: argsRange(1, 1, "a team name"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			team := args[0]
			t, err := c.TeamQuota(ctx, team)
			if err != nil {
				return err
			}
			f := cmd.Flags()
			if reset || f.Changed("max-sandboxes") || f.Changed("max-per-agent") || f.Changed("max-cpus") ||
				f.Changed("max-memory-mb") || f.Changed("create-rate") || f.Changed("create-burst") {
				o := t.Override
				if reset {
					o = corral.QuotaOverride{}
				}
				setInt := func(name string, v int64, p **int64) {
					if f.Changed(name) {
						*p = &v
					}
				}
				setFloat := func(name string, v float64, p **float64) {
					if f.Changed(name) {
						*p = &v
					}
				}
				setInt("max-sandboxes", maxSandboxes, &o.MaxSandboxes)
				setInt("max-per-agent", maxPerAgent, &o.MaxPerAgent)
				setFloat("max-cpus", maxCPUs, &o.MaxCPUs)
				setInt("max-memory-mb", maxMemory, &o.MaxMemoryMB)
				setFloat("create-rate", rate, &o.CreateRate)
				setInt("create-burst", burst, &o.CreateBurst)
				if t, err = c.SetTeamQuota(ctx, team, o); err != nil {
					return err
				}
			}
			if asJSON {
				return printJSON(t)
			}
			printTeam(t)
			return nil
		}),
	}
	quota.Flags().Int64Var(&maxSandboxes, "max-sandboxes", 0, "running sandboxes of the team (0: no team limit)")
	quota.Flags().Int64Var(&maxPerAgent, "max-per-agent", 0, "running sandboxes per named agent of the team (0: no team limit)")
	quota.Flags().Float64Var(&maxCPUs, "max-cpus", 0, "CPUs of the team's running sandboxes together (0: no team limit)")
	quota.Flags().Int64Var(&maxMemory, "max-memory-mb", 0, "memory in MiB of the team's running sandboxes together (0: no team limit)")
	quota.Flags().Float64Var(&rate, "create-rate", 0, "creates per second of the team (0: no team limit)")
	quota.Flags().Int64Var(&burst, "create-burst", 0, "burst of --create-rate (0: the rate rounded up, at least 1)")
	quota.Flags().BoolVar(&reset, "reset", false, "drop the team's override first: the server's defaults apply")
	quota.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(ls, quota)
	return cmd
}

// limit prints a quota value, 0 as "-" (no team limit).
func limit(v float64) string {
	if v == 0 {
		return "-"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// printTeam prints a team's quota: each value in force, whether it is the
// team's own or the server's default, and what is used.
func printTeam(t *corral.Team) {
	q, o, u := t.Quota, t.Override, t.Usage
	src := func(set bool) string {
		if set {
			return "team"
		}
		return "default"
	}
	termPrintf(os.Stdout, "team %s: %d running, %d waiting\n", t.Team, u.Running, u.Waiting)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUOTA\tLIMIT\tFROM\tUSED")
	termPrintf(tw, "max-sandboxes\t%s\t%s\t%d\n", limit(float64(q.MaxSandboxes)), src(o.MaxSandboxes != nil), u.Running)
	termPrintf(tw, "max-per-agent\t%s\t%s\t\n", limit(float64(q.MaxPerAgent)), src(o.MaxPerAgent != nil))
	termPrintf(tw, "max-cpus\t%s\t%s\t%g\n", limit(q.MaxCPUs), src(o.MaxCPUs != nil), u.CPUs)
	termPrintf(tw, "max-memory-mb\t%s\t%s\t%d\n", limit(float64(q.MaxMemoryMB)), src(o.MaxMemoryMB != nil), u.MemoryMB)
	termPrintf(tw, "create-rate\t%s\t%s\t\n", limit(q.CreateRate), src(o.CreateRate != nil))
	termPrintf(tw, "create-burst\t%s\t%s\t\n", limit(float64(q.CreateBurst)), src(o.CreateBurst != nil))
	_ = tw.Flush()
}
