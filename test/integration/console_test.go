package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// uiDir holds the console's browser test, relative to this package.
const uiDir = "../ui"

// playwrightVersion is the playwright-core test/ui/package.json pins.
const playwrightVersion = "1.65.1"

// chromiumPath is Debian's chromium (the Makefile's DEB_PKGS).
const chromiumPath = "/usr/bin/chromium"

// TestConsole drives the operator console (/ui/) in a real browser —
// Debian's chromium through playwright-core (test/ui/console.mjs) —
// against the shared server with real sandboxes, at 1280×800 and at a
// phone's 390×844. It defends against the console showing a team what
// is not its own, against script injection through attacker-controlled
// sandbox data, and against the key leaking out of the tab's session
// storage. The script asserts: sign-in keeps the key in sessionStorage
// only (no cookie, no localStorage, never in an address); the CSP and
// frame headers are set; a sandbox created through the API appears in
// the live list without a reload; XSS payloads in metadata and in a file
// name are shown as text and never run; the sandbox page draws CPU,
// memory, disk and pids charts with their limits and lists its commands
// with exit codes, its processes, its audit story and its files (a file
// downloads with its content); a spent call budget shows as a tripped
// breaker with its reason in the incident view (as does the OOM kill of
// a memory bomb in another sandbox), is reset from there
// (closed in the API) and raised from the task view (raised in the API);
// a sandbox killed from its page is ended; another team's key sees none
// of the sandboxes, the task or the incidents; no page error or CSP
// violation happens. Then this test checks through the API that the
// killed sandbox is ended and no longer listed. Screenshots are written
// to $CORRAL_ARTIFACTS/console (or a temporary directory), printed here.
func TestConsole(t *testing.T) {
	need(t)
	node := uiNode(t)
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Skipf("%s is missing: install Debian's chromium (make deps)", chromiumPath)
	}
	alphaKey, betaKey := teamKey(t, "console-a"), teamKey(t, "console-b")
	shots := artifactsDir(t, "console")
	t.Cleanup(func() { killTeamSandboxes(t, alphaKey) })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "console.mjs")
	cmd.Dir = uiDir
	cmd.Env = append(os.Environ(), "CORRAL_URL="+env.url, "CORRAL_KEY="+alphaKey, "CORRAL_OTHER_KEY="+betaKey,
		"CORRAL_SHOTS="+shots, "CHROMIUM="+chromiumPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	logLines(t, out.String())
	t.Logf("console screenshots: %s", shots)
	if err != nil {
		t.Fatalf("node console.mjs: %v", err)
	}
	var res struct {
		Sandbox    string `json:"sandbox"`
		XSSSandbox string `json:"xss_sandbox"`
		Task       string `json:"task"`
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if js, ok := strings.CutPrefix(line, "RESULT "); ok {
			_ = json.Unmarshal([]byte(js), &res)
		}
	}
	if res.Sandbox == "" {
		t.Fatalf("the script reported no sandbox: %q", out.String())
	}
	// The sandbox killed from the page is ended in the API and gone from
	// the team's live list.
	var sb sandboxJSON
	if code := callAs(t, alphaKey, "GET", "/v1/sandboxes/"+res.Sandbox, &sb); code != http.StatusOK || sb.State != "ended" || sb.EndReason != "killed" {
		t.Fatalf("the sandbox killed in the console: %d %+v", code, sb)
	}
	var list struct{ Sandboxes []sandboxJSON }
	if code := callAs(t, alphaKey, "GET", "/v1/sandboxes", &list); code != http.StatusOK {
		t.Fatalf("list: %d", code)
	}
	for _, s := range list.Sandboxes {
		if s.ID == res.Sandbox {
			t.Fatalf("the killed sandbox is still listed: %+v", s)
		}
	}
	// The other team's key reaches none of it through the API either.
	if code := callAs(t, betaKey, "GET", "/v1/sandboxes/"+res.XSSSandbox, nil); code != http.StatusNotFound {
		t.Fatalf("the other team's key got %d for the sandbox", code)
	}
}

// uiNode returns node, or skips when it or the pinned playwright-core is
// missing (`make ui-deps` installs it).
func uiNode(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the console test needs Node.js 20+")
	}
	data, err := os.ReadFile(filepath.Join(uiDir, "node_modules", "playwright-core", "package.json"))
	if err != nil {
		t.Skip("playwright-core is not installed: run `make ui-deps`")
	}
	var meta struct{ Version string }
	if json.Unmarshal(data, &meta) != nil || meta.Version != playwrightVersion {
		t.Fatalf("test/ui/node_modules/playwright-core is %q, the test pins %s: run `make ui-deps`", meta.Version, playwrightVersion)
	}
	return node
}

// artifactsDir is a directory for a test's artifacts that outlives the
// test: $CORRAL_ARTIFACTS/name when set, else a new temporary directory.
func artifactsDir(t *testing.T, name string) string {
	t.Helper()
	if base := os.Getenv("CORRAL_ARTIFACTS"); base != "" {
		dir := filepath.Join(base, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	dir, err := os.MkdirTemp("", "corral-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// callAs is a GET-style call with another API key; it decodes a JSON
// answer into out (when not nil) and returns the status.
func callAs(t *testing.T, key, method, path string, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, env.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		_ = json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

// killTeamSandboxes kills every running or paused sandbox key's team
// has (what a failed script left behind).
func killTeamSandboxes(t *testing.T, key string) {
	var list struct{ Sandboxes []sandboxJSON }
	if callAs(t, key, "GET", "/v1/sandboxes", &list) != http.StatusOK {
		return
	}
	for _, s := range list.Sandboxes {
		callAs(t, key, "DELETE", "/v1/sandboxes/"+s.ID, nil)
	}
}
