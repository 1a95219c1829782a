package corral

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
	"time"
)

// Network is a sandbox's network policy and egress counters.
type Network struct {
	// Mode is none, allow or all-public.
	Mode string `json:"mode"`
	// Allow lists domain patterns and CIDR:port rules (mode allow).
	Allow []string `json:"allow"`
	// Secrets names the brokered secrets the sandbox may use.
	Secrets []string `json:"secrets"`
	// Usage is set while the sandbox has a network.
	Usage *NetworkUsage `json:"usage,omitempty"`
}

// NetworkUsage are a sandbox's egress counters.
type NetworkUsage struct {
	// Conns is the number of open connections.
	Conns int `json:"conns"`
	// Bytes counts bytes up and down over the sandbox's life.
	Bytes int64 `json:"bytes"`
	// Requests counts requests in the last minute.
	Requests int `json:"requests"`
}

// GetNetwork returns a sandbox's network policy
// (GET /v1/sandboxes/{id}/network).
func (c *Client) GetNetwork(ctx context.Context, id string) (*Network, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	var n Network
	if err := c.do(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id)+"/network", nil, nil, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// SetNetwork changes a running sandbox's network policy; it takes effect
// on the sandbox's next connection (PUT /v1/sandboxes/{id}/network).
func (c *Client) SetNetwork(ctx context.Context, id, mode string, allow []string) (*Network, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	body := struct {
		Mode  string   `json:"mode"`
		Allow []string `json:"allow,omitempty"`
	}{mode, allow}
	var n Network
	if err := c.do(ctx, "PUT", "/v1/sandboxes/"+url.PathEscape(id)+"/network", nil, body, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// Secret is a registered secret as the API reports it: never its value.
type Secret struct {
	// Team owns the secret: only its sandboxes may use it. Names are
	// per team.
	Team   string   `json:"team"`
	Name   string   `json:"name"`
	Hosts  []string `json:"hosts"`
	Header string   `json:"header"`
	// AllowHTTP reports whether the proxy also injects the value into
	// plain-HTTP requests (by default it injects over TLS only).
	AllowHTTP bool      `json:"allow_http"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// SecretOptions are the optional settings of [Client.PutSecret].
type SecretOptions struct {
	// AllowHTTP lets the egress proxy inject the value into plain-HTTP
	// requests too. Without it the value is injected over TLS only, and a
	// plain-HTTP request carrying the placeholder in the secret's header
	// to one of its hosts is refused (403, reason secret_over_plain_http).
	AllowHTTP bool
}

// PutSecret registers or replaces a secret (PUT /v1/secrets/{name}): for
// requests to hosts, the egress proxy replaces the placeholder
// CORRAL_SECRET_<name> in header with value. A replaced secret takes the
// options given now (none: over TLS only).
func (c *Client) PutSecret(ctx context.Context, name string, hosts []string, header, value string, opts ...SecretOptions) (*Secret, error) {
	var o SecretOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	body := struct {
		Hosts     []string `json:"hosts"`
		Header    string   `json:"header"`
		Value     string   `json:"value"`
		AllowHTTP bool     `json:"allow_http"`
	}{hosts, header, value, o.AllowHTTP}
	var s Secret
	if err := c.do(ctx, "PUT", "/v1/secrets/"+url.PathEscape(name), nil, body, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// ListSecrets lists registered secrets (GET /v1/secrets).
func (c *Client) ListSecrets(ctx context.Context) ([]Secret, error) {
	var out struct {
		Secrets []Secret `json:"secrets"`
	}
	if err := c.do(ctx, "GET", "/v1/secrets", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Secrets, nil
}

// DeleteSecret removes a secret (DELETE /v1/secrets/{name}).
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/secrets/"+url.PathEscape(name), nil, nil, nil)
}

// Event is one audit log entry.
type Event struct {
	ID   int64     `json:"id"`
	Time time.Time `json:"time"`
	// Sandbox and Task are "" for events of neither (secret changes).
	Sandbox string `json:"sandbox"`
	Task    string `json:"task"`
	// Team is the team the event belongs to ("" for server events).
	Team string `json:"team"`
	// KeyID identifies the API key that caused the event, "" when none
	// did (the sandbox itself, a timer, the server).
	KeyID string          `json:"key_id"`
	Kind  string          `json:"kind"`
	Data  json.RawMessage `json:"data"`
}

// AuditQuery filters Audit; zero fields match everything.
type AuditQuery struct {
	// Team selects another team's events (admin keys only; "all" for
	// every team's and the server's own). Empty: the key's own team.
	Team string
	// Task selects one task's events.
	Task string
	// Sandbox selects one sandbox's events.
	Sandbox string
	// Kind is an exact kind ("egress.http") or a prefix ending in "."
	// ("egress.").
	Kind string
	// Since and Until bound the time range.
	Since, Until time.Time
	// After returns only events with a larger id (for following).
	After int64
	// Limit caps the result (1..10000, default 10000).
	Limit int
}

// Audit returns audit log events in order (GET /v1/audit).
func (c *Client) Audit(ctx context.Context, q AuditQuery) ([]Event, error) {
	v := url.Values{}
	if q.Team != "" {
		v.Set("team", q.Team)
	}
	if q.Task != "" {
		v.Set("task", q.Task)
	}
	if q.Sandbox != "" {
		v.Set("sandbox", q.Sandbox)
	}
	if q.Kind != "" {
		v.Set("kind", q.Kind)
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if !q.Until.IsZero() {
		v.Set("until", q.Until.UTC().Format(time.RFC3339Nano))
	}
	if q.After > 0 {
		v.Set("after", strconv.FormatInt(q.After, 10))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	var out struct {
		Events []Event `json:"events"`
	}
	if err := c.do(ctx, "GET", "/v1/audit", v, nil, &out); err != nil {
		return nil, err
	}
	return out.Events, nil
}
