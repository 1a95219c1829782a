package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/corralhq/corral/internal/template"
)

// newTemplateCmd is `corral template`: local template management.
func newTemplateCmd(g *clientGlobals) *cobra.Command {
	cmd := &cobra.Command{Use: "template", Short: "Build, import, list, inspect and remove templates"}
	var cache, mirror string
	build := &cobra.Command{
		Use:   "build-base",
		Short: "Build the base template (once; cached by content) and register it as \"base\"",
		Long: `Build the base template: Debian bookworm minbase with bash, coreutils,
python3 (and python), git, curl, sudo, ncurses-bin (tput), procps, iproute2,
ca-certificates and the user "user" (uid 1000, passwordless sudo). The build
is cached by the digest of its recipe under the template cache; an unchanged
recipe is never rebuilt. To rebuild the same recipe, stop the server, delete
the cache directory printed here and run this again. Needs root and
debootstrap. corral serve runs this on first start.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := template.BuildBase(cmd.Context(), cache, template.BaseOptions{Progress: os.Stderr, Mirror: mirror})
			if err != nil {
				return err
			}
			data := firstNonEmpty(g.dataDir, os.Getenv("CORRAL_DATA"), "/var/lib/corral")
			st, err := template.OpenStore(filepath.Join(data, "templates"))
			if err != nil {
				return err
			}
			if err := st.Register("base", t.Dir); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "base:%s %s (%d MB)\n", t.Version, t.Dir, t.Size>>20)
			return nil
		},
	}
	build.Flags().StringVar(&cache, "template-cache", "", "template build cache (default /var/cache/corral/templates or $CORRAL_TEMPLATE_CACHE)")
	build.Flags().StringVar(&mirror, "mirror", "", "Debian mirror (default "+template.DefaultMirror+")")
	cmd.AddCommand(build)
	addTemplateClientCmds(cmd, g)
	return cmd
}
