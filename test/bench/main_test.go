// Package bench measures corral's latencies and density on this host
// against baselines measured in the same run: a real in-process server,
// real runc (and runsc) sandboxes from the real base template, raw `runc
// run` of the same rootfs with the same uid shift, and Docker running the
// same rootfs imported as an image. Run with
//
//	make bench
//
// (go test -run '^$' -bench . -benchtime 50x ./test/bench/). It needs root
// and runc (and a cached base template, or debootstrap to build one);
// without them every benchmark skips and says why. After the run the
// results are written as JSON (CORRAL_BENCH_OUT, default
// bench-results/<UTC time>.json at the top of the checkout) and printed
// as the Markdown table of docs/performance.md; `go run
// ./test/bench/report FILE` renders a file again.
package bench

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/server"
	"github.com/corralhq/corral/test/bench/results"
	"github.com/corralhq/corral/test/testserver"
)

// env is the shared server of the benchmarks.
var env struct {
	skip string
	bin  string
	// agentBin is the lean agent binary (cmd/corral-agent), also the
	// supervisor's.
	agentBin string
	tmp      string
	dataDir  string
	srv      *server.Server
	url      string
	key      string
}

// Sizes of the one-shot benchmarks, from the environment.
var (
	// densityN is CORRAL_BENCH_DENSITY: idle sandboxes of BenchmarkDensity.
	densityN = envInt("CORRAL_BENCH_DENSITY", 50)
	// burstN is CORRAL_BENCH_BURST: concurrent creates of BenchmarkBurst.
	burstN = envInt("CORRAL_BENCH_BURST", 50)
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	if flagValue("test.bench") == "" {
		// go test ./... without -bench: nothing here runs, start nothing.
		return m.Run()
	}
	if reason := testserver.Missing(); reason != "" {
		env.skip = "benchmarks " + reason
		return m.Run()
	}
	run := &results.Run{Schema: results.Schema, Started: time.Now().UTC(), Commit: gitCommit(), Machine: machine()}
	// The benchmarks measure the machinery, not the admission policy: the
	// bench server admits every sandbox of the burst and density runs at
	// once (the defaults allow 10 running and 1 create per second per agent).
	slots := max(densityN, burstN) + 40
	ts, err := testserver.StartWith("../../cmd/corral", slog.LevelWarn, func(c *server.Config) {
		c.Admission = govern.AdmissionConfig{
			MaxConcurrent: slots, MaxPerAgent: slots, AgentRate: 1e6, AgentBurst: slots,
			QueueTimeout: 5 * time.Minute, MaxQueue: slots,
		}
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env.bin, env.agentBin, env.tmp, env.dataDir, env.srv, env.url, env.key = ts.Bin, ts.AgentBin, ts.Tmp, ts.DataDir, ts.Srv, ts.URL, ts.Key
	code := m.Run()
	if err := ts.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "close server:", err)
		code = 1
	}
	if docker.d != nil {
		run.Machine.Docker = docker.d.version()
	}
	stopDocker()
	run.Finished = time.Now().UTC()
	run.Machine.LoadAfter = loadavg()
	run.Settings = map[string]string{
		"benchtime": flagValue("test.benchtime"),
		"density":   strconv.Itoa(densityN),
		"burst":     strconv.Itoa(burstN),
	}
	collect(run)
	if len(run.Benchmarks) == 0 && len(run.Skipped) == 0 && run.Burst == nil && run.Density == nil {
		return code
	}
	out := os.Getenv("CORRAL_BENCH_OUT")
	if out == "" {
		out = filepath.Join("..", "..", "bench-results", run.Started.Format("20060102T150405Z")+".json")
	}
	if err := run.Write(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	} else {
		abs, _ := filepath.Abs(out)
		fmt.Printf("\nresults written to %s\n\n", abs)
	}
	run.Markdown(os.Stdout)
	return code
}

func flagValue(name string) string {
	if f := flag.Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}

// need skips b when the host cannot run sandboxes.
func need(b *testing.B) {
	b.Helper()
	if env.skip != "" {
		skip(b, env.skip)
	}
}
