package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/idgen"
	corral "github.com/corralhq/corral/sdk/go"
)

// teamKey makes a member key of team with `corral key create` (the
// suite's admin key) and returns it; the key is revoked at the end.
func teamKey(t *testing.T, team string) string {
	t.Helper()
	out, errOut, code := corralCLI(t, "", "key", "create", "--team", team, "--role", "member", "--name", "test-"+team, "--json")
	var k struct{ Key, ID string }
	if code != 0 || json.Unmarshal([]byte(out), &k) != nil || !strings.HasPrefix(k.Key, "e2b_") || len(k.Key) != 44 {
		t.Fatalf("corral key create: exit %d %q %q", code, out, errOut)
	}
	t.Cleanup(func() { corralCLI(t, "", "key", "revoke", k.ID) })
	return k.Key
}

// corralCLIAs is corralCLI with another API key.
func corralCLIAs(t *testing.T, key string, args ...string) (string, string, int) {
	t.Helper()
	return cliAs(t, env.url, key, "", args...)
}

// TestTeamsEndToEnd defends against one team's agents reaching another
// team's sandboxes, end to end with real sandboxes: team alpha's
// sandbox is not found — and not listed — for team beta through the
// native API (Go SDK), the CLI and the unmodified e2b SDK, while alpha's
// own key reaches it; a sandbox beta makes is beta's; the audit log
// records who did what, with key ids and teams.
func TestTeamsEndToEnd(t *testing.T) {
	need(t)
	ctx := context.Background()
	alphaKey, betaKey := teamKey(t, "alpha"), teamKey(t, "beta")
	alpha, beta := corral.New(env.url, alphaKey), corral.New(env.url, betaKey)
	sb, err := alpha.Create(ctx, corral.CreateOptions{Metadata: map[string]string{"test": "teams"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = alpha.Kill(context.Background(), sb.ID) })
	if sb.Team != "alpha" {
		t.Fatalf("alpha's sandbox has team %q", sb.Team)
	}
	marker := "/tmp/alpha-secret-" + idgen.Hex(4)
	if res, err := sb.Exec(ctx, corral.ExecRequest{Command: "echo mine > " + marker + " && cat " + marker}); err != nil || strings.TrimSpace(res.Stdout) != "mine" {
		t.Fatalf("alpha's exec: %v %+v", err, res)
	}

	t.Run("go sdk", func(t *testing.T) {
		if _, err := beta.Get(ctx, sb.ID); !corral.IsNotFound(err) {
			t.Errorf("beta's Get of alpha's sandbox: %v; want not_found", err)
		}
		if _, err := beta.Exec(ctx, sb.ID, corral.ExecRequest{Command: "cat " + marker}); !corral.IsNotFound(err) {
			t.Errorf("beta's Exec in alpha's sandbox: %v; want not_found", err)
		}
		if _, err := beta.Kill(ctx, sb.ID); !corral.IsNotFound(err) {
			t.Errorf("beta's Kill of alpha's sandbox: %v; want not_found", err)
		}
		list, err := beta.List(ctx, corral.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list {
			if s.ID == sb.ID || s.Team != "beta" {
				t.Errorf("beta's list holds %s of team %q", s.ID, s.Team)
			}
		}
	})

	t.Run("cli", func(t *testing.T) {
		out, _, code := corralCLIAs(t, betaKey, "sandbox", "ls")
		if code != 0 || strings.Contains(out, sb.ID) {
			t.Errorf("beta's corral sandbox ls: exit %d, lists alpha's sandbox: %v\n%s", code, strings.Contains(out, sb.ID), out)
		}
		for _, args := range [][]string{{"sandbox", "get", sb.ID}, {"sandbox", "exec", sb.ID, "--", "cat", marker}, {"sandbox", "kill", sb.ID}} {
			out, errOut, code := corralCLIAs(t, betaKey, args...)
			if code == 0 || !strings.Contains(errOut, "not found") || strings.Contains(out, "mine") {
				t.Errorf("beta's corral %s: exit %d, stdout %q, stderr %q; want a not-found failure", strings.Join(args, " "), code, out, errOut)
			}
		}
		if out, _, code := corralCLIAs(t, alphaKey, "sandbox", "exec", sb.ID, "--", "cat", marker); code != 0 || strings.TrimSpace(out) != "mine" {
			t.Errorf("alpha's corral exec: exit %d %q", code, out)
		}
	})

	t.Run("e2b sdk", func(t *testing.T) {
		node := e2bNode(t)
		cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(cctx, node, "--test", "--test-reporter=spec", filepath.Join(e2bDir, "teams.limited.mjs"))
		cmd.Env = append(e2bEnvFor(env.url, betaKey), "E2B_COMPAT_ALPHA_SANDBOX="+sb.ID, "E2B_COMPAT_ALPHA_KEY="+alphaKey)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.WaitDelay = 10 * time.Second
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			logLines(t, out.String())
			t.Fatalf("teams.limited.mjs: %v", err)
		}
	})

	// Still alive, still alpha's, and the file beta tried to read is
	// untouched.
	if res, err := sb.Exec(ctx, corral.ExecRequest{Command: "cat " + marker}); err != nil || strings.TrimSpace(res.Stdout) != "mine" {
		t.Fatalf("alpha's sandbox after beta's attempts: %v %+v", err, res)
	}
	evs, err := alpha.Audit(ctx, corral.AuditQuery{Sandbox: sb.ID, Kind: "command"})
	if err != nil || len(evs) == 0 {
		t.Fatalf("alpha's command events: %d %v", len(evs), err)
	}
	sum := sha256.Sum256([]byte(alphaKey))
	alphaKeyID := hex.EncodeToString(sum[:])[:16]
	byKey := 0
	for _, ev := range evs {
		if ev.Team != "alpha" {
			t.Errorf("event %d of alpha's sandbox has team %q", ev.ID, ev.Team)
		}
		// Commands through envd (the e2b SDK) are made with the sandbox's
		// access token, not a key: they name no key.
		if ev.KeyID == alphaKeyID {
			byKey++
		} else if ev.KeyID != "" {
			t.Errorf("event %d (%s %s) was caused by key %q, not alpha's %s", ev.ID, ev.Kind, ev.Data, ev.KeyID, alphaKeyID)
		}
	}
	if byKey < 3 { // the Go SDK's two and the CLI's
		t.Errorf("%d command events name alpha's key; want at least 3", byKey)
	}
	if other, err := beta.Audit(ctx, corral.AuditQuery{Sandbox: sb.ID}); err != nil || len(other) != 0 {
		t.Errorf("beta reads %d events of alpha's sandbox (%v)", len(other), err)
	}

	// Revoked: beta's next request fails, alpha's keeps working.
	keys, err := corral.New(env.url, env.key).ListKeys(ctx, "beta")
	if err != nil || len(keys) == 0 {
		t.Fatalf("beta's keys: %v %v", keys, err)
	}
	for _, k := range keys {
		if _, errOut, code := corralCLI(t, "", "key", "revoke", k.ID); code != 0 {
			t.Fatalf("corral key revoke %s: exit %d %s", k.ID, code, errOut)
		}
	}
	if _, err := beta.List(ctx, corral.ListOptions{}); !corral.IsUnauthenticated(err) {
		t.Errorf("a revoked key's next request: %v; want unauthenticated", err)
	}
	if _, err := alpha.Get(ctx, sb.ID); err != nil {
		t.Errorf("alpha after beta's revocation: %v", err)
	}
}
