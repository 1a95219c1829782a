package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/corralhq/corral/internal/api"
	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/runtime/runtimetest"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template/registry/registrytest"
)

const mcpTestKey = "e2b_mcp_relay_test_key_0123456789"

// fakeServer is the API over the fake runtime driver (no root): enough
// for the relay, whose calls the API answers as it would with real
// sandboxes (test/integration's TestMCPStdio runs the real thing).
func fakeServer(t *testing.T) *httptest.Server {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.AddAPIKey(context.Background(), "admin", mcpTestKey, "", "admin"); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	gov := govern.New(govern.Config{Log: log}, st)
	reg, _ := registrytest.New(t, st)
	m := sandbox.New(sandbox.Config{
		WatchInterval: 20 * time.Millisecond, KillGrace: time.Millisecond,
		SnapshotDir: filepath.Join(t.TempDir(), "snapshots"), MemoryPressure: func() bool { return false },
		Admission: govern.NewAdmission(govern.AdmissionConfig{MaxConcurrent: 5, MaxPerAgent: 5, AgentRate: 1000, AgentBurst: 1000}),
		Governor:  gov,
	}, st, runtimetest.New(), reg, log)
	if err := m.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.Config{Templates: reg, Governor: gov}, m, st, log))
	t.Cleanup(func() {
		srv.Close()
		m.Shutdown(context.Background(), true)
		st.Close()
	})
	return srv
}

func callText(t *testing.T, s *mcp.ClientSession, name string, args map[string]any) (*mcp.CallToolResult, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: %v", name, err)
	}
	var text string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text += tc.Text + "\n"
		}
	}
	return res, text
}

// TestMCPRelay checks `corral mcp`'s relay: it serves the server's tools,
// relays a call and its result, and when the server has ended the
// session (an idle timeout, a restart) the next call opens a new session
// and says so, instead of failing every call until the client restarts.
func TestMCPRelay(t *testing.T) {
	srv := fakeServer(t)
	hc := &http.Client{Transport: &mcpHeaders{base: http.DefaultTransport, key: mcpTestKey}}
	r := &mcpRelay{endpoint: srv.URL + api.MCPPath, hc: hc, client: mcp.NewClient(&mcp.Implementation{Name: "relay-test", Version: "1"}, nil)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	remote, err := r.connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r.session = remote
	defer r.close()

	local := mcp.NewServer(&mcp.Implementation{Name: "corral", Version: "1"}, nil)
	n := 0
	for tool, err := range remote.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		local.AddTool(tool, r.call)
		n++
	}
	if n != 8 {
		t.Fatalf("relayed %d tools, want 8", n)
	}
	st, ct := mcp.NewInMemoryTransports()
	go func() { _ = local.Run(ctx, st) }()
	c, err := mcp.NewClient(&mcp.Implementation{Name: "desktop", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if res, text := callText(t, c, "run_command", map[string]any{"command": "echo relayed"}); res.IsError || !strings.Contains(text, `"stdout": "relayed\n"`) {
		t.Fatalf("relayed call: %v %s", res.IsError, text)
	}

	// The server ends the session (as its idle timeout would).
	req, _ := http.NewRequest(http.MethodDelete, srv.URL+"/mcp", nil)
	req.Header.Set("Mcp-Session-Id", remote.ID())
	req.Header.Set("Mcp-Protocol-Version", remote.InitializeResult().ProtocolVersion)
	resp, err := hc.Do(req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("end the session on the server: %v %v", err, resp)
	}
	resp.Body.Close()
	res, text := callText(t, c, "run_command", map[string]any{"command": "echo again"})
	if res.IsError || !strings.Contains(text, "this call ran in a new session") || !strings.Contains(text, `"stdout": "again\n"`) {
		t.Fatalf("call after the server ended the session: %v %s", res.IsError, text)
	}
	if r.session == remote {
		t.Error("the relay kept the ended session")
	}
}
