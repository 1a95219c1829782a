package corral

import (
	"context"
	"net/url"
	"time"
)

// Volume is a persistent, size-capped file system that sandboxes mount
// (docs/environments.md, "Volumes").
type Volume struct {
	ID string `json:"id"`
	// Team owns the volume. Names are per team.
	Team   string `json:"team"`
	Name   string `json:"name"`
	SizeMB int64  `json:"size_mb"`
	// UsedBytes is what the volume holds (nil when it could not be read).
	UsedBytes *int64 `json:"used_bytes,omitempty"`
	// Token is the bearer token of the volume content API (/volumecontent).
	Token     string    `json:"token"`
	CreatedAt time.Time `json:"created_at"`
}

// VolumeMount mounts a volume (by name or id) at Path in a new sandbox.
type VolumeMount struct {
	Volume string
	Path   string
}

type volumeMountWire struct {
	Volume string `json:"volume"`
	Path   string `json:"path"`
}

// CreateVolume makes a volume of sizeMB MiB (0: 1024) (POST /v1/volumes).
func (c *Client) CreateVolume(ctx context.Context, name string, sizeMB int64) (*Volume, error) {
	var v Volume
	body := map[string]any{"name": name}
	if sizeMB != 0 {
		body["size_mb"] = sizeMB
	}
	if err := c.do(ctx, "POST", "/v1/volumes", nil, body, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Volumes lists the volumes (GET /v1/volumes).
func (c *Client) Volumes(ctx context.Context) ([]Volume, error) {
	var out struct {
		Volumes []Volume `json:"volumes"`
	}
	if err := c.do(ctx, "GET", "/v1/volumes", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Volumes, nil
}

// Volume returns the volume named or numbered ref (GET /v1/volumes/{ref}).
func (c *Client) Volume(ctx context.Context, ref string) (*Volume, error) {
	var v Volume
	if err := c.do(ctx, "GET", "/v1/volumes/"+url.PathEscape(ref), nil, nil, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// DeleteVolume deletes a volume and its files (DELETE /v1/volumes/{ref});
// a volume that a sandbox mounts is refused with a conflict.
func (c *Client) DeleteVolume(ctx context.Context, ref string) error {
	return c.do(ctx, "DELETE", "/v1/volumes/"+url.PathEscape(ref), nil, nil, nil)
}
