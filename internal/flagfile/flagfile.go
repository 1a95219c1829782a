// Package flagfile fills the flags of a command that the command line left
// unset from environment variables and from a TOML configuration file whose
// keys are the flag names. Values go through each flag's own Set, so a file
// value means exactly what the same text means on the command line, and a
// key the command has no flag for is an error: a misspelt setting never
// silently falls back to its default.
//
// Precedence, highest first: the command line, the environment, the file,
// the flag's default.
package flagfile

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/spf13/pflag"
)

// EnvVar binds an environment variable to a flag.
type EnvVar struct {
	// Var is the variable's name (CORRAL_LISTEN).
	Var string
	// Flag is the flag it sets (listen).
	Flag string
}

// Sources are where flags the command line did not set take values from.
type Sources struct {
	// Env are the environment variables read; an empty variable counts
	// as unset.
	Env []EnvVar
	// Getenv reads a variable (nil: os.Getenv).
	Getenv func(string) string
	// FileFlag names the flag that holds the configuration file's path
	// ("" : no file). It may itself come from the environment.
	FileFlag string
}

// Apply sets every flag of fs that the command line did not set from the
// environment, then from the configuration file named by s.FileFlag. An
// unknown key, a hidden flag's key, the file flag's own key or a value its
// flag refuses is an error naming the file, the key and the value; fs may
// then be partly filled and must not be used.
func (s Sources) Apply(fs *pflag.FlagSet) error {
	getenv := s.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	set := map[string]bool{} // flags given on the command line or the environment
	fs.Visit(func(f *pflag.Flag) { set[f.Name] = true })
	for _, e := range s.Env {
		f := fs.Lookup(e.Flag)
		if f == nil {
			return fmt.Errorf("environment %s: no flag --%s", e.Var, e.Flag)
		}
		v := getenv(e.Var)
		if v == "" || set[e.Flag] {
			continue
		}
		if err := setFlag(f, v); err != nil {
			return fmt.Errorf("environment %s=%q (--%s): %w", e.Var, v, e.Flag, err)
		}
		set[e.Flag] = true
	}
	if s.FileFlag == "" {
		return nil
	}
	ff := fs.Lookup(s.FileFlag)
	if ff == nil {
		return fmt.Errorf("no flag --%s", s.FileFlag)
	}
	path := ff.Value.String()
	if path == "" {
		return nil
	}
	return applyFile(fs, path, s.FileFlag, set)
}

// applyFile sets the flags not in skip from the TOML file at path.
func applyFile(fs *pflag.FlagSet, path, fileFlag string, skip map[string]bool) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	var kv map[string]any
	if err := toml.Unmarshal(b, &kv); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var unknown []string
	for _, k := range keys {
		if f := fs.Lookup(k); f == nil || f.Hidden || k == fileFlag {
			unknown = append(unknown, strconv.Quote(k))
		}
	}
	if len(unknown) > 0 {
		word := "key"
		if len(unknown) > 1 {
			word = "keys"
		}
		return fmt.Errorf("config file %s: unknown %s %s (a key is a flag's name without the leading \"--\")", path, word, strings.Join(unknown, ", "))
	}
	var errs []error
	for _, k := range keys {
		if skip[k] {
			continue
		}
		v, err := text(kv[k])
		if err != nil {
			errs = append(errs, fmt.Errorf("config file %s: %s: %w", path, k, err))
			continue
		}
		if err := setFlag(fs.Lookup(k), v); err != nil {
			errs = append(errs, fmt.Errorf("config file %s: %s = %q: %w", path, k, v, err))
		}
	}
	return errors.Join(errs...)
}

// setFlag sets f as the command line would, marking it changed.
func setFlag(f *pflag.Flag, v string) error {
	if err := f.Value.Set(v); err != nil {
		return err
	}
	f.Changed = true
	return nil
}

// text is a TOML value as the command line would spell it. Only strings,
// numbers and booleans are settings; arrays, tables and dates are refused.
func text(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case int64:
		return strconv.FormatInt(v, 10), nil
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64), nil
	case bool:
		return strconv.FormatBool(v), nil
	case map[string]any:
		return "", errors.New("a table is not a setting: give a string, a number or a boolean")
	case []any, []map[string]any:
		return "", errors.New("an array is not a setting: give a string, a number or a boolean")
	default:
		return "", errors.New("a date is not a setting: give durations as strings (\"30s\")")
	}
}
