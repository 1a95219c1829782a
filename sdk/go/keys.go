package corral

import (
	"context"
	"net/url"
	"time"
)

// Roles of API keys.
const (
	// RoleAdmin may use every route, including keys, and see every
	// team's records (?team=).
	RoleAdmin = "admin"
	// RoleMember acts for its own team only.
	RoleMember = "member"
)

// KeyRequest describes a new API key (POST /v1/keys).
type KeyRequest struct {
	// Team is the team the key acts for (required; 1 to 63 of a-z,
	// 0-9, _ and -; "all" is reserved).
	Team string `json:"team"`
	// Role is RoleAdmin or RoleMember ("" = RoleMember).
	Role string `json:"role,omitempty"`
	// Name labels the key (up to 64 bytes of printable text).
	Name string `json:"name,omitempty"`
}

// NewKey is a key just created: the only time its value is shown.
type NewKey struct {
	// Key is the key's value (e2b_ + 40 hex): keep it, the server
	// stores only its hash.
	Key       string    `json:"key"`
	ID        string    `json:"id"`
	Team      string    `json:"team"`
	Role      string    `json:"role"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

// KeyInfo is a stored API key as lists show it: its id, never its value.
type KeyInfo struct {
	// ID names the key (16 hex digits of its SHA-256) in lists, audit
	// events and RevokeKey.
	ID        string    `json:"id"`
	Team      string    `json:"team"`
	Role      string    `json:"role"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	// RevokedAt is when the key was revoked (nil: valid).
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// CreateKey makes an API key (admin keys only; a member key gets
// CodeForbidden). Bad fields are CodeInvalidArgument.
func (c *Client) CreateKey(ctx context.Context, req KeyRequest) (*NewKey, error) {
	var k NewKey
	if err := c.do(ctx, "POST", "/v1/keys", nil, req, &k); err != nil {
		return nil, err
	}
	return &k, nil
}

// ListKeys lists the API keys of team, revoked ones too (admin keys
// only). team "" is the caller's own team, "all" every team.
func (c *Client) ListKeys(ctx context.Context, team string) ([]KeyInfo, error) {
	var q url.Values
	if team != "" {
		q = url.Values{"team": {team}}
	}
	var out struct {
		Keys []KeyInfo `json:"keys"`
	}
	if err := c.do(ctx, "GET", "/v1/keys", q, nil, &out); err != nil {
		return nil, err
	}
	return out.Keys, nil
}

// RevokeKey revokes the key with id (admin keys only): it fails from its
// next request on. Revoking a revoked key is not an error. An unknown id
// is CodeNotFound; the server's last unrevoked admin key is refused with
// CodeConflict.
func (c *Client) RevokeKey(ctx context.Context, id string) (*KeyInfo, error) {
	var k KeyInfo
	if err := c.do(ctx, "DELETE", "/v1/keys/"+url.PathEscape(id), nil, nil, &k); err != nil {
		return nil, err
	}
	return &k, nil
}
