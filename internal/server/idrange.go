package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/corralhq/corral/internal/idrange"
)

// IDRangeFile is the file in the data dir that records the uid range the
// data dir's files (template versions, snapshots, volumes, sandboxes) are
// owned by.
const IDRangeFile = "uid-range"

// ResolveIDRange returns the uid range of the data dir dataDir and makes
// sure the host has delegated it to nobody (see idrange.Ensure), recording
// it in /etc/subuid and /etc/subgid (files) and in DATA/uid-range.
//
// The range of a data dir never changes: its files are owned by the host
// ids of the range they were made with, so a sandbox mapped to another
// range would find its files owned by strangers. The recorded range is
// used when want is zero; a want that differs from it is refused, with the
// way out named. A data dir with a database but no record was made before
// ranges were configurable, with idrange.LegacyBase. A new data dir takes
// want, or corral's entry in /etc/subuid, or a free range.
func ResolveIDRange(dataDir string, want idrange.Range, files idrange.Files) (idrange.Range, error) {
	rec, had, err := readIDRange(dataDir)
	if err != nil {
		return idrange.Range{}, err
	}
	if had && !want.IsZero() && want != rec {
		return idrange.Range{}, fmt.Errorf("data dir %s was made with uid range %s (its templates, snapshots, volumes and sandboxes are owned by those host ids), not %s: start corral with --uid-range %s or without --uid-range, or use a new --data dir",
			dataDir, rec, want, rec)
	}
	if had {
		want = rec
	}
	r, err := idrange.Ensure(files, want)
	if err != nil {
		var ce *idrange.ConflictError
		if had && errors.As(err, &ce) {
			return idrange.Range{}, fmt.Errorf("%w: data dir %s was made with uid range %s, which is not free: %s; whoever holds those ids can act as sandbox root on the host (newuidmap, or the ids themselves), and the data dir's files cannot move to another range. Fix: remove that entry (or user), or start corral with a new --data dir (and, if you want, --uid-range)",
				idrange.ErrNotFree, dataDir, rec, ce.Detail)
		}
		return idrange.Range{}, err
	}
	if err := writeIDRange(dataDir, r); err != nil {
		return idrange.Range{}, err
	}
	return r, nil
}

// readIDRange reads DATA/uid-range. Without it, a data dir with a
// database is a legacy one (idrange.LegacyBase); an empty one has none.
func readIDRange(dataDir string) (idrange.Range, bool, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, IDRangeFile))
	if errors.Is(err, os.ErrNotExist) {
		if _, err := os.Stat(filepath.Join(dataDir, "corral.db")); err == nil {
			return idrange.Range{Base: idrange.LegacyBase, Count: idrange.Count}, true, nil
		}
		return idrange.Range{}, false, nil
	}
	if err != nil {
		return idrange.Range{}, false, fmt.Errorf("uid range of the data dir: %w", err)
	}
	r, err := idrange.Parse(strings.TrimSpace(string(b)))
	if err != nil {
		return idrange.Range{}, false, fmt.Errorf("%s: %w", filepath.Join(dataDir, IDRangeFile), err)
	}
	return r, true, nil
}

// writeIDRange records r in DATA/uid-range (atomically) unless it is there.
func writeIDRange(dataDir string, r idrange.Range) error {
	path := filepath.Join(dataDir, IDRangeFile)
	if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == r.String() {
		return nil
	}
	tmp, err := os.CreateTemp(dataDir, "."+IDRangeFile+"-*")
	if err != nil {
		return fmt.Errorf("record uid range: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(r.String() + "\n")
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("record uid range: %w", err)
	}
	return nil
}
