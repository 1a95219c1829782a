package flagfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

type vals struct {
	file, name string
	n          int
	d          time.Duration
	on         bool
	secret     string
}

func flags(v *vals) *pflag.FlagSet {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.StringVar(&v.file, "config", "", "")
	fs.StringVar(&v.name, "name", "default", "")
	fs.IntVar(&v.n, "n", 1, "")
	fs.DurationVar(&v.d, "d", time.Second, "")
	fs.BoolVar(&v.on, "on", false, "")
	fs.StringVar(&v.secret, "secret", "", "")
	_ = fs.MarkHidden("secret")
	return fs
}

// TestApply defends against a settings file or variable that overrides
// what the operator typed, or that is silently ignored: precedence is
// command line, environment, file, default; every source goes through the
// flag's own parser; keys that are no visible flag, tables, arrays and
// dates are refused naming the key and the file.
func TestApply(t *testing.T) {
	dir := t.TempDir()
	write := func(text string) string {
		p := filepath.Join(dir, strings.NewReplacer(" ", "", "\n", "", "=", "", "\"", "", "[", "", "]", "").Replace(text)+".toml")
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	file := write("name = \"file\"\nn = 3\nd = \"2m\"\non = true\n")
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		want    vals
		wantErr []string
	}{
		{name: "file", args: []string{"--config", file}, want: vals{name: "file", n: 3, d: 2 * time.Minute, on: true}},
		{name: "env over file", args: []string{"--config", file}, env: map[string]string{"T_NAME": "env"},
			want: vals{name: "env", n: 3, d: 2 * time.Minute, on: true}},
		{name: "flag over env", args: []string{"--config", file, "--name", "flag", "--on=false"}, env: map[string]string{"T_NAME": "env"},
			want: vals{name: "flag", n: 3, d: 2 * time.Minute, on: false}},
		{name: "file from env", env: map[string]string{"T_CONFIG": file}, want: vals{name: "file", n: 3, d: 2 * time.Minute, on: true}},
		{name: "nothing", want: vals{name: "default", n: 1, d: time.Second}},
		{name: "unknown", args: []string{"--config", write("nme = \"x\"\n")}, wantErr: []string{`unknown key "nme"`, "nmex.toml"}},
		{name: "hidden", args: []string{"--config", write("secret = \"x\"\n")}, wantErr: []string{`unknown key "secret"`}},
		{name: "table", args: []string{"--config", write("[n]\nx = 1\n")}, wantErr: []string{"n: a table is not a setting"}},
		{name: "date", args: []string{"--config", write("d = 1979-05-27\n")}, wantErr: []string{"d: a date is not a setting"}},
		{name: "parse", args: []string{"--config", write("n = 1.5\n")}, wantErr: []string{`n = "1.5"`}},
		{name: "env parse", env: map[string]string{"T_N": "many"}, wantErr: []string{`environment T_N="many" (--n)`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var v vals
			fs := flags(&v)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := Sources{Env: []EnvVar{{"T_CONFIG", "config"}, {"T_NAME", "name"}, {"T_N", "n"}}, FileFlag: "config",
				Getenv: func(k string) string { return tc.env[k] }}.Apply(fs)
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("accepted: %+v", v)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			v.file = ""
			if v != tc.want {
				t.Errorf("got %+v, want %+v", v, tc.want)
			}
		})
	}
}
