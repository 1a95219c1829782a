package corral

import (
	"context"
	"net/url"
)

// Pool is a template's warm pool: idle sandboxes started ahead of time and
// handed to creates that ask for the template's defaults.
type Pool struct {
	// Team owns the pool: its idle sandboxes serve that team's creates.
	Team         string  `json:"team"`
	Template     string  `json:"template"`
	Min          int     `json:"min"`
	Max          int     `json:"max"`
	MaxIdleS     int64   `json:"max_idle_s"`
	Idle         int     `json:"idle"`
	Target       int     `json:"target"`
	Hits         int64   `json:"hits"`
	Misses       int64   `json:"misses"`
	Refills      int64   `json:"refills"`
	RefillMSAvg  float64 `json:"refill_ms_avg"`
	LastRefillMS float64 `json:"last_refill_ms"`
	Evicted      int64   `json:"evicted"`
}

// SetPool sets a template's pool (PUT /v1/pools/{template}); min 0 and
// max 0 removes it. maxIdleS 0 means the default (30 min).
func (c *Client) SetPool(ctx context.Context, template string, min, max int, maxIdleS int64) (*Pool, error) {
	body := struct {
		Min      int   `json:"min"`
		Max      int   `json:"max"`
		MaxIdleS int64 `json:"max_idle_s,omitempty"`
	}{min, max, maxIdleS}
	var p Pool
	if err := c.do(ctx, "PUT", "/v1/pools/"+url.PathEscape(template), nil, body, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Pools lists the warm pools with their counters (GET /v1/pools).
func (c *Client) Pools(ctx context.Context) ([]Pool, error) {
	var out struct {
		Pools []Pool `json:"pools"`
	}
	if err := c.do(ctx, "GET", "/v1/pools", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Pools, nil
}
