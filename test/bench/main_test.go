// Package bench measures corral's latencies on this host against raw runc
// baselines: a real in-process server, real runc (and runsc) sandboxes from
// the real base template. Run with
//
//	go test -run '^$' -bench . -benchtime 50x ./test/bench/
//
// It needs root and runc (and a cached base template, or debootstrap to
// build one); without them every benchmark skips and says why. After the
// run a summary table is printed for the README.
package bench

import (
	"fmt"
	"log/slog"
	"os"
	"testing"

	"github.com/corralhq/corral/internal/server"
	"github.com/corralhq/corral/test/testserver"
)

// env is the shared server of the benchmarks.
var env struct {
	skip    string
	bin     string
	dataDir string
	srv     *server.Server
	url     string
	key     string
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if reason := testserver.Missing(); reason != "" {
		env.skip = "benchmarks " + reason
		return m.Run()
	}
	ts, err := testserver.Start("../../cmd/corral", slog.LevelWarn)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env.bin, env.dataDir, env.srv, env.url, env.key = ts.Bin, ts.DataDir, ts.Srv, ts.URL, ts.Key
	code := m.Run()
	if err := ts.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "close server:", err)
		code = 1
	}
	printSummary(os.Stdout)
	return code
}

// need skips b when the host cannot run sandboxes.
func need(b *testing.B) {
	b.Helper()
	if env.skip != "" {
		b.Skip(env.skip)
	}
}
