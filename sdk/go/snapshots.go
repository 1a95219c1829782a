package corral

import (
	"context"
	"fmt"
	"net/url"
	"time"
)

// SnapshotInfo is a saved writable layer of a sandbox; start sandboxes
// from it with CreateOptions.Snapshot.
type SnapshotInfo struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Sandbox   string    `json:"sandbox"`
	Template  string    `json:"template"`
	Parent    string    `json:"parent"`
	Layers    int       `json:"layers"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
	// Team is the team that owns it.
	Team string `json:"team"`
}

// Snapshot saves a sandbox's files as a snapshot (POST
// /v1/sandboxes/{id}/snapshots); the sandbox is frozen during the copy.
func (c *Client) Snapshot(ctx context.Context, sandboxID, name string) (*SnapshotInfo, error) {
	if err := checkID(sandboxID); err != nil {
		return nil, err
	}
	body := struct {
		Name string `json:"name,omitempty"`
	}{name}
	var sn SnapshotInfo
	if err := c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/snapshots", nil, body, &sn); err != nil {
		return nil, err
	}
	return &sn, nil
}

// ListSnapshots lists snapshots, newest first; sandboxID filters when set.
func (c *Client) ListSnapshots(ctx context.Context, sandboxID string) ([]SnapshotInfo, error) {
	q := url.Values{}
	if sandboxID != "" {
		q.Set("sandbox", sandboxID)
	}
	var out struct {
		Snapshots []SnapshotInfo `json:"snapshots"`
	}
	if err := c.do(ctx, "GET", "/v1/snapshots", q, nil, &out); err != nil {
		return nil, err
	}
	return out.Snapshots, nil
}

// DeleteSnapshot removes a snapshot no running sandbox or other snapshot
// uses (a conflict error otherwise).
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	return c.do(ctx, "DELETE", "/v1/snapshots/"+url.PathEscape(id), nil, nil, nil)
}

// Fork snapshots a sandbox and starts count copies of it (files, limits,
// network policy, metadata, task; not processes, not create-time env).
// When only some copies start, Fork returns those that did together with
// a *ForkError saying why the others did not: the started ones run and
// are the caller's to use or kill. The snapshot the fork made is listed
// by [Client.ListSnapshots].
func (c *Client) Fork(ctx context.Context, sandboxID string, count int) ([]*Sandbox, error) {
	if err := checkID(sandboxID); err != nil {
		return nil, err
	}
	body := struct {
		Count int `json:"count"`
	}{count}
	var out struct {
		Snapshot  SnapshotInfo `json:"snapshot"`
		Sandboxes []*Sandbox   `json:"sandboxes"`
		Error     string       `json:"error,omitempty"`
	}
	if err := c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/fork", nil, body, &out); err != nil {
		return nil, err
	}
	for _, s := range out.Sandboxes {
		s.client = c
	}
	if out.Error != "" {
		return out.Sandboxes, &ForkError{Snapshot: out.Snapshot.ID, Started: len(out.Sandboxes), Requested: count, Message: out.Error}
	}
	return out.Sandboxes, nil
}

// ForkError reports a fork of which only some copies started.
type ForkError struct {
	// Snapshot is the id of the snapshot the fork made.
	Snapshot string
	// Started and Requested count the copies.
	Started, Requested int
	// Message is the server's reason for the copies that did not start.
	Message string
}

// Error implements error.
func (e *ForkError) Error() string {
	return fmt.Sprintf("corral: fork started %d of %d sandboxes: %s", e.Started, e.Requested, e.Message)
}
