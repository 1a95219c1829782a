// Package integration runs corral end to end on this host: a real server
// (in-process), real runc and runsc sandboxes from the real base template,
// real cgroups and namespaces. Tests need root, runc and debootstrap (or a
// cached base template); without them they skip and say why.
package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/runtime/oci"
	"github.com/corralhq/corral/internal/server"
	"github.com/corralhq/corral/test/testserver"
)

// env is the shared server of the integration tests.
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
		env.skip = "integration tests " + reason
		return m.Run()
	}
	level := slog.LevelWarn
	if os.Getenv("CORRAL_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	ts, err := testserver.Start("../../cmd/corral", level)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env.bin, env.dataDir, env.srv, env.url, env.key = ts.Bin, ts.DataDir, ts.Srv, ts.URL, ts.Key
	code := m.Run()
	// Every test deletes the volumes it made; one left means a test leaks
	// (the server keeps volumes mounted, by design).
	if vs, err := ts.Srv.Volumes.List(context.Background(), ""); err != nil || len(vs) > 0 {
		for _, v := range vs {
			fmt.Fprintf(os.Stderr, "volume %s (%s) left behind by a test\n", v.Name, v.ID)
		}
		if code == 0 {
			code = 1
		}
	}
	if err := ts.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "close server:", err)
		code = 1
	}
	return code
}

func need(t *testing.T) {
	t.Helper()
	if env.skip != "" {
		t.Skip(env.skip)
	}
}

// call makes a REST request and decodes a JSON response into out.
func call(t *testing.T, method, path string, body any, out any) int {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, env.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", env.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: decode %q: %v", method, path, data, err)
		}
	}
	return resp.StatusCode
}

// sandboxJSON is the API's sandbox object.
type sandboxJSON struct {
	ID        string            `json:"id"`
	State     string            `json:"state"`
	Template  string            `json:"template"`
	Runtime   string            `json:"runtime"`
	EndReason string            `json:"end_reason"`
	Metadata  map[string]string `json:"metadata"`
	ExpiresAt string            `json:"expires_at"`
	Resources struct {
		CPU      float64 `json:"cpu"`
		MemoryMB int64   `json:"memory_mb"`
		DiskMB   int64   `json:"disk_mb"`
		Pids     int64   `json:"pids"`
	} `json:"resources"`
	Volumes []struct {
		ID, Name, Path string
	} `json:"volumes"`
}

type execResult struct {
	ExitCode    int    `json:"exit_code"`
	Stdout      string `json:"stdout"`
	Stderr      string `json:"stderr"`
	StdoutBytes int64  `json:"stdout_bytes"`
	StderrBytes int64  `json:"stderr_bytes"`
	Truncated   bool   `json:"truncated"`
	TimedOut    bool   `json:"timed_out"`
	EndReason   string `json:"end_reason"`
}

type apiErr struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// create starts a sandbox and registers its kill for cleanup.
func create(t *testing.T, body map[string]any) string {
	t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	var sb sandboxJSON
	var e apiErr
	data, _ := json.Marshal(body)
	if code := call(t, "POST", "/v1/sandboxes", data, &sb); code != http.StatusCreated {
		_ = json.Unmarshal(data, &e)
		t.Fatalf("create %s: status %d %+v", data, code, sb)
	}
	t.Cleanup(func() { call(t, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil) })
	return sb.ID
}

// sh runs a shell command in the sandbox and returns the result.
func sh(t *testing.T, id, command string, opts ...map[string]any) execResult {
	t.Helper()
	body := map[string]any{"command": command}
	for _, o := range opts {
		for k, v := range o {
			body[k] = v
		}
	}
	var res execResult
	var raw json.RawMessage
	code := call(t, "POST", "/v1/sandboxes/"+id+"/exec", body, &raw)
	if code != http.StatusOK {
		t.Fatalf("exec %q: status %d: %s", command, code, raw)
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	return res
}

// mustSh runs command and fails the test unless it exits 0.
func mustSh(t *testing.T, id, command string, opts ...map[string]any) string {
	t.Helper()
	res := sh(t, id, command, opts...)
	if res.ExitCode != 0 {
		t.Fatalf("%q: exit %d, stdout %q, stderr %q", command, res.ExitCode, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

// waitFor polls cond until it holds or the (generous) limit passes. It
// waits for an event; it does not assert how fast the event comes.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s after %s", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runcRoot is runc's --root for the sandboxes of a data dir.
func runcRoot(dataDir string) string {
	return oci.RuntimeRoot(filepath.Join(dataDir, "sandboxes"), runtime.Runc)
}
