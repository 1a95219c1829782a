package corral

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corralhq/corral/proto/process/processconnect"
)

// DefaultURL is the server URL used when CORRAL_URL is not set.
const DefaultURL = "http://127.0.0.1:7420"

// DefaultDataDir is the server data directory searched for admin.key when
// CORRAL_DATA is not set.
const DefaultDataDir = "/var/lib/corral"

// Client is a corral API client. It is safe for concurrent use.
type Client struct {
	baseURL   string // without trailing slash
	apiKey    string
	userAgent string
	http      *http.Client // no overall timeout: streams are long-lived

	// procs holds the process-service clients by agent URL (at most
	// maxProcessClients; emptied when full). Guarded by pmu.
	pmu   sync.Mutex
	procs map[string]processconnect.ProcessClient
}

// maxProcessClients bounds Client.procs.
const maxProcessClients = 256

// processClient returns the process-service client of the agent at url,
// made on first use.
func (c *Client) processClient(url string) processconnect.ProcessClient {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if pc, ok := c.procs[url]; ok {
		return pc
	}
	if c.procs == nil || len(c.procs) >= maxProcessClients {
		c.procs = map[string]processconnect.ProcessClient{}
	}
	pc := processconnect.NewProcessClient(c.http, url)
	c.procs[url] = pc
	return pc
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the client use hc's transport (its Timeout is
// ignored, since command streams may last as long as the command). The API
// key and per-call headers are added by a wrapper around hc.Transport.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		rt := hc.Transport
		if rt == nil {
			rt = http.DefaultTransport
		}
		c.http = &http.Client{
			Transport:     &transport{base: rt, c: c},
			CheckRedirect: hc.CheckRedirect,
			Jar:           hc.Jar,
		}
	}
}

// CAFileEnv names the environment variable holding a PEM file of CAs to
// trust for an https:// server (a private CA), read by [NewFromEnv] and
// the CLI. Unset, the system's trust store is used.
const CAFileEnv = "CORRAL_CA_FILE"

// LoadCAFile reads a PEM file of CA certificates for [WithRootCAs]. It
// fails when the file cannot be read or holds no certificate.
func LoadCAFile(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("corral: CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("corral: CA file %s: no PEM certificate in it", path)
	}
	return pool, nil
}

// WithRootCAs makes the client trust only pool's CAs for an https://
// server (TLS 1.2 or later), instead of the system's trust store. It
// replaces the transport of an earlier [WithHTTPClient].
func WithRootCAs(pool *x509.CertPool) Option {
	return func(c *Client) {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		c.http = &http.Client{Transport: &transport{base: t, c: c}}
	}
}

// WithUserAgent sets the User-Agent header sent on every request.
func WithUserAgent(ua string) Option {
	return func(c *Client) { c.userAgent = ua }
}

// New returns a client for the server at baseURL (for example
// "http://127.0.0.1:7420") that authenticates with apiKey.
func New(baseURL, apiKey string, opts ...Option) *Client {
	c := &Client{
		baseURL:   strings.TrimRight(baseURL, "/"),
		apiKey:    apiKey,
		userAgent: "corral-go",
	}
	c.http = &http.Client{Transport: &transport{base: http.DefaultTransport, c: c}}
	for _, o := range opts {
		o(c)
	}
	return c
}

// NewFromEnv returns a client configured from the environment: the server
// URL from CORRAL_URL (default [DefaultURL]) and the API key from
// CORRAL_API_KEY, trusting the CAs in CORRAL_CA_FILE ([CAFileEnv]) when it
// is set. Without CORRAL_API_KEY, when the server is local
// (127.0.0.1, ::1 or localhost), the key is read from admin.key in
// CORRAL_DATA (default [DefaultDataDir]). It fails if no key can be found.
func NewFromEnv(opts ...Option) (*Client, error) {
	base := os.Getenv("CORRAL_URL")
	if base == "" {
		base = DefaultURL
	}
	key := os.Getenv("CORRAL_API_KEY")
	if key == "" {
		var err error
		key, err = LocalAdminKey(base, os.Getenv("CORRAL_DATA"))
		if err != nil {
			return nil, err
		}
	}
	if f := os.Getenv(CAFileEnv); f != "" {
		pool, err := LoadCAFile(f)
		if err != nil {
			return nil, err
		}
		opts = append([]Option{WithRootCAs(pool)}, opts...)
	}
	return New(base, key, opts...), nil
}

// LocalAdminKey reads the admin API key of a local server from
// dataDir/admin.key (dataDir "" means [DefaultDataDir]). It fails for a
// serverURL whose host is not 127.0.0.1, ::1 or localhost, since a remote
// server's key is not on this machine.
func LocalAdminKey(serverURL, dataDir string) (string, error) {
	if !IsLocalURL(serverURL) {
		return "", fmt.Errorf("corral: no API key for %s: set CORRAL_API_KEY", serverURL)
	}
	if dataDir == "" {
		dataDir = DefaultDataDir
	}
	p := filepath.Join(dataDir, "admin.key")
	b, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("corral: no API key: set CORRAL_API_KEY or make %s readable: %w", p, err)
	}
	key := strings.TrimSpace(string(b))
	if key == "" {
		return "", fmt.Errorf("corral: no API key: %s is empty", p)
	}
	return key, nil
}

// IsLocalURL reports whether serverURL's host is 127.0.0.1, ::1 or localhost.
func IsLocalURL(serverURL string) bool {
	u, err := url.Parse(serverURL)
	if err != nil {
		return false
	}
	h := u.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// BaseURL returns the server URL the client talks to.
func (c *Client) BaseURL() string { return c.baseURL }

// callInfo carries per-call settings from the SDK to the HTTP transport
// through the request context, and errors seen by the transport back.
type callInfo struct {
	timeout time.Duration // >0: send Connect-Timeout-Ms

	mu      sync.Mutex
	httpErr *APIError
}

func (ci *callInfo) httpError() *APIError {
	ci.mu.Lock()
	defer ci.mu.Unlock()
	return ci.httpErr
}

type callInfoKey struct{}

func withCallInfo(ctx context.Context, ci *callInfo) context.Context {
	return context.WithValue(ctx, callInfoKey{}, ci)
}

// transport adds the API key, the user agent and the per-call
// Connect-Timeout-Ms header (which connect-go does not let callers set),
// and records corral JSON error bodies for the call.
type transport struct {
	base http.RoundTripper
	c    *Client
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	if t.c.apiKey != "" {
		r.Header.Set("X-API-Key", t.c.apiKey)
	}
	if t.c.userAgent != "" && r.Header.Get("User-Agent") == "" {
		r.Header.Set("User-Agent", t.c.userAgent)
	}
	ci, _ := req.Context().Value(callInfoKey{}).(*callInfo)
	if ci != nil && ci.timeout > 0 {
		ms := ci.timeout.Milliseconds()
		if ms < 1 {
			ms = 1
		}
		r.Header.Set("Connect-Timeout-Ms", strconv.FormatInt(ms, 10))
	}
	resp, err := t.base.RoundTrip(r)
	if err != nil || ci == nil || resp.StatusCode < 400 {
		return resp, err
	}
	// A corral error (REST JSON) in front of a Connect call: keep it so the
	// SDK can report it instead of Connect's status-derived code, and give
	// Connect the same bytes.
	if ct := resp.Header.Get("Content-Type"); strings.HasPrefix(ct, "application/json") {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		ae := decodeErrorBody(resp.StatusCode, resp.Header, body)
		ci.mu.Lock()
		ci.httpErr = ae
		ci.mu.Unlock()
	}
	return resp, nil
}

// do performs a REST call: body (if not nil) is sent as JSON and a 2xx
// response is decoded into out (if not nil).
func (c *Client) do(ctx context.Context, method, path string, query url.Values, body, out any) error {
	u := c.baseURL + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return errorFromResponse(resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("corral: %s %s: empty response", method, path)
		}
		return fmt.Errorf("corral: %s %s: decoding response: %w", method, path, err)
	}
	return nil
}
