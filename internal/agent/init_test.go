package agent

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/corralhq/corral/proto/agentproto"
	pb "github.com/corralhq/corral/proto/process"
)

const (
	testBootstrap = "bootstrap-0123456789"
	testSandboxTk = "sandbox-token-abcdef"
)

func tokenHeader(tok string) http.Header {
	return http.Header{agentproto.AccessTokenHeader: {tok}, "Content-Type": {"application/json"}}
}

func (e *testEnv) listWith(tok string) error {
	req := connect.NewRequest(&pb.ListRequest{})
	req.Header().Set(agentproto.AccessTokenHeader, tok)
	_, err := e.proc.List(context.Background(), req)
	return err
}

// TestInitBootstrap: a warm agent (a Kubernetes Pod started before its
// sandbox is known) whose bootstrap token anyone who reads the Pod spec
// knows. The token must open nothing but the one POST /init; /init is
// accepted once (a second caller cannot take over the sandbox and swap
// its token), and after it the bootstrap token opens nothing.
func TestInitBootstrap(t *testing.T) {
	caRoot := t.TempDir()
	e := newTestEnv(t, func(c *Config) { c.BootstrapToken = testBootstrap; c.CARoot = caRoot })
	init := func(tok, body string) int {
		resp, _ := e.do(t, http.MethodPost, agentproto.InitPath, tokenHeader(tok), strings.NewReader(body))
		return resp.StatusCode
	}
	const cert = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
	const key = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
	good := `{"accessToken":"` + testSandboxTk + `","envVars":{"FOO":"bar"},"trustCA":` + strconv.Quote(cert) + `}`

	// Waiting: the bootstrap token runs no command and reads no file.
	if err := e.listWith(testBootstrap); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("process.List with the bootstrap token before init: %v, want unauthenticated", err)
	}
	if resp, _ := e.do(t, http.MethodGet, "/files?path=/etc/passwd", tokenHeader(testBootstrap), nil); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /files with the bootstrap token: %d, want 401", resp.StatusCode)
	}
	if resp, _ := e.do(t, http.MethodGet, "/health", nil, nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("GET /health while waiting: %d", resp.StatusCode)
	}
	// Refused inits change nothing.
	for _, tc := range []struct {
		name, tok, body string
		want            int
	}{
		{"wrong token", "not-the-bootstrap-token", good, http.StatusUnauthorized},
		{"no token", "", good, http.StatusUnauthorized},
		{"short access token", testBootstrap, `{"accessToken":"short"}`, http.StatusBadRequest},
		{"access token = bootstrap", testBootstrap, `{"accessToken":"` + testBootstrap + `"}`, http.StatusBadRequest},
		{"bad env name", testBootstrap, `{"accessToken":"` + testSandboxTk + `","envVars":{"A=B":"x"}}`, http.StatusBadRequest},
		{"unknown field", testBootstrap, `{"accessToken":"` + testSandboxTk + `","x":1}`, http.StatusBadRequest},
		// The egress CA's key must never land in the sandbox's files.
		{"trustCA with a key", testBootstrap, `{"accessToken":"` + testSandboxTk + `","trustCA":` + strconv.Quote(cert+key) + `}`, http.StatusBadRequest},
		{"trustCA not PEM", testBootstrap, `{"accessToken":"` + testSandboxTk + `","trustCA":"not a certificate"}`, http.StatusBadRequest},
	} {
		if got := init(tc.tok, tc.body); got != tc.want {
			t.Errorf("%s: init answered %d, want %d", tc.name, got, tc.want)
		}
		if !e.srv.waiting() {
			t.Fatalf("%s: a refused init ended the wait", tc.name)
		}
		if left, _ := os.ReadDir(caRoot); len(left) != 0 {
			t.Fatalf("%s: a refused init wrote %v", tc.name, left)
		}
	}
	if got := init(testBootstrap, good); got != http.StatusNoContent {
		t.Fatalf("init: %d, want 204", got)
	}
	if b, err := os.ReadFile(filepath.Join(caRoot, agentproto.CAFile)); err != nil || string(b) != cert {
		t.Fatalf("the trustCA at %s: %q, %v", agentproto.CAFile, b, err)
	}
	if b, err := os.ReadFile(filepath.Join(caRoot, agentproto.CABundle)); err != nil || !strings.Contains(string(b), cert) {
		t.Fatalf("the trustCA in %s: %q, %v", agentproto.CABundle, b, err)
	}
	// Now the sandbox token opens the agent and the bootstrap token nothing.
	if err := e.listWith(testSandboxTk); err != nil {
		t.Fatalf("process.List with the sandbox token: %v", err)
	}
	if err := e.listWith(testBootstrap); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("process.List with the bootstrap token after init: %v, want unauthenticated", err)
	}
	req := startReq("/bin/sh", "-c", "echo $FOO")
	req.Header().Set(agentproto.AccessTokenHeader, testSandboxTk)
	if got := strings.TrimSpace(string(e.run(t, context.Background(), req).stdout)); got != "bar" {
		t.Fatalf("envVars from init: FOO=%q", got)
	}
	// Once only, whoever asks.
	for _, tok := range []string{testBootstrap, testSandboxTk} {
		if got := init(tok, `{"accessToken":"another-token-0123456"}`); got != http.StatusConflict {
			t.Fatalf("a second init (token %s): %d, want 409", tok, got)
		}
	}
	if err := e.listWith(testSandboxTk); err != nil {
		t.Fatalf("after a refused second init the sandbox token: %v", err)
	}
}

// TestListenTCPNeedsToken: an agent on TCP (a Pod IP anyone in the
// cluster network may reach) with no token would run anyone's commands;
// it refuses to start.
func TestListenTCPNeedsToken(t *testing.T) {
	if _, err := listenTCP(Config{Listen: "127.0.0.1:0"}); err == nil || !strings.Contains(err.Error(), "without an access token") {
		t.Fatalf("listenTCP without a token: %v", err)
	}
	ln, err := listenTCP(Config{Listen: "127.0.0.1:0", BootstrapToken: testBootstrap})
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
}
