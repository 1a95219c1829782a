package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	corral "github.com/corralhq/corral/sdk/go"
)

func newSandboxCmd(g *clientGlobals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "sandbox",
		Aliases: []string{"sb"},
		Short:   "Create, list, inspect, use and kill sandboxes",
	}
	cmd.AddCommand(
		newSandboxCreateCmd(g),
		newSandboxLsCmd(g),
		newSandboxGetCmd(g),
		newSandboxKillCmd(g),
		newSandboxPauseCmd(g, true),
		newSandboxPauseCmd(g, false),
		newSandboxTimeoutCmd(g),
		newExecCmd(g),
		newSandboxCpCmd(g),
		newSandboxNetCmd(g),
		newSandboxSnapshotCmd(g),
		newSandboxForkCmd(g),
		newSandboxSaveCmd(g),
	)
	return cmd
}

func newSandboxCreateCmd(g *clientGlobals) *cobra.Command {
	var sf sandboxFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "create [flags]",
		Short: "Create a sandbox and print its id",
		Example: `  corral sandbox create --tier medium --memory 1g --ttl 30m --metadata owner=me
  corral sandbox create --json`,
		Args: argsRange(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, err := sf.options()
			if err != nil {
				return usageError(cmd, "%v", err)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			sb, err := c.Create(ctx, opts)
			if err != nil {
				return apiFailure(cmd, err)
			}
			printWarnings(sb)
			return printCreated(asJSON, sb, sb.ID)
		},
	}
	sf.register(cmd, true)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	return cmd
}

func newSandboxLsCmd(g *clientGlobals) *cobra.Command {
	var asJSON, all bool
	var state string
	var metadata []string
	cmd := &cobra.Command{
		Use:     "ls [flags]",
		Aliases: []string{"list"},
		Short:   "List sandboxes (running ones by default), newest first",
		Args:    argsRange(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			md, err := parseKV(metadata)
			if err != nil {
				return usageError(cmd, "--metadata: %v", err)
			}
			switch state {
			case "", "running", "ended", "all":
			default:
				return usageError(cmd, "invalid --state %q: use running, ended or all", state)
			}
			if all {
				state = "all"
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			list, err := c.List(ctx, corral.ListOptions{State: state, Metadata: md})
			if err != nil {
				return apiFailure(cmd, err)
			}
			if asJSON {
				return printJSON(list)
			}
			now := time.Now()
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tTEMPLATE\tRUNTIME\tCREATED\tEXPIRES")
			for _, sb := range list {
				expires := "-"
				st := sb.State
				if sb.Running() {
					expires = "in " + humanDuration(sb.ExpiresAt.Sub(now))
				} else if sb.EndReason != "" {
					st += " (" + sb.EndReason + ")"
				}
				termPrintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", sb.ID, st, sb.Template, sb.Runtime,
					humanDuration(now.Sub(sb.CreatedAt))+" ago", expires)
			}
			return tw.Flush()
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&asJSON, "json", false, "print a JSON array of sandboxes")
	fl.BoolVarP(&all, "all", "a", false, "include ended sandboxes (same as --state all)")
	fl.StringVar(&state, "state", "", "running (default), ended or all")
	fl.StringArrayVar(&metadata, "metadata", nil, "only sandboxes with metadata K=V (repeatable, all must match)")
	return cmd
}

// humanDuration formats d coarsely: 45s, 3m20s, 2h5m, 3d4h.
func humanDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	d = d.Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

func newSandboxGetCmd(g *clientGlobals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "get [flags] ID",
		Short: "Show a sandbox (running or ended)",
		Args:  argsRange(1, 1, "a sandbox ID"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			sb, err := c.Get(ctx, args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(sb)
			}
			printSandbox(os.Stdout, sb)
			return nil
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	return cmd
}

func printSandbox(w io.Writer, sb *corral.Sandbox) {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	r := sb.Resources
	termPrintf(tw, "id:\t%s\n", sb.ID)
	termPrintf(tw, "state:\t%s\n", sb.State)
	if sb.EndReason != "" {
		termPrintf(tw, "end reason:\t%s\n", sb.EndReason)
	}
	termPrintf(tw, "template:\t%s\n", sb.Template)
	termPrintf(tw, "runtime:\t%s\n", sb.Runtime)
	termPrintf(tw, "tier:\t%s\n", sb.Tier)
	termPrintf(tw, "resources:\tcpu=%g memory=%dMiB disk=%dMiB pids=%d nofile=%d\n", r.CPU, r.MemoryMB, r.DiskMB, r.Pids, r.Nofile)
	termPrintf(tw, "command timeout:\t%s\n", sb.CommandTimeout)
	termPrintf(tw, "network:\t%s\n", sb.Network)
	termPrintf(tw, "created:\t%s\n", sb.CreatedAt.Local().Format(time.RFC3339))
	if sb.EndedAt != nil {
		termPrintf(tw, "ended:\t%s\n", sb.EndedAt.Local().Format(time.RFC3339))
	} else {
		termPrintf(tw, "expires:\t%s\n", sb.ExpiresAt.Local().Format(time.RFC3339))
	}
	if len(sb.Metadata) > 0 {
		var kv []string
		for k, v := range sb.Metadata {
			kv = append(kv, k+"="+v)
		}
		slices.Sort(kv)
		termPrintf(tw, "metadata:\t%s\n", strings.Join(kv, " "))
	}
	tw.Flush()
}

func newSandboxKillCmd(g *clientGlobals) *cobra.Command {
	return &cobra.Command{
		Use:   "kill ID...",
		Short: "Kill sandboxes (SIGTERM, 3 s grace, SIGKILL, teardown)",
		Args:  argsRange(1, -1, "at least one sandbox ID"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			var failed error
			for _, id := range args {
				if _, err := c.Kill(ctx, id); err != nil {
					if len(args) == 1 {
						return err
					}
					termPrintf(os.Stderr, "corral: %s: %v\n", id, err)
					failed = exitError{1}
				}
			}
			return failed
		}),
	}
}

// newSandboxPauseCmd is `corral sandbox pause ID` (freeze) or, with
// pause false, `corral sandbox resume ID [--ttl DUR]` (thaw).
func newSandboxPauseCmd(g *clientGlobals, pause bool) *cobra.Command {
	var ttl string
	var persist bool
	cmd := &cobra.Command{
		Use:   "pause ID",
		Short: "Freeze every process of a sandbox (memory kept, lifetime clock stopped)",
		Args:  argsRange(1, 1, "one sandbox ID"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			var err error
			if pause && persist {
				_, err = c.PausePersist(ctx, args[0])
			} else if pause {
				_, err = c.Pause(ctx, args[0])
			} else {
				var d time.Duration
				if ttl != "" {
					if d, err = parseDurationArg(ttl); err != nil {
						return usageError(cmd, "--ttl: %v", err)
					}
				}
				_, err = c.Resume(ctx, args[0], d)
			}
			return err
		}),
	}
	if pause {
		cmd.Flags().BoolVar(&persist, "persist", false, "save the files and stop the processes (frees memory; resume restarts from the saved files)")
	}
	if !pause {
		cmd.Use = "resume ID"
		cmd.Short = "Thaw a paused sandbox"
		cmd.Flags().StringVar(&ttl, "ttl", "", "lifetime from now after resuming (default: what was left when paused)")
	}
	return cmd
}

func newSandboxTimeoutCmd(g *clientGlobals) *cobra.Command {
	return &cobra.Command{
		Use:     "timeout ID DUR",
		Short:   "Set a sandbox's remaining lifetime (TTL) to DUR from now",
		Example: "  corral sandbox timeout sb123 30m\n  corral sandbox timeout sb123 600",
		Args:    argsRange(2, 2, "a sandbox ID and a duration"),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := parseDurationArg(args[1])
			if err != nil {
				return usageError(cmd, "%v", err)
			}
			if d < time.Second {
				return usageError(cmd, "duration must be at least 1s")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			sb, err := c.SetTimeout(ctx, args[0], d)
			if err != nil {
				return apiFailure(cmd, err)
			}
			termPrintf(os.Stdout, "%s expires at %s\n", sb.ID, sb.ExpiresAt.Local().Format(time.RFC3339))
			return nil
		},
	}
}

func newSandboxCpCmd(g *clientGlobals) *cobra.Command {
	var user string
	cmd := &cobra.Command{
		Use:   "cp [flags] SRC DST",
		Short: "Copy a file between the local machine and a sandbox",
		Long: `Cp copies one file into or out of a sandbox. Exactly one of SRC and DST is
ID:PATH (a path in sandbox ID; relative paths are relative to the user's
home); the other is a local path, or "-" for stdin (upload) / stdout
(download). A DST ending in "/" or naming an existing local directory
receives the file under its source name. Parent directories are created in
the sandbox. Directories are not supported yet: copy an archive instead.`,
		Example: `  corral sandbox cp ./main.py sb123:/home/user/main.py
  corral sandbox cp sb123:out/result.json .
  tar cz src | corral sandbox cp - sb123:/tmp/src.tgz`,
		Args: argsRange(2, 2, "SRC and DST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, err := parseCopyTarget(args[0])
			if err != nil {
				return usageError(cmd, "%v", err)
			}
			dst, err := parseCopyTarget(args[1])
			if err != nil {
				return usageError(cmd, "%v", err)
			}
			if src.remote() == dst.remote() {
				return usageError(cmd, "exactly one of SRC and DST must be ID:PATH")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			if dst.remote() {
				return upload(ctx, c, src.Path, dst, user)
			}
			return download(ctx, c, src, dst.Path, user)
		},
	}
	cmd.Flags().StringVar(&user, "user", "", `sandbox user that reads/owns the file ("user" by default, or "root")`)
	return cmd
}

var errDirNotSupported = errors.New("directories not supported yet")

func upload(ctx context.Context, c *corral.Client, local string, dst copyTarget, user string) error {
	var r io.Reader = os.Stdin
	remote := dst.Path
	if local != "-" {
		f, err := os.Open(local)
		if err != nil {
			return err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		if fi.IsDir() {
			return fmt.Errorf("%s: %w", local, errDirNotSupported)
		}
		r = f
		if strings.HasSuffix(remote, "/") {
			remote += filepath.Base(local)
		}
	} else if strings.HasSuffix(remote, "/") {
		return errors.New("uploading stdin needs a file name in DST")
	}
	return c.Sandbox(dst.ID).Files().WithUser(user).Upload(ctx, remote, r)
}

func download(ctx context.Context, c *corral.Client, src copyTarget, local, user string) error {
	fs := c.Sandbox(src.ID).Files().WithUser(user)
	if local == "-" {
		_, err := fs.Download(ctx, src.Path, os.Stdout)
		return dirError(err)
	}
	if fi, err := os.Stat(local); (err == nil && fi.IsDir()) || strings.HasSuffix(local, string(os.PathSeparator)) {
		local = filepath.Join(local, path.Base(src.Path))
	}
	tmp, err := os.CreateTemp(filepath.Dir(local), "."+filepath.Base(local)+".corral-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := fs.Download(ctx, src.Path, tmp); err != nil {
		tmp.Close()
		return dirError(err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), local)
}

// dirError reports the agent's "is a directory" as unsupported.
func dirError(err error) error {
	if err != nil && corral.IsInvalidArgument(err) && strings.Contains(err.Error(), "is a directory") {
		return errDirNotSupported
	}
	return err
}
