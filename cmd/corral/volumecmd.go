package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	corral "github.com/corralhq/corral/sdk/go"
)

// newVolumeCmd is `corral volume create|ls|rm`.
func newVolumeCmd(g *clientGlobals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Volumes: persistent, size-capped file systems that sandboxes mount",
		Long: `A volume outlives the sandboxes that mount it: mount it at create with
--volume NAME:/path (read-write, nosuid, nodev). Its size is a hard cap (a full
volume answers ENOSPC). A volume that a running or paused sandbox mounts cannot
be deleted.`,
	}
	var size string
	var asJSON bool
	create := &cobra.Command{
		Use:     "create NAME [--size 1g]",
		Short:   "Create a volume; prints its id",
		Example: "  corral volume create data --size 5g\n  corral run --volume data:/data -- sh -c 'date >> /data/log'",
		Args:    argsRange(1, 1, "a volume name"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			var mb int64
			if size != "" {
				var err error
				if mb, err = parseSizeMiB(size); err != nil {
					return usageError(cmd, "--size: %v", err)
				}
			}
			v, err := c.CreateVolume(ctx, args[0], mb)
			if err != nil {
				return err
			}
			return printCreated(asJSON, v, v.ID)
		}),
	}
	create.Flags().StringVar(&size, "size", "", "size, e.g. 512m, 5g; a plain number is MiB (default 1g)")
	create.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	ls := &cobra.Command{
		Use:     "ls [--json]",
		Aliases: []string{"list"},
		Short:   "List volumes with size and use",
		Args:    argsRange(0, 0, "no arguments"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			list, err := c.Volumes(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []corral.Volume{}
				}
				return printJSON(list)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tSIZE MB\tUSED MB\tCREATED")
			for _, v := range list {
				used := "-"
				if v.UsedBytes != nil {
					used = fmt.Sprintf("%.1f", float64(*v.UsedBytes)/(1<<20))
				}
				termPrintf(tw, "%s\t%s\t%d\t%s\t%s\n", v.ID, v.Name, v.SizeMB, used, v.CreatedAt.Format("2006-01-02 15:04:05"))
			}
			return tw.Flush()
		}),
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	rm := &cobra.Command{
		Use:   "rm NAME|ID",
		Short: "Delete a volume and its files (refused while a sandbox mounts it)",
		Args:  argsRange(1, 1, "a volume name or id"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			return c.DeleteVolume(ctx, args[0])
		}),
	}
	cmd.AddCommand(create, ls, rm)
	return cmd
}
