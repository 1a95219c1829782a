// Package agentclient is the control plane's client of a sandbox's agent:
// HTTP over the sandbox's socket with its access token, Connect clients
// whose replies are bounded (the agent may be a fake planted by sandbox
// root, so every reply is hostile input), and the port tunnel's
// handshake. It knows nothing of sandboxes' lifecycle: a caller gives it
// a dial function and a token.
package agentclient

import (
	"context"
	"encoding/base64"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/corralhq/corral/proto/agentproto"
	"github.com/corralhq/corral/proto/filesystem/filesystemconnect"
	"github.com/corralhq/corral/proto/process/processconnect"
)

// BaseURL is the base URL used for requests to a sandbox's agent; the
// host part is ignored, connections go over the sandbox's socket.
const BaseURL = "http://agent"

type lifetimeKey struct{}

// WithLifetime returns a context that makes agent requests carry a
// Connect-Timeout-Ms header of d without giving the request itself a
// deadline: the agent kills the process when d elapses and still delivers
// its end event. (connect-go drops protocol headers set by callers.)
func WithLifetime(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, lifetimeKey{}, d)
}

type noTokenKey struct{}

// WithoutToken returns a context whose agent requests do not carry the
// sandbox's access token, so that the agent itself checks the caller's
// own credential (a signed /files URL).
func WithoutToken(ctx context.Context) context.Context {
	return context.WithValue(ctx, noTokenKey{}, true)
}

// BasicUser is the Authorization header value that selects user on agent
// calls.
func BasicUser(user string) string {
	return agentproto.UserAuthScheme + base64.StdEncoding.EncodeToString([]byte(user+":"))
}

// transport authenticates requests to a sandbox's agent with its access
// token and sets Connect-Timeout-Ms from the request's context.
type transport struct {
	next  http.RoundTripper
	token string
}

// CloseIdleConnections closes the idle connections of the transport it
// wraps: without it http.Client.CloseIdleConnections does nothing through
// the wrapper, and connections to a paused or ended sandbox's agent (or
// to the socket sandbox root replaced) would stay pooled.
func (t transport) CloseIdleConnections() {
	if c, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func (t transport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if skip, _ := r.Context().Value(noTokenKey{}).(bool); skip {
		r.Header.Del(agentproto.AccessTokenHeader)
	} else if t.token != "" {
		r.Header.Set(agentproto.AccessTokenHeader, t.token)
	}
	if d, ok := r.Context().Value(lifetimeKey{}).(time.Duration); ok && d > 0 {
		ms := d.Milliseconds()
		if ms < 1 {
			ms = 1
		}
		r.Header.Set("Connect-Timeout-Ms", strconv.FormatInt(ms, 10))
	}
	return t.next.RoundTrip(r)
}

// Dialer connects to one sandbox's agent.
type Dialer func(ctx context.Context) (net.Conn, error)

// NewHTTP returns an HTTP client whose connections reach an agent through
// dial (use with BaseURL) and whose requests carry token ("" for none).
// Reply header blocks are bounded.
func NewHTTP(dial Dialer, token string) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dial(ctx)
		},
		MaxIdleConnsPerHost:    16,
		IdleConnTimeout:        30 * time.Second,
		DisableCompression:     true,
		MaxResponseHeaderBytes: maxHeaderBytes,
	}
	return &http.Client{Transport: transport{next: tr, token: token}}
}

// Cache keeps one HTTP client per sandbox, so that calls to one agent
// reuse its connections, and the agent's process client over it. It is
// safe for concurrent use.
type Cache struct {
	mu sync.Mutex
	// byID holds the clients by sandbox id; guarded by mu.
	byID map[string]*cached
}

// cached is one sandbox's clients.
type cached struct {
	hc *http.Client
	// proc is Process(hc), made on first use; guarded by Cache.mu.
	proc processconnect.ProcessClient
}

// HTTP returns the client of sandbox id, making it with dial and token if
// there is none. A client without a token (the sandbox is not running) is
// returned but not kept.
func (c *Cache) HTTP(id string, dial Dialer, token string) *http.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.get(id, dial, token).hc
}

// Process returns Process(c.HTTP(id, dial, token)), kept with the HTTP
// client: a command's start does not build the Connect clients again.
func (c *Cache) Process(id string, dial Dialer, token string) processconnect.ProcessClient {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.get(id, dial, token)
	if e.proc == nil {
		e.proc = Process(e.hc)
	}
	return e.proc
}

// get returns the entry of id, making (and, with a token, keeping) it.
// c.mu is held.
func (c *Cache) get(id string, dial Dialer, token string) *cached {
	if e, ok := c.byID[id]; ok {
		return e
	}
	e := &cached{hc: NewHTTP(dial, token)}
	if token == "" {
		return e
	}
	if c.byID == nil {
		c.byID = map[string]*cached{}
	}
	c.byID[id] = e
	return e
}

// Drop forgets the clients of sandbox id and closes its idle connections
// (the sandbox paused or ended).
func (c *Cache) Drop(id string) {
	c.mu.Lock()
	e, ok := c.byID[id]
	delete(c.byID, id)
	c.mu.Unlock()
	if ok {
		e.hc.CloseIdleConnections()
	}
}

// Filesystem returns a client of the agent's filesystem service over hc
// with every reply bounded (NewFilesystemClient) and unary calls bounded
// by CallTimeout.
func Filesystem(hc *http.Client) filesystemconnect.FilesystemClient {
	return NewFilesystemClient(hc, BaseURL, CallTimeout)
}

// Process returns a client of the agent's process service over hc with
// every reply bounded (NewProcessClient) and unary calls bounded by
// CallTimeout.
func Process(hc *http.Client) processconnect.ProcessClient {
	return NewProcessClient(hc, BaseURL, CallTimeout)
}
