package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	corral "github.com/corralhq/corral/sdk/go"
)

// newPoolCmd is `corral pool set|ls|rm`.
func newPoolCmd(g *clientGlobals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pool",
		Short: "Warm pools: sandboxes started ahead of time per template",
		Long: `A warm pool keeps idle sandboxes of a template ready (tier light, runc, no
network); a create that asks for the template's defaults takes one instead of
starting a sandbox. Each pooled sandbox is used once and destroyed with its
user's sandbox. Pools stay within the global sandbox limit, give way to
users' sandboxes and empty themselves when host memory runs low.`,
	}
	var min, max int
	var maxIdle string
	set := &cobra.Command{
		Use:     "set TEMPLATE --min N [--max M] [--max-idle DUR]",
		Short:   "Create or change a template's pool (--min 0 --max 0 removes it)",
		Example: "  corral pool set base --min 2 --max 5",
		Args:    argsRange(1, 1, "a template name"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			var idle int64
			if maxIdle != "" {
				d, err := parseDurationArg(maxIdle)
				if err != nil {
					return usageError(cmd, "--max-idle: %v", err)
				}
				idle = int64(d / time.Second)
			}
			if !cmd.Flags().Changed("max") {
				max = min
			}
			p, err := c.SetPool(ctx, args[0], min, max, idle)
			if err != nil {
				return err
			}
			termPrintf(os.Stdout, "pool %s: min %d, max %d, max idle %s\n", p.Template, p.Min, p.Max, time.Duration(p.MaxIdleS)*time.Second)
			return nil
		}),
	}
	set.Flags().IntVar(&min, "min", 0, "idle sandboxes to keep ready")
	set.Flags().IntVar(&max, "max", 0, "idle sandboxes at most (default: --min); the pool grows toward it on misses")
	set.Flags().StringVar(&maxIdle, "max-idle", "", "replace pooled sandboxes older than this (default 30m)")
	var asJSON bool
	ls := &cobra.Command{
		Use:     "ls [--json]",
		Aliases: []string{"list"},
		Short:   "List pools with idle count, hits, misses and refill time",
		Args:    argsRange(0, 0, "no arguments"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			list, err := c.Pools(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []corral.Pool{}
				}
				return printJSON(list)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TEMPLATE\tMIN\tMAX\tTARGET\tIDLE\tHITS\tMISSES\tREFILL MS")
			for _, p := range list {
				termPrintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%.0f\n", p.Template, p.Min, p.Max, p.Target, p.Idle, p.Hits, p.Misses, p.RefillMSAvg)
			}
			return tw.Flush()
		}),
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	rm := &cobra.Command{
		Use:   "rm TEMPLATE",
		Short: "Remove a template's pool and stop its idle sandboxes",
		Args:  argsRange(1, 1, "a template name"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			if _, err := c.SetPool(ctx, args[0], 0, 0, 0); err != nil {
				return err
			}
			return nil
		}),
	}
	cmd.AddCommand(set, ls, rm)
	return cmd
}
