package integration

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/server"
)

// pySDKDir holds the Python SDK (package corral), relative to this package.
const pySDKDir = "../../sdk/python"

// TestPythonSDK installs the Python SDK with pip into a fresh venv,
// offline (--no-index: its stdlib build backend needs nothing from an
// index), and runs its unittest suite from outside the source tree (so
// the installed package is the one imported) against the shared
// in-process server, configured as a user configures the SDK:
// CORRAL_URL and CORRAL_API_KEY. The capacity test gets a dedicated
// server that admits one sandbox (CORRAL_TEST_CAPACITY_URL/KEY). The
// only skips allowed are the run_code tests when the server has no
// code-interpreter template: any other skip fails this test, so that a
// suite that silently stopped running cannot pass.
func TestPythonSDK(t *testing.T) {
	need(t)
	py := python3(t)
	venv := filepath.Join(t.TempDir(), "venv")
	runPy(t, py, "-m", "venv", venv)
	vpy := filepath.Join(venv, "bin", "python")
	sdk, err := filepath.Abs(pySDKDir)
	if err != nil {
		t.Fatal(err)
	}
	runPy(t, vpy, "-m", "pip", "install", "--no-index", "--no-cache-dir", "--quiet", sdk)

	small := startGovServer(t, "pycapacity", func(c *server.Config) {
		c.Admission = govern.AdmissionConfig{MaxConcurrent: 1}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, vpy, "-m", "unittest", "discover", "-v",
		"-s", filepath.Join(sdk, "tests"), "-t", filepath.Join(sdk, "tests"))
	cmd.Dir = t.TempDir()
	cmd.Env = append(pyEnv(),
		"CORRAL_URL="+env.url, "CORRAL_API_KEY="+env.key,
		"CORRAL_TEST_CAPACITY_URL="+small.url, "CORRAL_TEST_CAPACITY_KEY="+small.key)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err = cmd.Run()
	took := time.Since(start).Round(time.Second)
	if err != nil || testing.Verbose() {
		logLines(t, out.String())
	}
	if ctx.Err() != nil {
		t.Fatalf("the Python suite did not finish in time (killed after %s)", took)
	}
	if err != nil {
		t.Fatalf("python -m unittest: %v (after %s)", err, took)
	}
	for _, skip := range regexp.MustCompile(`(?m)skipped '([^']*)'`).FindAllStringSubmatch(out.String(), -1) {
		if !strings.Contains(skip[1], "code-interpreter template") {
			t.Errorf("a Python test was skipped: %s", skip[0])
		}
	}
	if !regexp.MustCompile(`(?m)^Ran [1-9][0-9]* tests`).Match(out.Bytes()) {
		t.Fatalf("the Python suite ran no test:\n%s", out.String())
	}
	t.Logf("Python suite passed in %s", took)
}

// TestPythonSDKUnit runs the Python SDK's unit tests, which need no
// server (error mapping, the Connect envelope, result parsing, the
// request wire against a local fake, execute_code's bounds), with the
// source tree on the path; it needs neither root nor sandboxes.
func TestPythonSDKUnit(t *testing.T) {
	py := python3(t)
	sdk, err := filepath.Abs(pySDKDir)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-m", "unittest", "discover", "-v", "-s", filepath.Join(sdk, "tests"),
		"-t", filepath.Join(sdk, "tests"), "-p", "test_unit*.py")
	cmd.Dir = sdk
	cmd.Env = pyEnv()
	out, err := cmd.CombinedOutput()
	if err != nil || testing.Verbose() {
		logLines(t, string(out))
	}
	if err != nil {
		t.Fatalf("python -m unittest (unit): %v", err)
	}
	if strings.Contains(string(out), "skipped") {
		t.Fatalf("a Python unit test was skipped:\n%s", out)
	}
}

// python3 returns the machine's python3, or skips the test.
func python3(t *testing.T) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	return py
}

// runPy runs a Python setup command and fails the test with its output.
func runPy(t *testing.T, py string, args ...string) {
	t.Helper()
	cmd := exec.Command(py, args...)
	cmd.Env = pyEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", py, strings.Join(args, " "), err, out)
	}
}

// pyEnv is this process's environment without CORRAL_* and PYTHON*
// settings (a developer's CORRAL_URL must not point the suite elsewhere)
// and without pip's index settings' effects (PIP_NO_INDEX set).
func pyEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "CORRAL_") || strings.HasPrefix(name, "PYTHON") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "PIP_NO_INDEX=1", "PYTHONDONTWRITEBYTECODE=1")
}
