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
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

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

// nsEnv marks the re-executed test binary that runs in its own mount
// namespace.
const nsEnv = "CORRAL_BENCH_MOUNTNS"

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if reason := missing(); reason != "" {
		env.skip = reason
		return m.Run()
	}
	// server.Open reconciles every container in the shared runc roots
	// (/run/corral/runc, /run/corral/runsc) against its own store and tears
	// down the ones it does not know: on a host with a live corral server or
	// a running integration test, it would kill their sandboxes. So the
	// benchmarks re-run themselves in a private mount namespace with a fresh
	// tmpfs on /run/corral, where only their own containers are visible.
	if os.Getenv(nsEnv) == "" {
		return reexecIsolated()
	}
	if err := syscall.Mount("tmpfs", "/run/corral", "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=0755"); err != nil {
		fmt.Fprintln(os.Stderr, "mount private /run/corral:", err)
		return 1
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

// reexecIsolated runs this test binary again, with the same arguments, in
// a new private mount namespace, and returns its exit code.
func reexecIsolated() int {
	if err := os.MkdirAll("/run/corral", 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Env = append(os.Environ(), nsEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// Go makes / recursively private after unsharing the mount namespace,
	// so nothing mounted inside propagates back to the host.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "re-exec in a private mount namespace:", err)
		return 1
	}
	return 0
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
