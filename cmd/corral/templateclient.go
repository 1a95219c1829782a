package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	corral "github.com/corralhq/corral/sdk/go"
)

// specFile is the YAML (or JSON) template spec as a user writes it: files
// name a host file (src, relative to the spec) or inline content; run
// entries are a command string (run as root) or {command, user}.
type specFile struct {
	Name       string            `json:"name"`
	Version    string            `json:"version"`
	Base       string            `json:"base"`
	Packages   []string          `json:"packages"`
	Files      []specFileEntry   `json:"files"`
	Run        []json.RawMessage `json:"run"`
	Env        map[string]string `json:"env"`
	Workdir    string            `json:"workdir"`
	Runtime    string            `json:"runtime"`
	Tier       string            `json:"tier"`
	Start      string            `json:"start"`
	Allow      []string          `json:"allow"`
	AptSources []string          `json:"apt_sources"`
}

type specFileEntry struct {
	Path    string `json:"path"`
	Src     string `json:"src"`
	Content string `json:"content"`
	Mode    string `json:"mode"`
	Owner   string `json:"owner"`
}

// readSpec reads a spec file into the API's form.
func readSpec(path string) (corral.TemplateSpec, error) {
	var out corral.TemplateSpec
	raw, err := os.ReadFile(path)
	if err != nil {
		return out, err
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return out, fmt.Errorf("%s: %w", path, err)
	}
	var sf specFile
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sf); err != nil {
		return out, fmt.Errorf("%s: %w", path, err)
	}
	out = corral.TemplateSpec{Name: sf.Name, Version: sf.Version, Base: sf.Base, Packages: sf.Packages, Env: sf.Env,
		Workdir: sf.Workdir, Runtime: sf.Runtime, Tier: sf.Tier, Start: sf.Start, Allow: sf.Allow, AptSources: sf.AptSources}
	for _, f := range sf.Files {
		data := []byte(f.Content)
		if f.Src != "" {
			if f.Content != "" {
				return out, fmt.Errorf("file %s: give src or content, not both", f.Path)
			}
			src := f.Src
			if !filepath.IsAbs(src) {
				src = filepath.Join(filepath.Dir(path), src)
			}
			if data, err = os.ReadFile(src); err != nil {
				return out, fmt.Errorf("file %s: %w", f.Path, err)
			}
		}
		out.Files = append(out.Files, corral.TemplateFile{Path: f.Path, ContentBase64: base64.StdEncoding.EncodeToString(data), Mode: f.Mode, Owner: f.Owner})
	}
	for _, r := range sf.Run {
		var s string
		if json.Unmarshal(r, &s) == nil {
			out.Run = append(out.Run, corral.TemplateCommand{Command: s})
			continue
		}
		var c corral.TemplateCommand
		dec := json.NewDecoder(bytes.NewReader(r))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return out, fmt.Errorf("run entry %s: %w", r, err)
		}
		out.Run = append(out.Run, c)
	}
	return out, nil
}

// addTemplateClientCmds adds the server-side template commands.
func addTemplateClientCmds(cmd *cobra.Command, g *clientGlobals) {
	var specPath string
	build := &cobra.Command{
		Use:   "build -f SPEC",
		Short: "Build a template version from a spec file; prints name:version last",
		Long: `Build runs the spec inside a sandbox of its base template: files are
copied in, packages installed (egress only to the Debian mirrors and the
spec's allow list), commands run; the sandbox's writable layer becomes the new
version's layer. Progress streams to stderr; a failed build registers
nothing. The new version becomes the template's current version.`,
		Example: "  corral template build -f env.yaml",
		Args:    argsRange(0, 0, "no arguments (the spec is -f FILE)"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			if specPath == "" {
				return usageError(cmd, "give the spec with -f FILE")
			}
			spec, err := readSpec(specPath)
			if err != nil {
				return usageError(cmd, "%v", err)
			}
			t, err := c.BuildTemplate(ctx, spec, func(line string) { termPrintln(os.Stderr, line) })
			if err != nil {
				return err
			}
			termPrintln(os.Stdout, t.Ref)
			return nil
		}),
	}
	build.Flags().StringVarP(&specPath, "file", "f", "", "spec file (YAML or JSON)")

	var asJSON bool
	ls := &cobra.Command{
		Use:     "ls [NAME] [--json]",
		Aliases: []string{"list"},
		Short:   "List template versions",
		Args:    argsRange(0, 1, "at most a template name"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			list, err := c.Templates(ctx, name)
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []corral.TemplateInfo{}
				}
				return printJSON(list)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TEMPLATE\tCURRENT\tTEAM\tSOURCE\tLAYERS\tSIZE MB\tPARENT\tCREATED")
			for _, t := range list {
				cur := ""
				if t.Current {
					cur = "*"
				}
				team := t.Team
				if team == "" {
					team = "(published)"
				}
				termPrintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", t.Ref, cur, team, t.Source, t.Layers, t.SizeBytes>>20, orDash(t.Parent), t.CreatedAt.Local().Format("2006-01-02 15:04"))
			}
			return tw.Flush()
		}),
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	use := &cobra.Command{
		Use:   "use NAME:VERSION",
		Short: "Make a version current (rollback); running sandboxes keep theirs",
		Args:  argsRange(1, 1, "NAME:VERSION"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			t, err := c.UseTemplate(ctx, args[0])
			if err != nil {
				return err
			}
			termPrintln(os.Stdout, t.Ref)
			return nil
		}),
	}
	publish := &cobra.Command{
		Use:   "publish NAME",
		Short: "Make a template usable by every team (admin key)",
		Args:  argsRange(1, 1, "NAME"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			t, err := c.PublishTemplate(ctx, args[0])
			if err != nil {
				return err
			}
			termPrintln(os.Stdout, t.Name)
			return nil
		}),
	}
	rm := &cobra.Command{
		Use:   "rm NAME:VERSION",
		Short: "Delete a template version nothing uses",
		Args:  argsRange(1, 1, "NAME:VERSION"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			if err := c.DeleteTemplate(ctx, args[0]); err != nil {
				return err
			}
			return nil
		}),
	}
	var layout string
	imp := &cobra.Command{
		Use:   "import NAME:VERSION FILE.tar | --layout DIR",
		Short: "Import a docker-save or OCI image tarball (or an OCI layout on the server's host)",
		Example: `  docker save python:3.12-slim > py.tar && corral template import py:3.12 py.tar
  corral template import py:3.12 --layout /srv/images/py`,
		Args: argsRange(1, 2, "NAME:VERSION and a tarball"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			var res *corral.ImportedTemplate
			var err error
			switch {
			case layout != "" && len(args) == 1:
				abs, _ := filepath.Abs(layout)
				res, err = c.ImportTemplateLayout(ctx, args[0], abs)
			case layout == "" && len(args) == 2:
				f, ferr := os.Open(args[1])
				if ferr != nil {
					return usageError(cmd, "%v", ferr)
				}
				defer f.Close()
				res, err = c.ImportTemplate(ctx, args[0], f)
			default:
				return usageError(cmd, "give a tarball or --layout DIR")
			}
			if err != nil {
				return err
			}
			termPrintLines(os.Stderr, res.Log)
			termPrintln(os.Stdout, res.Template.Ref)
			return nil
		}),
	}
	imp.Flags().StringVar(&layout, "layout", "", "an OCI image layout directory on the server's host")
	var insecure bool
	pull := &cobra.Command{
		Use:     "pull NAME:VERSION IMAGE",
		Short:   "Import an image from a registry the server can reach",
		Example: "  corral template pull py:3.12 registry.example.com/python:3.12-slim",
		Args:    argsRange(2, 2, "NAME:VERSION and an image reference"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			res, err := c.PullTemplate(ctx, args[0], args[1], insecure)
			if err != nil {
				return err
			}
			termPrintLines(os.Stderr, res.Log)
			termPrintln(os.Stdout, res.Template.Ref)
			return nil
		}),
	}
	pull.Flags().BoolVar(&insecure, "insecure", false, "allow a plain-HTTP registry")
	var top int
	var inspJSON bool
	inspect := &cobra.Command{
		Use:   "inspect NAME[:VERSION] [--top N] [--json]",
		Short: "Show a template's size by layer and its largest files",
		Args:  argsRange(1, 1, "a template"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			layers, err := c.InspectTemplate(ctx, args[0], top)
			if err != nil {
				return err
			}
			if inspJSON {
				return printJSON(layers)
			}
			for _, l := range layers {
				termPrintf(os.Stdout, "%s: %d files, %.1f MB\n", l.Layer, l.Files, float64(l.Bytes)/(1<<20))
				for _, p := range l.Largest {
					termPrintf(os.Stdout, "  %10.1f MB  %s\n", float64(p.Bytes)/(1<<20), p.Path)
				}
			}
			return nil
		}),
	}
	inspect.Flags().IntVar(&top, "top", 10, "largest files per layer")
	inspect.Flags().BoolVar(&inspJSON, "json", false, "print JSON")
	cmd.AddCommand(build, ls, use, publish, rm, imp, pull, inspect)
}
