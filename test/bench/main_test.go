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
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/corralhq/corral/internal/server"
)

// env is the shared server of the benchmarks.
var env struct {
	skip    string
	bin     string
	tmp     string
	dataDir string
	srv     *server.Server
	http    *httptest.Server
	url     string
	key     string
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if reason := missing(); reason != "" {
		env.skip = reason
		return m.Run()
	}
	tmp, err := os.MkdirTemp("", "corral-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o711); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env.tmp = tmp
	env.bin, err = buildCorral(tmp)
	if err != nil {
		fmt.Fprintln(os.Stderr, "build corral:", err)
		return 1
	}
	env.dataDir = filepath.Join(tmp, "data")
	ctx := context.Background()
	env.srv, err = server.Open(ctx, server.Config{
		DataDir: env.dataDir, AgentBinary: env.bin, Progress: os.Stderr, MaxOutput: 64 << 10,
		KillOnShutdown: true, MaxSandboxes: 20,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open server:", err)
		return 1
	}
	env.http = httptest.NewServer(env.srv.Handler)
	env.url, env.key = env.http.URL, env.srv.AdminKey
	code := m.Run()
	env.http.Close()
	if err := env.srv.Close(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "close server:", err)
		code = 1
	}
	printSummary(os.Stdout)
	return code
}

// missing names what this machine lacks to run sandboxes, or "".
func missing() string {
	if os.Geteuid() != 0 {
		return "benchmarks need root (namespaces, mounts, cgroups)"
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return "runc is not installed (apt-get install runc)"
	}
	return ""
}

// need skips b when the host cannot run sandboxes.
func need(b *testing.B) {
	b.Helper()
	if env.skip != "" {
		b.Skip(env.skip)
	}
}

// buildCorral builds the static corral binary used as the sandbox agent.
func buildCorral(dir string) (string, error) {
	out := filepath.Join(dir, "corral")
	cmd := exec.Command("go", "build", "-o", out, "../../cmd/corral")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%v: %s", err, b)
	}
	return out, nil
}
