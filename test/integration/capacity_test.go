package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/server"
	corral "github.com/corralhq/corral/sdk/go"
)

// TestCapacityRefusal defends against a create over the admission limit
// being answered as an internal error on some front (the E2B create
// answered 500: it mapped only the Manager's own capacity error, which
// the admission path never returns). With the server's one slot taken,
// every front refuses the next create the same way: the native API and
// the E2B API with 429 and a Retry-After of at least a second (code
// capacity_exceeded in the native body, first in the E2B message), the Go
// SDK with IsCapacityExceeded and RetryAfter, the CLI by printing the
// code and exiting 75, and the unmodified e2b SDK (2.51 and 2.45) by
// raising its RateLimitError. Nothing of it starts a sandbox.
func TestCapacityRefusal(t *testing.T) {
	need(t)
	ctx := context.Background()
	s := startGovServer(t, "capacity", func(c *server.Config) {
		c.Admission = govern.AdmissionConfig{MaxConcurrent: 1}
	})
	newTaskSandbox(t, s.c, corral.CreateOptions{})

	retryAfter := func(t *testing.T, v string) {
		t.Helper()
		if n, err := strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("Retry-After %q on a capacity refusal; want whole seconds >= 1", v)
		}
	}
	t.Run("native", func(t *testing.T) {
		var e apiErr
		status, hdr, body := rest(t, s.url, s.key, "POST", "/v1/sandboxes", map[string]any{}, &e)
		if status != 429 || e.Code != corral.CodeCapacityExceeded {
			t.Fatalf("native create: %d %s; want 429 capacity_exceeded", status, body)
		}
		retryAfter(t, hdr.Get("Retry-After"))
	})
	t.Run("e2b", func(t *testing.T) {
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
			status, hdr, body := rest(t, s.url, s.key, "POST", path, map[string]any{"templateID": "base"}, &e)
			if status != 429 || e.Code != 429 || !strings.HasPrefix(e.Message, corral.CodeCapacityExceeded) {
				t.Fatalf("E2B create %s: %d %s; want 429 with capacity_exceeded", path, status, body)
			}
			retryAfter(t, hdr.Get("Retry-After"))
		}
	})
	t.Run("go sdk", func(t *testing.T) {
		_, err := s.c.Create(ctx, corral.CreateOptions{})
		var ae *corral.APIError
		if !corral.IsCapacityExceeded(err) || !errors.As(err, &ae) || ae.Status != 429 || ae.RetryAfter < time.Second {
			t.Fatalf("SDK create: %#v; want capacity_exceeded with a RetryAfter", err)
		}
	})
	t.Run("cli", func(t *testing.T) {
		for _, argv := range []struct{ path, args []string }{{[]string{"sandbox", "create"}, nil}, {[]string{"run"}, []string{"--", "true"}}} {
			out, errOut, code := corralAt(t, s.url, s.key, argv.path, argv.args...)
			if code != 75 || out != "" || !strings.Contains(errOut, "(capacity_exceeded, retry after ") {
				t.Fatalf("corral %v: exit %d stdout %q stderr %q; want exit 75 and the code on stderr", argv.path, code, out, errOut)
			}
		}
	})
	t.Run("e2b sdk", func(t *testing.T) {
		node := e2bNode(t)
		cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(cctx, node, "--test", "--test-reporter=spec", filepath.Join(e2bDir, "capacity.limited.mjs"))
		cmd.Env = append(e2bEnvFor(s.url, s.key), "E2B_COMPAT_CAPACITY_FULL=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.WaitDelay = 10 * time.Second
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			logLines(t, out.String())
			t.Fatalf("capacity.limited.mjs: %v", err)
		}
	})
	if list, err := s.c.List(ctx, corral.ListOptions{}); err != nil || len(list) != 1 {
		t.Fatalf("running sandboxes after the refusals: %d %v; want the one that holds the slot", len(list), err)
	}
}

// e2bNode returns the node binary for the E2B suite, or skips t when node
// or the pinned e2b packages are missing.
func e2bNode(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the E2B suite needs Node.js 20+")
	}
	for dir, want := range e2bVersions {
		data, err := os.ReadFile(filepath.Join(e2bDir, "node_modules", dir, "package.json"))
		if err != nil {
			t.Skipf("the npm package %s is not installed: run `make e2b-deps`", dir)
		}
		var meta struct {
			Version string `json:"version"`
		}
		if err := json.Unmarshal(data, &meta); err != nil || meta.Version != want {
			t.Fatalf("test/e2b/node_modules/%s is version %q, the suite pins %s: run `make e2b-deps`", dir, meta.Version, want)
		}
	}
	return node
}
