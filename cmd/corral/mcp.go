package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/corralhq/corral/internal/api"
)

func newMCPCmd(g *clientGlobals) *cobra.Command {
	var task string
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve corral's MCP tools on stdin/stdout for a desktop MCP client",
		Long: `corral mcp is an MCP server on stdin/stdout (the stdio transport) for
desktop MCP clients. It is a client of a corral server: it opens one MCP
session on the server's /mcp endpoint (CORRAL_URL, CORRAL_API_KEY, as the
other client commands) and relays the server's tools (create_sandbox,
run_code, run_command, read_file, write_file, list_files, kill_sandbox,
snapshot_sandbox) and their results. The session's sandbox is killed when
stdin closes. Calls count against the session's task: a new one, or the
one --task (env CORRAL_TASK) names. See docs/mcp.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			server, key, roots, err := g.endpoint()
			if err != nil {
				return err
			}
			ctx, cancel := signalContext(cmd)
			defer cancel()
			rt := http.DefaultTransport.(*http.Transport).Clone()
			if roots != nil {
				rt.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
			}
			hc := &http.Client{Transport: &mcpHeaders{base: rt, key: key, task: firstNonEmpty(task, os.Getenv("CORRAL_TASK"))}}
			return serveMCPStdio(ctx, strings.TrimRight(server, "/")+api.MCPPath, hc, &mcp.StdioTransport{})
		},
	}
	cmd.Flags().StringVar(&task, "task", "", "task the session's calls count against (env CORRAL_TASK; default: a new task, ended with the session)")
	return cmd
}

// mcpHeaders adds the API key and the task to every request to /mcp.
type mcpHeaders struct {
	base      http.RoundTripper
	key, task string
}

func (t *mcpHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.key)
	if t.task != "" {
		r.Header.Set(api.MCPTaskHeader, t.task)
	}
	r.Header.Set("User-Agent", "corral-mcp")
	return t.base.RoundTrip(r)
}

// mcpRelay is the remote session of a stdio MCP server: one session on
// the corral server's /mcp, opened again if the server has closed it
// (a restart, or the session's idle timeout).
type mcpRelay struct {
	endpoint string
	hc       *http.Client
	client   *mcp.Client

	mu      sync.Mutex
	session *mcp.ClientSession
}

func (r *mcpRelay) connect(ctx context.Context) (*mcp.ClientSession, error) {
	s, err := r.client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: r.endpoint, HTTPClient: r.hc, DisableStandaloneSSE: true, MaxRetries: -1}, nil)
	if err != nil {
		return nil, fmt.Errorf("open an MCP session on %s: %w", r.endpoint, err)
	}
	return s, nil
}

// call relays one tool call; a session the server no longer holds is
// replaced once (a new session, so a new sandbox: the result says so).
func (r *mcpRelay) call(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	r.mu.Lock()
	s := r.session
	r.mu.Unlock()
	params := &mcp.CallToolParams{Name: req.Params.Name, Arguments: req.Params.Arguments}
	res, err := s.CallTool(ctx, params)
	if err != nil && errors.Is(err, mcp.ErrSessionMissing) {
		r.mu.Lock()
		if r.session == s {
			if ns, cerr := r.connect(ctx); cerr == nil {
				_ = s.Close()
				r.session = ns
			}
		}
		s = r.session
		r.mu.Unlock()
		if res, err = s.CallTool(ctx, params); err == nil {
			res.Content = append([]mcp.Content{&mcp.TextContent{Text: "note: the corral server had ended this MCP session (idle or restarted); this call ran in a new session, with a new sandbox"}}, res.Content...)
		}
	}
	if err != nil {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "unavailable: the corral server did not answer: " + err.Error()}}}, nil
	}
	return res, nil
}

func (r *mcpRelay) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.session != nil {
		_ = r.session.Close() // ends the session: its sandboxes are killed
	}
}

// serveMCPStdio serves, on transport t, the tools of the MCP session it
// opens on endpoint, relaying every call, until t's session ends; then it
// closes the remote session.
func serveMCPStdio(ctx context.Context, endpoint string, hc *http.Client, t mcp.Transport) error {
	r := &mcpRelay{endpoint: endpoint, hc: hc, client: mcp.NewClient(&mcp.Implementation{Name: "corral-mcp", Version: "1"}, nil)}
	s, err := r.connect(ctx)
	if err != nil {
		return err
	}
	r.session = s
	defer r.close()
	local := mcp.NewServer(&mcp.Implementation{Name: "corral", Version: "1"}, &mcp.ServerOptions{Instructions: s.InitializeResult().Instructions})
	for tool, err := range s.Tools(ctx, nil) {
		if err != nil {
			return fmt.Errorf("list the server's tools: %w", err)
		}
		local.AddTool(tool, r.call)
	}
	if err := local.Run(ctx, t); err != nil && ctx.Err() == nil {
		return fmt.Errorf("stdio MCP session: %w", err)
	}
	return nil
}
