package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	corral "github.com/corralhq/corral/sdk/go"
)

// newUsageCmd is `corral usage`: what sandboxes used, per team, agent,
// task or sandbox.
func newUsageCmd(g *clientGlobals) *cobra.Command {
	var q corral.UsageQuery
	var since, until string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "usage [--team T|all] [--since 24h|TIME] [--until TIME] [--by task|sandbox|agent|team] [--json]",
		Short: "Show metered usage: CPU seconds, memory GiB-seconds, sandbox-seconds, egress bytes, commands",
		Long: `Shows what sandboxes used in a window: CPU seconds, memory GiB-seconds,
sandbox-seconds (created to ended), bytes through the egress proxy and
commands started, in total and, with --by, per team, agent, task or
sandbox. The server keeps usage per sandbox and minute, so --since and
--until are rounded out to whole minutes. A member key sees its own team;
an admin key may give --team NAME or --team all.`,
		Example: `  corral usage --since 24h --by task
  corral usage --team all --by team --json`,
		Args: argsRange(0, 0, "no arguments"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			var err error
			if q.Since, err = parseWhen(since); err != nil {
				return usageError(cmd, "--since: %v", err)
			}
			if q.Until, err = parseWhen(until); err != nil {
				return usageError(cmd, "--until: %v", err)
			}
			switch q.By {
			case "", corral.UsageByTeam, corral.UsageByAgent, corral.UsageByTask, corral.UsageBySandbox:
			default:
				return usageError(cmd, "--by: give task, sandbox, agent or team")
			}
			rep, err := c.Usage(ctx, q)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(rep)
			}
			return printUsage(os.Stdout, rep)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&q.Team, "team", "", "another team, or all (admin keys only; default: the key's team)")
	f.StringVar(&since, "since", "", "from a duration ago (24h) or an RFC 3339 time (default: all kept usage)")
	f.StringVar(&until, "until", "", "up to a duration ago or an RFC 3339 time (default: now)")
	f.StringVar(&q.By, "by", "", "one row per task, sandbox, agent or team")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

// printUsage prints a report as a table: one line per row, then the
// total.
func printUsage(w io.Writer, rep *corral.UsageReport) error {
	window := "all kept usage"
	switch {
	case rep.Since != nil && rep.Until != nil:
		window = rep.Since.Local().Format(time.DateTime) + " to " + rep.Until.Local().Format(time.DateTime)
	case rep.Since != nil:
		window = "since " + rep.Since.Local().Format(time.DateTime)
	case rep.Until != nil:
		window = "until " + rep.Until.Local().Format(time.DateTime)
	}
	termPrintf(w, "team %s, %s\n", rep.Team, window)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	var key []string
	switch rep.By {
	case corral.UsageBySandbox:
		key = []string{"TEAM", "AGENT", "TASK", "SANDBOX"}
	case corral.UsageByTask:
		key = []string{"TEAM", "AGENT", "TASK"}
	case corral.UsageByAgent:
		key = []string{"TEAM", "AGENT"}
	case corral.UsageByTeam:
		key = []string{"TEAM"}
	}
	head := ""
	for _, k := range key {
		head += k + "\t"
	}
	fmt.Fprintln(tw, head+"CPU_S\tMEM_GIB_S\tSANDBOX_S\tEGRESS_BYTES\tCOMMANDS\tSANDBOXES\t")
	line := func(keys []string, a corral.UsageAmounts) {
		s := ""
		for _, k := range keys {
			s += termSafe(orDash(k)) + "\t"
		}
		fmt.Fprintf(tw, "%s%.3f\t%.3f\t%.1f\t%s\t%d\t%d\t\n", s, a.CPUSeconds, a.MemoryGiBSeconds, a.SandboxSeconds,
			strconv.FormatInt(a.EgressBytes, 10), a.Commands, a.Sandboxes)
	}
	for _, r := range rep.Rows {
		line([]string{r.Team, r.Agent, r.Task, r.Sandbox}[:len(key)], r.UsageAmounts)
	}
	total := make([]string, len(key))
	if len(total) > 0 {
		total[0] = "total"
	}
	line(total, rep.Totals)
	return tw.Flush()
}
