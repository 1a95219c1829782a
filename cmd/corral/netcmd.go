package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	corral "github.com/corralhq/corral/sdk/go"
)

// newSandboxNetCmd is `corral sandbox net ID`: show or change a running
// sandbox's network policy.
func newSandboxNetCmd(g *clientGlobals) *cobra.Command {
	var mode string
	var allow []string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "net ID [--net MODE] [--allow PATTERN]...",
		Short: "Show or change a running sandbox's network policy",
		Long: `Without --net or --allow, print the sandbox's network policy and egress
counters. With them, replace the policy; the change applies to the
sandbox's next connection and DNS query, without restarting it.
--allow implies --net allow; --net none removes the sandbox's network.`,
		Example: `  corral sandbox net $ID
  corral sandbox net $ID --allow api.github.com --allow '*.pypi.org'
  corral sandbox net $ID --net none`,
		Args: argsRange(1, 1, "a sandbox id"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			change := cmd.Flags().Changed("net") || cmd.Flags().Changed("allow")
			m, err := netMode(mode, allow)
			if err != nil {
				return usageError(cmd, "%v", err)
			}
			var n *corral.Network
			if change {
				n, err = c.SetNetwork(ctx, args[0], m, allow)
			} else {
				n, err = c.GetNetwork(ctx, args[0])
			}
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(n)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			termPrintf(tw, "mode:\t%s\n", n.Mode)
			termPrintf(tw, "allow:\t%s\n", orDash(strings.Join(n.Allow, " ")))
			termPrintf(tw, "secrets:\t%s\n", orDash(strings.Join(n.Secrets, " ")))
			if n.Usage != nil {
				termPrintf(tw, "connections:\t%d open\n", n.Usage.Conns)
				termPrintf(tw, "bytes:\t%d\n", n.Usage.Bytes)
				termPrintf(tw, "requests:\t%d in the last minute\n", n.Usage.Requests)
			}
			return tw.Flush()
		}),
	}
	cmd.Flags().StringVar(&mode, "net", "", "new mode: none, allow or all-public")
	cmd.Flags().StringArrayVar(&allow, "allow", nil, "allowed domain pattern or CIDR:port rule (repeatable; implies --net allow)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// newSecretCmd is `corral secret`: brokered secrets.
func newSecretCmd(g *clientGlobals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secret",
		Short: "Register secrets the egress proxy injects (sandboxes see only placeholders)",
		Long: `A secret is a credential the egress proxy adds to a sandbox's requests to
the secret's hosts: the sandbox sees only the placeholder CORRAL_SECRET_<name>
(an env var whose value is the placeholder itself) and sends it in the
secret's header; the proxy replaces it with the value for the listed hosts
and nowhere else. Sandboxes name the secrets they may use at create
(--secret NAME). For HTTPS the proxy intercepts TLS to those hosts with
corral's egress CA, which such sandboxes trust. The value is injected over
TLS only: a plain-HTTP request carrying the placeholder is refused
(secret_over_plain_http) unless the secret was set with --allow-http.`,
	}
	cmd.AddCommand(newSecretSetCmd(g), newSecretLsCmd(g), newSecretRmCmd(g))
	return cmd
}

func newSecretSetCmd(g *clientGlobals) *cobra.Command {
	var hosts, header, value, valueFile string
	var allowHTTP bool
	cmd := &cobra.Command{
		Use:   "set NAME --hosts H1,H2 --header HEADER (--value VALUE | --value-file FILE|-) [--allow-http]",
		Short: "Register or replace a secret",
		Example: `  corral secret set github --hosts api.github.com --header Authorization --value "Bearer $GITHUB_TOKEN"
  printf 'Bearer %s' "$TOKEN" | corral secret set github --hosts api.github.com --header Authorization --value-file -
  corral run --net allow --allow api.github.com --secret github -- \
    sh -c 'curl -H "Authorization: $CORRAL_SECRET_github" https://api.github.com/user'`,
		Args: argsRange(1, 1, "a secret name"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			if (value == "") == (valueFile == "") {
				return usageError(cmd, "give exactly one of --value and --value-file")
			}
			if valueFile != "" {
				var r io.Reader = os.Stdin
				if valueFile != "-" {
					f, err := os.Open(valueFile)
					if err != nil {
						return usageError(cmd, "--value-file: %v", err)
					}
					defer f.Close()
					r = f
				}
				b, err := io.ReadAll(io.LimitReader(r, 64<<10))
				if err != nil {
					return fmt.Errorf("read secret value: %w", err)
				}
				value = strings.TrimRight(string(b), "\r\n")
			}
			var hl []string
			for _, h := range strings.Split(hosts, ",") {
				if h = strings.TrimSpace(h); h != "" {
					hl = append(hl, h)
				}
			}
			if len(hl) == 0 || header == "" {
				return usageError(cmd, "--hosts and --header are required")
			}
			s, err := c.PutSecret(ctx, args[0], hl, header, value, corral.SecretOptions{AllowHTTP: allowHTTP})
			if err != nil {
				return err
			}
			over := "over TLS only"
			if s.AllowHTTP {
				over = "over TLS and plain HTTP"
			}
			termPrintf(os.Stdout, "secret %s set for %s (header %s, %s); placeholder CORRAL_SECRET_%s\n", s.Name, strings.Join(s.Hosts, ","), s.Header, over, s.Name)
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringVar(&hosts, "hosts", "", "comma-separated host names or *.suffix patterns the secret is for")
	f.StringVar(&header, "header", "", "HTTP header carrying the placeholder, e.g. Authorization")
	f.StringVar(&value, "value", "", "the secret value (visible in the process list; prefer --value-file)")
	f.StringVar(&valueFile, "value-file", "", "read the value from FILE, or from stdin with -")
	f.BoolVar(&allowHTTP, "allow-http", false, "also inject the value into plain-HTTP requests (readable on the network path); by default it is injected over TLS only and plain-HTTP requests carrying the placeholder are refused")
	return cmd
}

func newSecretLsCmd(g *clientGlobals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List secrets (never their values)",
		Args:    argsRange(0, 0, "no arguments"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			list, err := c.ListSecrets(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []corral.Secret{}
				}
				return printJSON(list)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tHOSTS\tHEADER\tOVER\tUPDATED")
			for _, s := range list {
				over := "tls"
				if s.AllowHTTP {
					over = "tls,http"
				}
				termPrintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Name, strings.Join(s.Hosts, ","), s.Header, over, s.UpdatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newSecretRmCmd(g *clientGlobals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME",
		Short: "Delete a secret (sandboxes using it stop getting it injected)",
		Args:  argsRange(1, 1, "a secret name"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			if err := c.DeleteSecret(ctx, args[0]); err != nil {
				return err
			}
			return nil
		}),
	}
}

// newAuditCmd is `corral audit`: read the audit log.
func newAuditCmd(g *clientGlobals) *cobra.Command {
	var q corral.AuditQuery
	var since string
	var asJSON, follow bool
	cmd := &cobra.Command{
		Use:   "audit [--task ID] [--sandbox ID] [--kind KIND] [--since 10m|TIME] [--json] [--follow] | audit export",
		Short: "Show the audit log (sandbox lifecycle, egress, secrets)",
		Example: `  corral audit --sandbox $ID
  corral audit --kind egress. --since 1h --json > egress.jsonl
  corral audit --follow`,
		Args: argsRange(0, 0, "no arguments"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			var err error
			if q.Since, err = parseWhen(since); err != nil {
				return usageError(cmd, "--since: %v", err)
			}
			w := bufio.NewWriter(os.Stdout)
			defer w.Flush()
			for {
				evs, err := c.Audit(ctx, q)
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
				for _, ev := range evs {
					if asJSON {
						if err := writeJSON(w, ev, false); err != nil {
							return err
						}
					} else {
						termPrintf(w, "%s  %-12s %-16s %-20s %-20s %-22s %s\n", ev.Time.Local().Format("2006-01-02 15:04:05.000"),
							orDash(ev.Team), orDash(ev.KeyID), orDash(ev.Sandbox), orDash(ev.Task), ev.Kind, ev.Data)
					}
					q.After = ev.ID
				}
				w.Flush()
				if !follow {
					return nil
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(time.Second):
				}
			}
		}),
	}
	f := cmd.Flags()
	f.StringVar(&q.Team, "team", "", `another team's events (admin keys only; "all": every team's and the server's own); default: the key's team`)
	f.StringVar(&q.Task, "task", "", "only this task's events")
	f.StringVar(&q.Sandbox, "sandbox", "", "only this sandbox's events")
	f.StringVar(&q.Kind, "kind", "", `only this kind and its family: "egress" is egress and every egress.* kind (egress.http, egress.dns, ...); "egress." is the same`)
	f.StringVar(&since, "since", "", "only events newer than a duration ago (10m) or an RFC 3339 time")
	f.IntVar(&q.Limit, "limit", 0, "at most this many events per request (1..10000)")
	f.BoolVar(&asJSON, "json", false, "print one JSON object per line (id, time, sandbox, task, team, key_id, kind, data): JSON Lines, for export")
	f.BoolVar(&asJSON, "jsonl", false, "same as --json")
	f.BoolVar(&follow, "follow", false, "keep printing new events until interrupted")
	cmd.AddCommand(newAuditExportCmd(g))
	return cmd
}

// parseWhen reads a --since or --until value: a duration back from now
// (10m, 2h, 168h) or an RFC 3339 time; "" is the zero time.
func parseWhen(v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := parseDurationArg(v); err == nil {
		return time.Now().Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	return time.Time{}, errors.New("give a duration (10m) or an RFC 3339 time")
}

// newAuditExportCmd is `corral audit export`: every matching event, as
// JSON Lines, to a file or stdout.
func newAuditExportCmd(g *clientGlobals) *cobra.Command {
	var q corral.AuditQuery
	var since, until, out string
	cmd := &cobra.Command{
		Use:   "export [--since 168h|TIME] [--until TIME] [--out FILE] [--task ID] [--sandbox ID] [--kind KIND]",
		Short: "Write every matching audit event as JSON Lines (before retention deletes them)",
		Long: `Writes every matching audit event, oldest first, one JSON object per line
(id, time, sandbox, task, kind, data) to --out (written to FILE.tmp and
renamed when complete, mode 0600) or stdout. It pages through the log, so
unlike "corral audit" it is not limited to 10000 events.`,
		Example: `  corral audit export --since 720h --out audit-$(date +%F).jsonl
  corral audit export --task $TASK --kind egress`,
		Args: argsRange(0, 0, "no arguments"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			var err error
			if q.Since, err = parseWhen(since); err != nil {
				return usageError(cmd, "--since: %v", err)
			}
			if q.Until, err = parseWhen(until); err != nil {
				return usageError(cmd, "--until: %v", err)
			}
			var f *os.File
			w := bufio.NewWriter(os.Stdout)
			if out != "" {
				if f, err = os.OpenFile(out+".tmp", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600); err != nil {
					return err
				}
				defer os.Remove(out + ".tmp") // after the rename: nothing
				defer f.Close()
				w = bufio.NewWriter(f)
			}
			n := 0
			var first, last int64
			for {
				evs, err := c.Audit(ctx, q)
				if err != nil {
					return err
				}
				if len(evs) == 0 {
					break
				}
				for _, ev := range evs {
					if err := writeJSON(w, ev, false); err != nil {
						return err
					}
					if first == 0 {
						first = ev.ID
					}
					last, q.After = ev.ID, ev.ID
					n++
				}
			}
			if err := w.Flush(); err != nil {
				return err
			}
			if f != nil {
				if err := f.Sync(); err != nil {
					return err
				}
				if err := f.Close(); err != nil {
					return err
				}
				if err := os.Rename(out+".tmp", out); err != nil {
					return err
				}
				termPrintf(os.Stderr, "exported %d events (ids %d..%d) to %s\n", n, first, last, out)
			}
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringVar(&q.Team, "team", "", `another team's events (admin keys only; "all": every team's and the server's own); default: the key's team`)
	f.StringVar(&q.Task, "task", "", "only this task's events")
	f.StringVar(&q.Sandbox, "sandbox", "", "only this sandbox's events")
	f.StringVar(&q.Kind, "kind", "", `only this kind and its family ("egress" is every egress.* kind)`)
	f.StringVar(&since, "since", "", "only events at or after a duration ago (168h) or an RFC 3339 time")
	f.StringVar(&until, "until", "", "only events before a duration ago or an RFC 3339 time")
	f.StringVar(&out, "out", "", "write to this file (default: stdout)")
	return cmd
}
