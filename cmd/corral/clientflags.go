package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/cobra"
)

// usageError makes corral print msg, a hint to --help, and exit with 2.
func usageError(cmd *cobra.Command, format string, args ...any) error {
	termPrintf(os.Stderr, "corral: %s\n", fmt.Sprintf(format, args...))
	if cmd != nil {
		termPrintf(os.Stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return exitError{2}
}

// flagErrorFunc turns cobra/pflag flag errors into exit status 2.
func flagErrorFunc(cmd *cobra.Command, err error) error {
	return usageError(cmd, "%v", err)
}

// argsRange validates the number of positional arguments (max < 0: no
// upper bound), reporting a usage error (exit 2).
func argsRange(min, max int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < min || (max >= 0 && len(args) > max) {
			return usageError(cmd, "expected %s, got %d argument(s)", what, len(args))
		}
		return nil
	}
}

// parseSizeMiB parses a size for --memory/--disk into MiB: a plain number
// is MiB; suffixes k, m, g, t (optionally followed by "b", "ib", any case)
// are binary units. Fractions are allowed ("1.5g"); the result is rounded
// up to a whole MiB and must be positive.
func parseSizeMiB(s string) (int64, error) {
	in := strings.TrimSpace(s)
	if in == "" {
		return 0, errors.New("empty size")
	}
	i := strings.IndexFunc(in, func(r rune) bool { return !(unicode.IsDigit(r) || r == '.') })
	num, unit := in, ""
	if i >= 0 {
		num, unit = in[:i], strings.ToLower(strings.TrimSpace(in[i:]))
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || num == "" {
		return 0, fmt.Errorf("invalid size %q (examples: 256m, 1g, 512MiB, 100 (MiB))", s)
	}
	var mult float64
	switch strings.TrimSuffix(strings.TrimSuffix(unit, "b"), "i") {
	case "", "m":
		mult = 1
	case "k":
		mult = 1.0 / 1024
	case "g":
		mult = 1024
	case "t":
		mult = 1024 * 1024
	default:
		return 0, fmt.Errorf("invalid size %q: unknown unit %q (use k, m, g or t)", s, in[i:])
	}
	if unit == "b" || unit == "ib" {
		return 0, fmt.Errorf("invalid size %q: unknown unit %q (use k, m, g or t)", s, in[i:])
	}
	mib := math.Ceil(v * mult)
	if mib < 1 {
		return 0, fmt.Errorf("invalid size %q: must be at least 1 MiB", s)
	}
	if mib > math.MaxInt32 {
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	return int64(mib), nil
}

// parseDurationArg parses a Go duration ("90s", "5m", "1h30m") or plain
// seconds ("30", "1.5"). Negative durations are rejected.
func parseDurationArg(s string) (time.Duration, error) {
	in := strings.TrimSpace(s)
	if in == "" {
		return 0, errors.New("empty duration")
	}
	if secs, err := strconv.ParseFloat(in, 64); err == nil {
		if secs < 0 || math.IsNaN(secs) || math.IsInf(secs, 0) || secs > 1e9 {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		return time.Duration(secs * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(in)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q (examples: 30, 90s, 5m, 1h)", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("invalid duration %q: negative", s)
	}
	return d, nil
}

// parseKV parses "K=V" pairs (V may be empty or contain "=") into a map.
func parseKV(pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("invalid %q: expected KEY=VALUE", p)
		}
		m[k] = v
	}
	return m, nil
}

// copyTarget is one side of "sandbox cp".
type copyTarget struct {
	ID   string // sandbox id; "" for a local path
	Path string // remote path, local path, or "-" for stdin/stdout
}

func (t copyTarget) remote() bool { return t.ID != "" }

// parseCopyTarget parses "ID:PATH" (remote) or a local path. A local path
// that contains ":" can be written "./a:b"; the part before ":" is a
// sandbox id only if it is non-empty and has no "/" and no leading ".".
func parseCopyTarget(s string) (copyTarget, error) {
	if s == "" {
		return copyTarget{}, errors.New("empty path")
	}
	id, path, ok := strings.Cut(s, ":")
	if !ok || id == "" || strings.Contains(id, "/") || strings.HasPrefix(id, ".") {
		return copyTarget{Path: s}, nil
	}
	if path == "" {
		return copyTarget{}, fmt.Errorf("invalid %q: missing path after %q", s, id+":")
	}
	return copyTarget{ID: id, Path: path}, nil
}
