package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/server"
	corral "github.com/corralhq/corral/sdk/go"
)

// e2bSign is envd's v1 URL signature (the SDK's getSignature).
func e2bSign(path, op, user, token, exp string) string {
	msg := path + ":" + op + ":" + user + ":" + token
	if exp != "" {
		msg += ":" + exp
	}
	sum := sha256.Sum256([]byte(msg))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}

// e2bCreateSandbox creates a sandbox through the E2B API and returns its
// id and envd access token; the sandbox is killed when t ends.
func e2bCreateSandbox(t *testing.T) (id, token string) {
	t.Helper()
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	status, _, body := rest(t, env.url, env.key, "POST", "/sandboxes", map[string]any{"templateID": "base", "timeout": 300}, &sb)
	if status != 201 || sb.SandboxID == "" || sb.EnvdAccessToken == "" {
		t.Fatalf("E2B create: %d %s", status, body)
	}
	t.Cleanup(func() { rest(t, env.url, env.key, "DELETE", "/sandboxes/"+sb.SandboxID, nil, nil) })
	return sb.SandboxID, sb.EnvdAccessToken
}

// TestSignedURLRefusalsAlike: a signed /files URL that names no sandbox
// reaches the sandbox whose token made the signature, and every URL that
// is not such a signature gets one and the same answer, so a caller
// learns nothing from the refusal about which sandboxes exist: a
// signature made with a wrong token, made with the token of a sandbox
// that no longer exists, made for another path, a well-formed random one
// and malformed ones (refused before any hashing) are all 401 with the
// same body.
func TestSignedURLRefusalsAlike(t *testing.T) {
	need(t)
	id, token := e2bCreateSandbox(t)
	gone, goneToken := e2bCreateSandbox(t)
	if status, _, body := rest(t, env.url, env.key, "DELETE", "/sandboxes/"+gone, nil, nil); status != 204 {
		t.Fatalf("kill: %d %s", status, body)
	}
	if status, r := restExec(t, env.url, env.key, id, "echo signed > /tmp/signed.txt"); status != 200 || r.ExitCode != 0 {
		t.Fatalf("write the file: %d %+v", status, r)
	}
	const path = "/tmp/signed.txt"
	get := func(sig, exp string) (int, string) {
		q := url.Values{"path": {path}, "username": {"user"}, "signature": {sig}}
		if exp != "" {
			q.Set("signature_expiration", exp)
		}
		resp, err := http.Get(env.url + "/files?" + q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	exp := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	if code, body := get(e2bSign(path, "read", "user", token, exp), exp); code != 200 || body != "signed\n" {
		t.Fatalf("a valid signature: %d %q", code, body)
	}
	wantCode, want := get(e2bSign(path, "read", "user", "not-the-token", exp), exp)
	if wantCode != 401 || !strings.Contains(want, "invalid signature") {
		t.Fatalf("a wrong token's signature: %d %q; want 401 invalid signature", wantCode, want)
	}
	random := e2bSign("x", "y", "z", "w", "")
	for _, tc := range []struct{ name, sig, exp string }{
		{"a gone sandbox's token", e2bSign(path, "read", "user", goneToken, exp), exp},
		{"another path", e2bSign("/etc/passwd", "read", "user", token, exp), exp},
		{"a write signature for a read", e2bSign(path, "write", "user", token, exp), exp},
		{"random", random, ""},
		{"too short", "v1_abc", ""},
		{"wrong version", "v2_" + random[3:], ""},
		{"far too long", "v1_" + strings.Repeat("A", 4096), ""},
		{"expiry not a number", e2bSign(path, "read", "user", token, "12ab"), "12ab"},
	} {
		if code, body := get(tc.sig, tc.exp); code != wantCode || body != want {
			t.Errorf("%s: %d %q; want the same answer as a wrong signature, %d %q", tc.name, code, body, wantCode, want)
		}
	}
}

// TestStreamLimitPerKey defends against one API key holding an unbounded
// number of streams open on the server (there was no bound): with
// --max-streams-per-key 2 and two long exec calls open, a third call is
// refused with 429 too_many_streams and a Retry-After (an exec through
// REST, a command through the Go SDK), and an exec runs once the caller
// of one of the two has gone away.
func TestStreamLimitPerKey(t *testing.T) {
	need(t)
	ctx := context.Background()
	s := startGovServer(t, "streams", func(c *server.Config) { c.MaxStreamsPerKey = 2 })
	sb := newTaskSandbox(t, s.c, corral.CreateOptions{})
	var wg sync.WaitGroup
	first, cancelFirst := context.WithCancel(ctx)
	defer cancelFirst()
	held, cancelHeld := context.WithCancel(ctx)
	for i, c := range []context.Context{first, held} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := strings.NewReader(`{"command":"sleep 3600; echo ` + strconv.Itoa(i) + `","timeout":3600}`)
			req, _ := http.NewRequestWithContext(c, "POST", s.url+"/v1/sandboxes/"+sb.ID+"/exec", body)
			req.Header.Set("X-API-Key", s.key)
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if c.Err() == nil {
					t.Errorf("a held exec answered: %d %s", resp.StatusCode, b)
				}
			}
		}()
	}
	t.Cleanup(func() {
		cancelHeld()
		wg.Wait()
	})
	running := func() int {
		var list struct {
			Commands []struct {
				EndedAt *string `json:"ended_at"`
			} `json:"commands"`
		}
		rest(t, s.url, s.key, "GET", "/v1/sandboxes/"+sb.ID+"/commands", nil, &list)
		n := 0
		for _, c := range list.Commands {
			if c.EndedAt == nil {
				n++
			}
		}
		return n
	}
	waitFor(t, "two commands running", time.Minute, func() bool { return running() == 2 })
	var e apiErr
	status, hdr, body := rest(t, s.url, s.key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"command": "echo third"}, &e)
	if status != 429 || e.Code != "too_many_streams" || hdr.Get("Retry-After") != "1" {
		t.Fatalf("a third stream: %d %s (Retry-After %q); want 429 too_many_streams", status, body, hdr.Get("Retry-After"))
	}
	_, err := sb.Run(ctx, "echo sdk", corral.RunOptions{Timeout: time.Minute})
	var ae *corral.APIError
	if !errors.As(err, &ae) || ae.Code != corral.CodeTooManyStreams || ae.RetryAfter != time.Second {
		t.Fatalf("SDK command over the limit: %#v; want too_many_streams with a RetryAfter", err)
	}
	// The caller of one exec goes away: its stream closes (and its
	// command is killed).
	cancelFirst()
	// A refused exec reaches no handler (nor the task's loop detector).
	waitFor(t, "an exec admitted after a stream closed", time.Minute, func() bool {
		status, r := restExec(t, s.url, s.key, sb.ID, "echo in")
		if status != 200 && (status != 429 || r.Code != "too_many_streams") {
			t.Fatalf("an exec after a stream closed: %d %+v", status, r)
		}
		return status == 200 && r.Stdout == "in\n"
	})
	if n := running(); n != 1 {
		t.Fatalf("%d commands running; want the one still held", n)
	}

	// envd traffic counts per sandbox, whatever API key is held: two
	// command streams of the E2B SDK's shape fill this sandbox's share.
	var info struct {
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if status, _, body := rest(t, s.url, s.key, "GET", "/sandboxes/"+sb.ID, nil, &info); status != 200 || info.EnvdAccessToken == "" {
		t.Fatalf("E2B get: %d %s", status, body)
	}
	envdStart := func(c context.Context) (*http.Response, error) {
		msg := []byte(`{"process":{"cmd":"/bin/sh","args":["-c","sleep 3600"]}}`)
		frame := append([]byte{0, byte(len(msg) >> 24), byte(len(msg) >> 16), byte(len(msg) >> 8), byte(len(msg))}, msg...)
		req, _ := http.NewRequestWithContext(c, "POST", s.url+"/process.Process/Start", bytes.NewReader(frame))
		req.Header.Set("E2b-Sandbox-Id", sb.ID)
		req.Header.Set("E2b-Sandbox-Port", "49983")
		req.Header.Set("X-Access-Token", info.EnvdAccessToken)
		req.Header.Set("Authorization", "Basic dXNlcjo=") // user "user"
		req.Header.Set("Content-Type", "application/connect+json")
		req.Header.Set("Connect-Protocol-Version", "1")
		return http.DefaultClient.Do(req)
	}
	envdCtx, cancelEnvd := context.WithCancel(ctx)
	defer cancelEnvd()
	for range 2 {
		resp, err := envdStart(envdCtx)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("an envd command stream: %v %v", resp, err)
		}
		defer resp.Body.Close()
	}
	resp, err := envdStart(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 429 || !strings.Contains(string(b), `"code":429`) || !strings.Contains(string(b), "too_many_streams") || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("a third envd stream of the sandbox: %d %s (Retry-After %q); want 429 too_many_streams", resp.StatusCode, b, resp.Header.Get("Retry-After"))
	}
}
