package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/corralhq/corral/internal/idrange"
	"github.com/corralhq/corral/internal/server"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template"
	"github.com/corralhq/corral/internal/template/registry"
)

// newTemplateCmd is `corral template`: local template management.
func newTemplateCmd(g *clientGlobals) *cobra.Command {
	cmd := &cobra.Command{Use: "template", Short: "Build, import, list, inspect and remove templates"}
	var cache, mirror, storeAddr string
	var ids idrange.Range
	var idFiles idrange.Files
	build := &cobra.Command{
		Use:   "build-base",
		Short: "Build the base template (once; cached by content) and register it as \"base\"",
		Long: `Build the base template: Debian bookworm minbase with bash, coreutils,
python3 (and python), git, curl, sudo, ncurses-bin (tput), procps, iproute2,
ca-certificates and the user "user" (uid 1000, passwordless sudo). The build
is cached by the digest of its recipe under the template cache; an unchanged
recipe is never rebuilt. To rebuild the same recipe, stop the server, delete
the cache directory printed here and run this again. Needs root and
debootstrap. corral serve runs this on first start. The files are shifted
into the data dir's uid range (chosen and recorded as corral serve does;
see --uid-range).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			data := firstNonEmpty(g.dataDir, os.Getenv("CORRAL_DATA"), server.DefaultDataDir)
			if err := os.MkdirAll(data, 0o711); err != nil {
				return err
			}
			r, err := server.ResolveIDRange(data, ids, idFiles)
			if err != nil {
				return err
			}
			t, err := template.BuildBase(cmd.Context(), cache, template.BaseOptions{Progress: os.Stderr, Mirror: mirror, IDBase: r.Base})
			if err != nil {
				return err
			}
			return registerLocal(cmd, data, storeAddr, func(reg *registry.Registry) error { return reg.RegisterBase(cmd.Context(), t) },
				"base:"+t.Version, t)
		},
	}
	ci := &cobra.Command{
		Use:   "build-code-interpreter",
		Short: "Build the code-interpreter template (once; cached by content) and register it as \"code-interpreter\"",
		Long: `Build the code-interpreter template: the base template plus Debian's
python3-ipykernel, python3-jupyter-client, python3-matplotlib, python3-pandas,
python3-numpy, python3-pil and fonts-dejavu-core (installed with apt-get from
the Debian mirror, nothing from elsewhere), and corral's code-interpreter
server, which its sandboxes start on port 49999 (docs/interpreter.md). The
build is cached by the digest of its recipe (package lists, the server's
source, the setup scripts) under the template cache; an unchanged recipe is
never rebuilt. It is registered published (for every team); corral serve
also registers a cached build at start. Needs root and debootstrap.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			data := firstNonEmpty(g.dataDir, os.Getenv("CORRAL_DATA"), server.DefaultDataDir)
			if err := os.MkdirAll(data, 0o711); err != nil {
				return err
			}
			r, err := server.ResolveIDRange(data, ids, idFiles)
			if err != nil {
				return err
			}
			t, err := template.BuildCodeInterpreter(cmd.Context(), cache, template.CodeInterpreterOptions{Progress: os.Stderr, Mirror: mirror, IDBase: r.Base})
			if err != nil {
				return err
			}
			return registerLocal(cmd, data, storeAddr, func(reg *registry.Registry) error { return reg.RegisterCodeInterpreter(cmd.Context(), t) },
				template.CodeInterpreterName+":"+t.Version, t)
		},
	}
	for _, c := range []*cobra.Command{build, ci} {
		c.Flags().StringVar(&storeAddr, "store", "", "the server's PostgreSQL store, as corral serve --store (env CORRAL_STORE; default: the SQLite file DATA/corral.db)")
		c.Flags().StringVar(&cache, "template-cache", "", "template build cache (default /var/cache/corral/templates or $CORRAL_TEMPLATE_CACHE)")
		c.Flags().StringVar(&mirror, "mirror", "", "Debian mirror (default "+template.DefaultMirror+")")
		c.Flags().Var(idRangeFlag{&ids}, "uid-range", "host uid/gid range of the data dir, BASE[:65536] (default: as corral serve picks it)")
		c.Flags().Var(idFilesFlag{&idFiles}, "id-files", "read subuid, subgid, passwd and group from DIR instead of /etc (for tests)")
		_ = c.Flags().MarkHidden("id-files")
		cmd.AddCommand(c)
	}
	addTemplateClientCmds(cmd, g)
	return cmd
}

// registerLocal records a build in the server's registry (the store at
// addr, else DATA/corral.db; after moving an old data dir's template
// links into it) and prints ref, its build dir and size.
func registerLocal(cmd *cobra.Command, data, addr string, register func(*registry.Registry) error, ref string, t template.Template) error {
	addr = firstNonEmpty(addr, os.Getenv("CORRAL_STORE"))
	if addr != "" && !store.IsPostgres(addr) {
		return fmt.Errorf("store: want a postgres:// or postgresql:// URL (the default store is the SQLite file DATA/corral.db)")
	}
	if addr == "" {
		addr = filepath.Join(data, "corral.db")
	}
	st, err := store.Open(addr)
	if err != nil {
		return err
	}
	defer st.Close()
	reg := registry.New(st, registry.Config{})
	if err := reg.MigrateLinks(cmd.Context(), filepath.Join(data, "templates")); err != nil {
		return err
	}
	if err := register(reg); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s %s (%d MB)\n", ref, t.Dir, t.Size>>20)
	return nil
}
