package integration

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// e2bDir holds the E2B-compatibility suite, relative to this package.
const e2bDir = "../e2b"

// e2bVersions are the SDK versions the suite pins (test/e2b/package.json),
// by package directory: the current SDK, 2.45 (the older route set,
// legacy.test.mjs) under an npm alias, and the code-interpreter SDK
// (interpreter.test.mjs).
var e2bVersions = map[string]string{"e2b": "2.51.0", "e2b-2.45": "2.45.0", "@e2b/code-interpreter": "2.8.0"}

// TestE2BSDK runs the unmodified e2b JS SDK's compatibility suite
// (test/e2b/*.test.mjs, node:test) against the shared in-process server,
// configured exactly as an E2B user would configure the SDK.
func TestE2BSDK(t *testing.T) {
	need(t)
	node := e2bNode(t)
	files, err := filepath.Glob(filepath.Join(e2bDir, "*.test.mjs"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files in %s: %v", e2bDir, err)
	}
	sort.Strings(files)

	// Generous: the suite takes about 40 s here, and much of it is waiting
	// on lifetimes and samples that do not shrink on a faster machine.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	args := append([]string{"--test", "--test-concurrency=2", "--test-reporter=spec"}, files...)
	cmd := exec.CommandContext(ctx, node, args...)
	cmd.Env = e2bEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	start := time.Now()
	err = cmd.Run()
	took := time.Since(start).Round(time.Second)
	if err != nil || testing.Verbose() {
		logLines(t, out.String())
	}
	if ctx.Err() != nil {
		t.Fatalf("node --test did not finish within 5 minutes (killed after %s)", took)
	}
	if err != nil {
		t.Fatalf("node --test %s: %v (after %s)", strings.Join(files, " "), err, took)
	}
	t.Logf("E2B suite passed in %s", took)
}

// e2bEnv is this process's environment without any E2B_* setting, plus
// the three a user sets to point the SDK at the shared server.
func e2bEnv() []string { return e2bEnvFor(env.url, env.key) }

// e2bEnvFor is e2bEnv for the server at url with API key key.
func e2bEnvFor(url, key string) []string {
	var envv []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		// E2B_COMPAT_* are the suite's own knobs; every other E2B_* would
		// change what the SDK does (E2B_DEBUG, E2B_DOMAIN, ...).
		if strings.HasPrefix(name, "E2B_") && !strings.HasPrefix(name, "E2B_COMPAT_") {
			continue
		}
		envv = append(envv, kv)
	}
	return append(envv, "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_VOLUME_API_URL="+url, "E2B_API_KEY="+key)
}

// logLines logs out in pieces small enough for t.Log to stay readable.
func logLines(t *testing.T, out string) {
	t.Helper()
	const chunk = 200
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	for i := 0; i < len(lines); i += chunk {
		end := min(i+chunk, len(lines))
		t.Log("\n" + strings.Join(lines[i:end], "\n"))
	}
}
