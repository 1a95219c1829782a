package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// corralCLI runs the corral binary against the test server and returns
// stdout, stderr and the exit code.
func corralCLI(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	return cliAs(t, env.url, env.key, stdin, args...)
}

// cliAs runs the corral binary against the server at url with API key
// key and stdin, and returns stdout, stderr and the exit code: the one
// way the tests run the CLI.
func cliAs(t *testing.T, url, key, stdin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(env.bin, args...)
	cmd.Env = append(os.Environ(), "CORRAL_URL="+url, "CORRAL_API_KEY="+key)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// TestCLIRun: the one-shot prints the command's output, exits with its
// code (124 on timeout, 137 with the reason when killed) and leaves no
// sandbox running.
func TestCLIRun(t *testing.T) {
	need(t)
	before := countRunning(t)
	tests := []struct {
		name       string
		args       []string
		wantOut    string
		wantErrSub string
		wantCode   int
	}{
		{"python prints", []string{"run", "--", "python3", "-c", "print(1)"}, "1\n", "", 0},
		{"exit code", []string{"run", "--", "sh", "-c", "echo out; echo err >&2; exit 3"}, "out\n", "err\n", 3},
		{"timeout", []string{"run", "--timeout", "1s", "--", "sleep", "30"}, "", "timeout", 124},
		{"oom", []string{"run", "--memory", "64m", "--", "python3", "-c", "a=[]\nwhile True: a.append(bytearray(1<<20))"}, "", "oom", 137},
		{"nproc below pids", []string{"run", "--pids", "100", "--", "bash", "-c", "ulimit -u"}, "68\n", "", 0},
		{"gvisor", []string{"run", "--runtime", "gvisor", "--", "sh", "-c", "uname -r | grep -c gvisor"}, "1\n", "", 0},
		{"bad flag", []string{"run", "--memory", "lots", "--", "true"}, "", "", 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := corralCLI(t, "", tc.args...)
			if code != tc.wantCode || out != tc.wantOut || !strings.Contains(errOut, tc.wantErrSub) {
				t.Fatalf("corral %v: exit %d stdout %q stderr %q; want %d %q %q", tc.args, code, out, errOut, tc.wantCode, tc.wantOut, tc.wantErrSub)
			}
		})
	}
	if n := countRunning(t); n != before {
		t.Fatalf("corral run left sandboxes running: %d before, %d after", before, n)
	}
}

// TestCLISandbox: create, ls, exec, cp both ways, kill.
func TestCLISandbox(t *testing.T) {
	need(t)
	out, errOut, code := corralCLI(t, "", "sandbox", "create", "--json", "--ttl", "5m")
	var sb sandboxJSON
	if code != 0 || json.Unmarshal([]byte(out), &sb) != nil || sb.ID == "" {
		t.Fatalf("create: %d %q %q", code, out, errOut)
	}
	t.Cleanup(func() { call(t, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil) })
	out, _, _ = corralCLI(t, "", "sandbox", "ls", "--json")
	var list []sandboxJSON
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("ls --json: %q %v", out, err)
	}
	found := false
	for _, s := range list {
		found = found || s.ID == sb.ID && s.State == "running" && s.Template == "base"
	}
	if !found {
		t.Fatalf("ls --json does not list %s: %s", sb.ID, out)
	}
	if _, _, code := corralCLI(t, "", "sandbox", "exec", sb.ID, "--", "sh", "-c", "exit 5"); code != 5 {
		t.Fatalf("exec exit code %d, want 5", code)
	}
	local := filepath.Join(t.TempDir(), "up.txt")
	os.WriteFile(local, []byte("payload\n"), 0o644)
	if _, e, code := corralCLI(t, "", "sandbox", "cp", local, sb.ID+":/tmp/up.txt"); code != 0 {
		t.Fatalf("cp up: %d %s", code, e)
	}
	if out, _, _ := corralCLI(t, "", "sandbox", "exec", sb.ID, "--", "cat", "/tmp/up.txt"); out != "payload\n" {
		t.Fatalf("uploaded file reads %q", out)
	}
	down := filepath.Join(t.TempDir(), "down.txt")
	if _, e, code := corralCLI(t, "", "sandbox", "cp", sb.ID+":/tmp/up.txt", down); code != 0 {
		t.Fatalf("cp down: %d %s", code, e)
	}
	if b, _ := os.ReadFile(down); string(b) != "payload\n" {
		t.Fatalf("downloaded %q", b)
	}
	if _, e, code := corralCLI(t, "", "sandbox", "kill", sb.ID); code != 0 {
		t.Fatalf("kill: %d %s", code, e)
	}
	if _, _, code := corralCLI(t, "", "sandbox", "exec", sb.ID, "--", "true"); code == 0 {
		t.Fatal("exec into a killed sandbox succeeded")
	}
}

// TestCLIPauseResume: corral sandbox pause / resume.
func TestCLIPauseResume(t *testing.T) {
	need(t)
	id := create(t, nil)
	if _, e, code := corralCLI(t, "", "sandbox", "pause", id); code != 0 {
		t.Fatalf("pause: %d %s", code, e)
	}
	var sb sandboxJSON
	call(t, "GET", "/v1/sandboxes/"+id, nil, &sb)
	if sb.State != "paused" {
		t.Fatalf("state after pause: %q", sb.State)
	}
	if _, _, code := corralCLI(t, "", "sandbox", "pause", id); code == 0 {
		t.Fatal("second pause succeeded")
	}
	if _, e, code := corralCLI(t, "", "sandbox", "resume", "--ttl", "2m", id); code != 0 {
		t.Fatalf("resume: %d %s", code, e)
	}
	if out, _, code := corralCLI(t, "", "sandbox", "exec", id, "--", "echo", "back"); code != 0 || out != "back\n" {
		t.Fatalf("exec after resume: %d %q", code, out)
	}
}

// TestCLISecretAllowHTTP: `corral secret set --allow-http` marks a secret
// as injectable into plain HTTP (shown by set and ls); setting it again
// without the flag turns that off, so a replaced secret never keeps a
// weaker transport by accident.
func TestCLISecretAllowHTTP(t *testing.T) {
	need(t)
	const name = "cli_allow_http"
	t.Cleanup(func() { corralCLI(t, "", "secret", "rm", name) })
	allowHTTP := func() bool {
		t.Helper()
		out, errOut, code := corralCLI(t, "", "secret", "ls", "--json")
		var list []struct {
			Name      string `json:"name"`
			AllowHTTP bool   `json:"allow_http"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &list) != nil {
			t.Fatalf("secret ls --json: %d %q %q", code, out, errOut)
		}
		for _, s := range list {
			if s.Name == name {
				return s.AllowHTTP
			}
		}
		t.Fatalf("secret ls --json does not list %s: %s", name, out)
		return false
	}
	for _, tc := range []struct {
		flags []string
		want  bool
		says  string
	}{
		{[]string{"--allow-http"}, true, "over TLS and plain HTTP"},
		{nil, false, "over TLS only"},
	} {
		args := append([]string{"secret", "set", name, "--hosts", "api.example.test", "--header", "Authorization", "--value-file", "-"}, tc.flags...)
		out, errOut, code := corralCLI(t, "Bearer cli-secret-value-0123456789\n", args...)
		if code != 0 || !strings.Contains(out, tc.says) || strings.Contains(out+errOut, "cli-secret-value") {
			t.Fatalf("corral %v: exit %d stdout %q stderr %q; want %q and never the value", args, code, out, errOut, tc.says)
		}
		if got := allowHTTP(); got != tc.want {
			t.Fatalf("after corral %v: allow_http %v, want %v", args, got, tc.want)
		}
	}
}
