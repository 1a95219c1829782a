package sandbox

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/store"
)

// Several control planes (nodes) may share one store. Each record names
// the node that runs its sandbox (Config.Node); that node holds its TTL
// timer, its agent connections and its admission ticket, and is the one
// that adopts it after a restart.
//
// With a host-local driver (runc, runsc) a node sees only its own
// sandboxes, so it reconciles, reaps and kills only its own: a kill of
// another node's sandbox is refused with an *OtherNodeError naming the
// node. With a shared driver (Kubernetes: every node sees every Pod) a
// node leaves other nodes' sandboxes to them, with two exceptions:
//   - a kill: any node may delete the Pod and end the record (the owner's
//     death check then sees the Pod gone and forgets the sandbox without
//     a second end);
//   - an overdue sandbox, whose node is gone or failed to end it: past
//     its TTL by ForeignGrace, or its Pod gone or ended for ForeignGrace
//     and its record older than CreateDeadline (a younger record may be
//     a create still starting its Pod on its node).
// Of two nodes ending one record at once, one records the end
// (Manager.recordEnd), with its event.

// Defaults of the node settings (docs/configuration.md).
const (
	DefaultForeignGrace   = time.Minute
	DefaultCreateDeadline = 10 * time.Minute
)

// DefaultNode is the node id of a control plane given none: its host
// name.
func DefaultNode() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "corral"
	}
	return h
}

// Node is this control plane's node id.
func (m *Manager) Node() string { return m.cfg.Node }

// OtherNodeError refuses an operation on a sandbox that another control
// plane runs on its own host: only that node can reach it.
type OtherNodeError struct {
	ID, Node, Self string
}

func (e *OtherNodeError) Error() string {
	return fmt.Sprintf("sandbox %s runs on node %s, not on this one (%s): send the request to %s", e.ID, e.Node, e.Self, e.Node)
}

// foreignRecord returns the running or paused record of id when another
// node runs it, nil otherwise.
func (m *Manager) foreignRecord(ctx context.Context, id string) *store.Sandbox {
	rec, err := m.store.GetSandbox(ctx, id)
	if err != nil || rec.State == store.StateEnded || rec.Node == m.cfg.Node {
		return nil
	}
	return rec
}

// killForeign is Kill of a sandbox this node does not hold: under a
// shared driver it deletes the sandbox's Pod and ends the record; under
// a host-local one it is refused (only the owner reaches it).
func (m *Manager) killForeign(ctx context.Context, id string) error {
	rec := m.foreignRecord(ctx, id)
	if rec == nil {
		return ErrNotFound
	}
	if !m.shared {
		return &OtherNodeError{ID: id, Node: rec.Node, Self: m.cfg.Node}
	}
	return m.endForeign(ctx, rec, EndKilled, "")
}

// endForeign ends another node's sandbox under a shared driver. The
// record is ended first, with its event (recordEnd: of this end and the
// owner's own, racing, one counts), so that the owner, which sees the
// sandbox die once it is stopped, finds it ended and only forgets it (no
// second end, no second event); then the runtime state is stopped. Only
// the node whose end counted stops it.
func (m *Manager) endForeign(ctx context.Context, rec *store.Sandbox, reason, errText string) error {
	won, err := m.recordEnd(ctx, rec.ID, reason, errText, map[string]any{"reason": reason, "error": errText, "node": rec.Node, "ended_by": m.cfg.Node})
	if err != nil {
		return err
	}
	m.mu.Lock()
	delete(m.foreignDead, rec.ID)
	m.mu.Unlock()
	if !won {
		return nil // another node ended it meanwhile; its end stands
	}
	m.log.Info("ended another node's sandbox", "id", rec.ID, "node", rec.Node, "reason", reason)
	if err := m.driver.Stop(ctx, rec.ID, m.cfg.KillGrace); err != nil {
		// The record has ended: any node's reaper reclaims what is left.
		return fmt.Errorf("stop sandbox %s of node %s: %w", rec.ID, rec.Node, err)
	}
	return nil
}

// checkForeign ends, under a shared driver, the sandboxes of recs (other
// nodes' running records) that are overdue (see the package comment at
// the top of this file), and keeps track of when each was first seen
// dead. Nothing younger than CreateDeadline is ended for want of a Pod,
// so a record another node has inserted and whose Pod it is still
// starting is left alone.
func (m *Manager) checkForeign(ctx context.Context, recs []*store.Sandbox) {
	if !m.shared {
		return
	}
	now := time.Now()
	seen := map[string]bool{}
	for _, rec := range recs {
		if rec.Node == m.cfg.Node {
			continue
		}
		seen[rec.ID] = true
		if now.After(rec.ExpiresAt.Add(m.cfg.ForeignGrace)) {
			m.endForeignLogged(ctx, rec, EndTTL, "ended by node "+m.cfg.Node+": past its TTL and its node did not end it")
			continue
		}
		if m.driver.Alive(rec.ID) || rec.State == store.StatePaused {
			m.mu.Lock()
			delete(m.foreignDead, rec.ID)
			m.mu.Unlock()
			continue
		}
		m.mu.Lock()
		since, ok := m.foreignDead[rec.ID]
		if !ok {
			m.foreignDead[rec.ID] = now
			since = now
		}
		m.mu.Unlock()
		if now.Sub(since) < m.cfg.ForeignGrace || now.Sub(rec.CreatedAt) < m.cfg.CreateDeadline {
			continue
		}
		detail := ""
		if lr, ok := m.driver.(runtime.LossReporter); ok {
			detail = lr.LostReason(rec.ID)
		}
		m.endForeignLogged(ctx, rec, EndOrphaned, detail)
	}
	m.mu.Lock()
	for id := range m.foreignDead {
		if !seen[id] {
			delete(m.foreignDead, id)
		}
	}
	m.mu.Unlock()
}

func (m *Manager) endForeignLogged(ctx context.Context, rec *store.Sandbox, reason, detail string) {
	if err := m.endForeign(ctx, rec, reason, detail); err != nil {
		m.log.Error("end another node's overdue sandbox", "id", rec.ID, "node", rec.Node, "err", err)
	}
}

// reapForeign is the reaper's pass over other nodes' sandboxes under a
// shared driver; held is what the driver listed before it.
func (m *Manager) reapForeign(ctx context.Context) (records map[string]bool) {
	recs, err := m.store.ListSandboxes(ctx, store.SandboxFilter{States: []string{store.StateRunning, store.StatePaused}})
	if err != nil {
		m.log.Error("reaper: list records", "err", err)
		return nil
	}
	records = make(map[string]bool, len(recs))
	for _, r := range recs {
		records[r.ID] = true
	}
	m.checkForeign(ctx, recs)
	return records
}
