package sandbox

import (
	"context"
	"errors"
	"time"

	"github.com/corralhq/corral/internal/store"
)

// ReapInterval is how often the reaper runs while the server is up.
const ReapInterval = 30 * time.Second

// Reap compares what the runtime and the host hold with the manager's
// live sandboxes and reclaims, recording each with its reason:
//   - runtime state (containers, mounts, cgroups, state dirs) of sandboxes
//     that are not live here ("no_record");
//   - veth pairs and nftables rules of sandboxes that are not live
//     ("no_record");
//   - live sandboxes whose task has ended ("task_ended");
//   - live sandboxes idle past Config.IdleTimeout ("idle");
//   - deleted snapshots nothing uses any more, imported images no template
//     version names, partial imports and volumes without a record.
//
// Reconcile does the same at start-up, after a crash.
func (m *Manager) Reap(ctx context.Context) {
	held, err := m.driver.List(ctx)
	if err != nil {
		m.log.Error("reaper: list runtime", "err", err)
	}
	// Under a shared driver the runtime holds other nodes' sandboxes too:
	// those with a running record are theirs (listed after the runtime,
	// so a record inserted by a create in flight is in it).
	var records map[string]bool
	if m.shared {
		if records = m.reapForeign(ctx); records == nil {
			held = nil // no listing of the records: reclaim nothing
		}
	}
	m.mu.Lock()
	live := make(map[string]*liveSandbox, len(m.live))
	for id, ls := range m.live {
		live[id] = ls
	}
	m.mu.Unlock()
	for _, id := range held {
		if live[id] != nil || m.pools.Owns(id) || records[id] {
			continue
		}
		// A record may be on its way in (Create inserts the live entry
		// before the runtime starts), so look again under the lock.
		m.mu.Lock()
		_, now := m.live[id]
		m.mu.Unlock()
		if now {
			continue
		}
		if err := m.driver.Stop(ctx, id, 0); err != nil {
			m.log.Error("reaper: reclaim", "id", id, "err", err)
			continue
		}
		m.audit(id, "reaper.reclaimed", map[string]any{"what": "runtime state", "reason": "no_record"})
		m.log.Info("reaper reclaimed runtime state without a live sandbox", "id", id)
	}
	if gw := m.cfg.Gateway; gw != nil {
		for _, id := range gw.Reap(func(id string) bool {
			m.mu.Lock()
			defer m.mu.Unlock()
			_, ok := m.live[id]
			return ok
		}) {
			m.audit(id, "reaper.reclaimed", map[string]any{"what": "network (veth, nftables rules)", "reason": "no_record"})
		}
	}
	m.purgeDeletedSnapshots(ctx)
	m.templates.PurgeUnusedImports(ctx)
	if m.cfg.Volumes != nil {
		m.cfg.Volumes.PurgeOrphans(ctx)
	}
	now := time.Now()
	for id, ls := range live {
		m.mu.Lock()
		ending, paused, task, last, busy := ls.ending, ls.paused, ls.rec.TaskID, ls.lastActive, ls.running > 0
		m.mu.Unlock()
		if ending {
			continue
		}
		if task != "" && m.cfg.Governor != nil {
			if t, err := m.cfg.Governor.Get(ctx, task); err == nil && t.State == store.TaskEnded {
				m.reapOne(ctx, id, task, EndTaskEnded, "its task has ended", nil)
				continue
			}
		}
		if m.cfg.IdleTimeout > 0 && !paused && !busy && !last.IsZero() && now.Sub(last) > m.cfg.IdleTimeout {
			// Checked again as the sandbox is ended: a pause, resume or
			// command since the reading above cancels it.
			still := func(ls *liveSandbox) bool {
				return !ls.paused && ls.running == 0 && ls.lastActive.Equal(last)
			}
			m.reapOne(ctx, id, task, EndIdle, "idle for "+now.Sub(last).Round(time.Second).String(), still)
		}
	}
}

// reapOne ends a sandbox for reason, if still (when given) holds.
func (m *Manager) reapOne(ctx context.Context, id, task, reason, why string, still func(*liveSandbox) bool) {
	err := m.endIf(ctx, id, reason, why, still)
	switch {
	case err == nil:
		m.audit(id, "reaper.reclaimed", map[string]any{"what": "sandbox", "reason": reason, "detail": why})
	case errors.Is(err, ErrNotFound), errors.Is(err, errEndCancelled):
	default:
		m.log.Error("reaper: end sandbox", "id", id, "err", err)
	}
}

// touch records activity in a sandbox (for the idle limit); delta is +1
// when a command starts, -1 when it ends, 0 for other calls.
func (m *Manager) touch(id string, delta int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ls, ok := m.live[id]; ok {
		ls.lastActive = time.Now()
		ls.running += delta
		if ls.running < 0 {
			ls.running = 0
		}
	}
}
