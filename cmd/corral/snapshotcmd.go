package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	corral "github.com/corralhq/corral/sdk/go"
)

// newSandboxSnapshotCmd is `corral sandbox snapshot ID`.
func newSandboxSnapshotCmd(g *clientGlobals) *cobra.Command {
	var name string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "snapshot ID [--name NAME]",
		Short: "Save a sandbox's files as a snapshot and print the snapshot id",
		Long: `Snapshot freezes the sandbox (cgroup freezer), copies its writable layer
and thaws it. Start sandboxes from it with corral sandbox create --snapshot.
Processes and memory are not saved.`,
		Example: "  snap=$(corral sandbox snapshot $id)\n  corral sandbox create --snapshot $snap",
		Args:    argsRange(1, 1, "a sandbox id"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			sn, err := c.Snapshot(ctx, args[0], name)
			if err != nil {
				return err
			}
			return printCreated(asJSON, sn, sn.ID)
		}),
	}
	cmd.Flags().StringVar(&name, "name", "", "a name for the snapshot")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the snapshot as JSON")
	return cmd
}

// newSandboxSaveCmd is `corral sandbox save ID NAME:VERSION`.
func newSandboxSaveCmd(g *clientGlobals) *cobra.Command {
	return &cobra.Command{
		Use:     "save ID NAME:VERSION",
		Short:   "Save a sandbox's files as a new template version (install deps, then save)",
		Example: "  corral sandbox exec $id -- pip install pandas && corral sandbox save $id data:1",
		Args:    argsRange(2, 2, "a sandbox id and NAME:VERSION"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			t, err := c.SaveTemplate(ctx, args[0], args[1])
			if err != nil {
				return err
			}
			termPrintln(os.Stdout, t.Ref)
			return nil
		}),
	}
}

// newSandboxForkCmd is `corral sandbox fork ID`.
func newSandboxForkCmd(g *clientGlobals) *cobra.Command {
	var count int
	cmd := &cobra.Command{
		Use:   "fork ID [--count N]",
		Short: "Snapshot a sandbox and start N copies of it; print their ids",
		Args:  argsRange(1, 1, "a sandbox id"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			if count < 1 || count > 10 {
				return usageError(cmd, "--count must be 1..10")
			}
			sbs, err := c.Fork(ctx, args[0], count)
			for _, sb := range sbs { // those that started, also when some did not
				termPrintln(os.Stdout, sb.ID)
			}
			return err
		}),
	}
	cmd.Flags().IntVar(&count, "count", 1, "how many copies (1..10)")
	return cmd
}

// newSnapshotCmd is `corral snapshot ls|rm`.
func newSnapshotCmd(g *clientGlobals) *cobra.Command {
	cmd := &cobra.Command{Use: "snapshot", Short: "List and remove snapshots"}
	var asJSON bool
	var sandbox string
	ls := &cobra.Command{
		Use:     "ls [--sandbox ID] [--json]",
		Aliases: []string{"list"},
		Short:   "List snapshots, newest first",
		Args:    argsRange(0, 0, "no arguments"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			list, err := c.ListSnapshots(ctx, sandbox)
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []corral.SnapshotInfo{}
				}
				return printJSON(list)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tSANDBOX\tTEMPLATE\tLAYERS\tSIZE")
			for _, s := range list {
				termPrintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\n", s.ID, orDash(s.Name), s.Sandbox, s.Template, s.Layers, s.SizeBytes)
			}
			return tw.Flush()
		}),
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	ls.Flags().StringVar(&sandbox, "sandbox", "", "only snapshots of this sandbox")
	rm := &cobra.Command{
		Use:   "rm ID...",
		Short: "Remove snapshots that nothing uses",
		Args:  argsRange(1, -1, "snapshot ids"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			for _, id := range args {
				if err := c.DeleteSnapshot(ctx, id); err != nil {
					return err
				}
			}
			return nil
		}),
	}
	cmd.AddCommand(ls, rm)
	return cmd
}
