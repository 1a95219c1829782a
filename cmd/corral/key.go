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

// newKeyCmd is `corral key create|ls|revoke` (admin keys only).
func newKeyCmd(g *clientGlobals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "key",
		Short: "API keys: create, list and revoke the keys of teams (admin key needed)",
		Long: `Every request names a team through its API key: a key acts for one team,
as admin (every route; other teams' records with ?team=) or member (its own
team's records only). Keys have E2B's format (e2b_ + 40 hex), so E2B SDKs take
them as E2B_API_KEY. The server stores only a key's SHA-256; the value is shown
once, by create. A revoked key fails from its next request on. The server's
last unrevoked admin key cannot be revoked.`,
	}
	var team, role, name string
	var asJSON bool
	create := &cobra.Command{
		Use:   "create --team T [--role admin|member] [--name N] [--json]",
		Short: "Create a key; prints its id, team, role and name, then the key itself last",
		Example: `  corral key create --team research --name ci
  KEY=$(corral key create --team research | tail -n 1)
  corral key create --team ops --role admin --json`,
		Args: argsRange(0, 0, "no arguments (use --team)"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			if team == "" {
				return usageError(cmd, "--team is required")
			}
			k, err := c.CreateKey(ctx, corral.KeyRequest{Team: team, Role: role, Name: name})
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(k)
			}
			termPrintf(os.Stdout, "id:   %s\nteam: %s\nrole: %s\nname: %s\n%s\n", k.ID, k.Team, k.Role, k.Name, k.Key)
			termPrintln(os.Stderr, "corral: keep the key now: the server stores only its hash and never shows it again")
			return nil
		}),
	}
	create.Flags().StringVar(&team, "team", "", "team the key acts for (1 to 63 of a-z, 0-9, _ and -)")
	create.Flags().StringVar(&role, "role", corral.RoleMember, "admin or member")
	create.Flags().StringVar(&name, "name", "", "a label for the key (up to 64 bytes)")
	create.Flags().BoolVar(&asJSON, "json", false, "print one JSON object, the key in \"key\"")
	ls := &cobra.Command{
		Use:     "ls [--team T|all] [--json]",
		Aliases: []string{"list"},
		Short:   "List keys (ids, never values), revoked ones too",
		Args:    argsRange(0, 0, "no arguments"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			list, err := c.ListKeys(ctx, team)
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []corral.KeyInfo{}
				}
				return printJSON(list)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTEAM\tROLE\tNAME\tCREATED\tREVOKED")
			for _, k := range list {
				revoked := "-"
				if k.RevokedAt != nil {
					revoked = k.RevokedAt.Local().Format(time.DateTime)
				}
				termPrintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Team, k.Role, k.Name, k.CreatedAt.Local().Format(time.DateTime), revoked)
			}
			return tw.Flush()
		}),
	}
	ls.Flags().StringVar(&team, "team", "", "list this team's keys, or every team's with all (default: the caller's team)")
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a key: it fails from its next request on",
		Args:  argsRange(1, 1, "a key id (corral key ls)"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			k, err := c.RevokeKey(ctx, args[0])
			if err != nil {
				return err
			}
			at := ""
			if k.RevokedAt != nil {
				at = " at " + k.RevokedAt.Local().Format(time.DateTime)
			}
			termPrintf(os.Stdout, "key %s (team %s, %s) revoked%s\n", k.ID, k.Team, k.Role, at)
			return nil
		}),
	}
	cmd.AddCommand(create, ls, revoke)
	return cmd
}
