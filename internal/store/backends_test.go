package store

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/corralhq/corral/internal/store/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// backend is a database the store runs on. Every store test that is not
// about one backend's own files or legacy layouts runs on each backend:
// SQLite always, PostgreSQL on the test binary's server from pgtest
// (skipped only when PostgreSQL is not installed and the test does not
// run as root).
type backend struct {
	name string
	// addr returns the address of a new, empty database, removed when t
	// ends.
	addr func(t *testing.T) string
}

var backends = []backend{
	{"sqlite", func(t *testing.T) string { return filepath.Join(t.TempDir(), "corral.db") }},
	{"postgres", func(t *testing.T) string { return pgtest.Shared(t).NewDatabase(t) }},
}

// eachBackend runs f as a subtest on each backend.
func eachBackend(t *testing.T, f func(t *testing.T, b backend)) {
	t.Helper()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { f(t, b) })
	}
}

// eachStore runs f as a subtest on a new, empty store of each backend,
// closed when the subtest ends.
func eachStore(t *testing.T, f func(t *testing.T, s *Store)) {
	t.Helper()
	eachBackend(t, func(t *testing.T, b backend) {
		s, err := Open(b.addr(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		f(t, s)
	})
}
