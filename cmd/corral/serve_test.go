package main

import (
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// docTable returns the rows (cells trimmed) of the first markdown table
// after the line heading in the file at path, without its header and
// separator rows.
func docTable(t *testing.T, path, heading string) [][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	i := slices.Index(lines, heading)
	if i < 0 {
		t.Fatalf("%s: no line %q", path, heading)
	}
	var rows [][]string
	for _, l := range lines[i+1:] {
		if !strings.HasPrefix(l, "|") {
			if len(rows) > 0 {
				break
			}
			continue
		}
		l = strings.ReplaceAll(strings.Trim(l, "|"), `\|`, "\x00")
		var cells []string
		for _, c := range strings.Split(l, "|") {
			cells = append(cells, strings.ReplaceAll(strings.TrimSpace(c), "\x00", "|"))
		}
		rows = append(rows, cells)
	}
	if len(rows) < 2 {
		t.Fatalf("%s: no table after %q", path, heading)
	}
	return rows[2:]
}

var docFlagCell = regexp.MustCompile("^`--([a-z0-9-]+)( [^`]+)?`$")

// TestConfigurationDocs defends against documentation that drifts from the
// code (issue 11: the global sandbox limit was documented as 50 in one
// place and 10 in another, and nothing noticed): docs/configuration.md's
// table of `corral serve` flags has exactly one row per visible flag, no
// row for a flag that does not exist, and each row's default is the
// flag's (a literal in backticks that the flag parses to its default
// value, "off"/"on" for switches, prose only for a default computed at
// start); its environment table is serveEnv.
func TestConfigurationDocs(t *testing.T) {
	const doc = "../../docs/configuration.md"
	fs := serveFlags(&serveOptions{})
	seen := map[string]bool{}
	for _, row := range docTable(t, doc, "## `corral serve`") {
		m := docFlagCell.FindStringSubmatch(row[0])
		if m == nil || len(row) != 3 {
			t.Errorf("row %q: want | `--flag [ARG]` | default | meaning |", row)
			continue
		}
		name, def := m[1], row[1]
		f := fs.Lookup(name)
		switch {
		case f == nil:
			t.Errorf("--%s is documented but is no flag of corral serve", name)
			continue
		case f.Hidden:
			t.Errorf("--%s is hidden but documented in the table", name)
		case seen[name]:
			t.Errorf("--%s has two rows", name)
		}
		seen[name] = true
		if err := docDefault(f, def); err != "" {
			t.Errorf("--%s: documented default %q: %s", name, def, err)
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if !f.Hidden && !seen[f.Name] {
			t.Errorf("--%s (default %q) is missing from %s", f.Name, f.DefValue, doc)
		}
	})

	var env []string
	for _, row := range docTable(t, doc, "### Environment") {
		env = append(env, row[0]+" "+row[1])
	}
	var want []string
	for _, e := range serveEnv {
		want = append(want, "`"+e.Var+"` `--"+e.Flag+"`")
	}
	if !slices.Equal(env, want) {
		t.Errorf("environment table:\n%s\nwant (serveEnv):\n%s", strings.Join(env, "\n"), strings.Join(want, "\n"))
	}
}

// docDefault checks a documented default against flag f; "" is a match.
func docDefault(f *pflag.Flag, cell string) string {
	if f.Value.Type() == "bool" {
		if want := map[string]string{"false": "off", "true": "on"}[f.DefValue]; cell != want {
			return "want " + want
		}
		return ""
	}
	if !strings.HasPrefix(cell, "`") {
		if f.DefValue != "" {
			return "the flag's default is " + f.DefValue + ": give it in backticks"
		}
		return ""
	}
	lit := strings.SplitN(cell[1:], "`", 2)[0]
	g := serveFlags(&serveOptions{}).Lookup(f.Name)
	if err := g.Value.Set(lit); err != nil {
		return "does not parse: " + err.Error()
	}
	if g.Value.String() != f.DefValue {
		return "is " + g.Value.String() + ", the flag's default is " + f.DefValue
	}
	return ""
}

// TestServeDefaultsValid defends against a flag default its own Validate
// refuses: the defaults as the flags give them are a valid configuration.
func TestServeDefaultsValid(t *testing.T) {
	var o serveOptions
	fs := serveFlags(&o)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := o.load(fs, func(string) string { return "" }); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
}

// TestServeConfigFile defends against a configuration file that silently
// does not apply: a misspelt key, a table, a value the flag would refuse or
// one out of range must stop the server with a message naming the file,
// the key and the value; keys set values exactly as their flags do; the
// command line overrides the environment, which overrides the file.
func TestServeConfigFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.toml", `
listen = "127.0.0.1:9999"
data = "/srv/corral"
log-level = "debug"
max-sandboxes = 40
agent-rate = 2.5
kill-grace = "5s"
refuse-env-secrets = true
egress-max-bytes = 4294967296
sandbox-net = "10.202.0.0/16"
cpu-runaway-action = "command"
`)
	type env map[string]string
	for _, tc := range []struct {
		name    string
		args    []string
		env     env
		check   func(t *testing.T, o *serveOptions)
		wantErr []string // substrings of the error; nil: success
	}{
		{name: "file sets values", args: []string{"--config", good}, check: func(t *testing.T, o *serveOptions) {
			c := o.cfg
			if c.Listen != "127.0.0.1:9999" || c.DataDir != "/srv/corral" || c.Admission.MaxConcurrent != 40 || c.Admission.AgentRate != 2.5 ||
				c.KillGrace != 5*time.Second || !c.RefuseEnvSecrets || c.EgressLimits.MaxBytes != 4<<30 ||
				c.NetworkRange != netip.MustParsePrefix("10.202.0.0/16") || c.RunawayAction != "command" || o.logLevel.String() != "DEBUG" {
				t.Errorf("config from file: %+v, log level %v", c, o.logLevel)
			}
			if c.Admission.MaxPerAgent != 5 || c.HTTPIdleTimeout != 2*time.Minute {
				t.Errorf("keys the file does not set lost their defaults: %+v", c)
			}
		}},
		{name: "flag overrides file", args: []string{"--config", good, "--max-sandboxes", "60", "--kill-grace=1s"}, check: func(t *testing.T, o *serveOptions) {
			if o.cfg.Admission.MaxConcurrent != 60 || o.cfg.KillGrace != time.Second || o.cfg.Listen != "127.0.0.1:9999" {
				t.Errorf("max-sandboxes %d kill-grace %v listen %s, want 60 1s 127.0.0.1:9999", o.cfg.Admission.MaxConcurrent, o.cfg.KillGrace, o.cfg.Listen)
			}
		}},
		{name: "env overrides file, flag overrides env", args: []string{"--data", "/flag"},
			env: env{"CORRAL_CONFIG": good, "CORRAL_LISTEN": "127.0.0.1:1111", "CORRAL_DATA": "/env", "CORRAL_LOG_LEVEL": "warn"},
			check: func(t *testing.T, o *serveOptions) {
				if o.cfg.Listen != "127.0.0.1:1111" || o.cfg.DataDir != "/flag" || o.logLevel.String() != "WARN" || o.cfg.Admission.MaxConcurrent != 40 {
					t.Errorf("listen %s data %s level %v max-sandboxes %d", o.cfg.Listen, o.cfg.DataDir, o.logLevel, o.cfg.Admission.MaxConcurrent)
				}
			}},
		{name: "no file: defaults", check: func(t *testing.T, o *serveOptions) {
			if o.cfg.Admission.MaxConcurrent != 10 || o.cfg.Listen != "127.0.0.1:7420" || o.cfg.KillGrace != 3*time.Second {
				t.Errorf("defaults: %+v", o.cfg)
			}
		}},
		{name: "unknown key", args: []string{"--config", write("typo.toml", "max-sandboxes = 3\nmax-sandbox = 4\n")},
			wantErr: []string{"typo.toml", `unknown key "max-sandbox"`}},
		{name: "every unknown key", args: []string{"--config", write("typos.toml", "lisen = \"x\"\nkill_grace = \"1s\"\n")},
			wantErr: []string{`unknown keys "kill_grace", "lisen"`}},
		{name: "table", args: []string{"--config", write("table.toml", "[egress]\nmax-conns = 3\n")},
			wantErr: []string{"table.toml", `unknown key "egress"`}},
		{name: "config key", args: []string{"--config", write("self.toml", "config = \"/etc/other.toml\"\n")},
			wantErr: []string{`unknown key "config"`}},
		{name: "hidden flag", args: []string{"--config", write("hidden.toml", "id-files = \"/tmp\"\n")},
			wantErr: []string{`unknown key "id-files"`}},
		{name: "bad duration", args: []string{"--config", write("dur.toml", "kill-grace = \"3 s\"\n")},
			wantErr: []string{"dur.toml", `kill-grace = "3 s"`}},
		{name: "duration without unit", args: []string{"--config", write("unit.toml", "kill-grace = 3\n")},
			wantErr: []string{`kill-grace = "3"`, "missing unit"}},
		{name: "bad number", args: []string{"--config", write("num.toml", "max-sandboxes = \"ten\"\n")},
			wantErr: []string{`max-sandboxes = "ten"`}},
		{name: "array", args: []string{"--config", write("array.toml", "listen = [\"a\", \"b\"]\n")},
			wantErr: []string{"array.toml", "listen: an array is not a setting"}},
		{name: "bad level", args: []string{"--config", write("level.toml", "log-level = \"loud\"\n")},
			wantErr: []string{`log-level = "loud"`, "debug, info, warn or error"}},
		{name: "out of range", args: []string{"--config", write("range.toml", "kill-grace = \"2m\"\nloop-window = 500\n")},
			wantErr: []string{"kill-grace 2m0s: must be 0s..1m0s", "loop-window 500: must be 0..100"}},
		{name: "bad enum", args: []string{"--config", write("enum.toml", "e2b-internet = \"everything\"\n")},
			wantErr: []string{`e2b-internet "everything"`}},
		{name: "syntax", args: []string{"--config", write("syntax.toml", "max-sandboxes = = 3\n")},
			wantErr: []string{"syntax.toml", "line 1"}},
		{name: "missing file", args: []string{"--config", filepath.Join(dir, "none.toml")},
			wantErr: []string{"none.toml"}},
		{name: "bad env", env: env{"CORRAL_LOG_LEVEL": "loud"},
			wantErr: []string{`environment CORRAL_LOG_LEVEL="loud" (--log-level)`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o serveOptions
			fs := serveFlags(&o)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := o.load(fs, func(k string) string { return tc.env[k] })
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("load: %v", err)
				}
				tc.check(t, &o)
				return
			}
			if err == nil {
				t.Fatalf("load succeeded, want an error naming %q; config %+v", tc.wantErr, o.cfg)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}
