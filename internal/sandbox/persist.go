package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/corralhq/corral/internal/store"
)

// PauseWith pauses a running sandbox. Without persist it is Pause (the
// cgroup freezer keeps processes and memory). With persist, the
// sandbox's files are saved to a hidden snapshot and its processes are
// stopped, freeing their memory; Resume starts it again from the snapshot
// with the same id and access token: files kept, processes not (E2B's
// pause without memory and "reboot" resume). A pause, to disk or not, is
// work Shutdown waits for (beginWork); once Shutdown has begun it is
// refused with ErrShuttingDown and the sandbox keeps running.
func (m *Manager) PauseWith(ctx context.Context, id string, persist bool) (*store.Sandbox, error) {
	if !persist {
		return m.Pause(ctx, id)
	}
	done, ok := m.beginWork()
	if !ok {
		return nil, ErrShuttingDown
	}
	defer done()
	return m.persist(ctx, id)
}

// persist is PauseWith's pause to disk, for a caller that counts it as
// work itself (PauseWith, or a TTL's expiry with its auto-pause).
func (m *Manager) persist(ctx context.Context, id string) (*store.Sandbox, error) {
	ls, unlock, err := m.lockOp(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	m.mu.Lock()
	if ls.stopped {
		m.mu.Unlock()
		return nil, ErrConflict
	}
	wasPaused := ls.paused
	if !wasPaused {
		ls.paused = true
		ls.remaining = max(time.Until(ls.rec.ExpiresAt), time.Second)
		if ls.timer != nil {
			ls.timer.Stop()
		}
	}
	m.mu.Unlock()
	undo := func() {
		if wasPaused {
			return
		}
		m.mu.Lock()
		ls.paused = false
		if ls.timer != nil {
			ls.timer.Reset(ls.remaining)
		}
		m.mu.Unlock()
	}
	sn, err := m.snapshotLocked(ctx, ls, "paused-"+id)
	if err != nil {
		undo()
		return nil, fmt.Errorf("persist %s: %w", id, err)
	}
	// The snapshot is the sandbox's own: hidden from lists and from
	// creates; it goes when the sandbox ends.
	_ = m.store.MarkSnapshotDeleted(ctx, sn.ID)
	if err := m.store.SetPersisted(ctx, id, sn.ID); err != nil {
		undo()
		return nil, err
	}
	// Marked stopped before its processes stop, so that the death check
	// (EndIfDead) does not take the stop for a crash and end the sandbox.
	m.mu.Lock()
	ls.stopped = true
	ls.rec.Persisted = sn.ID
	remaining := ls.remaining
	m.mu.Unlock()
	m.dropClient(id)
	m.finalReading(id)
	if err := m.driver.Stop(ctx, id, m.cfg.KillGrace); err != nil {
		m.log.Error("stop persisted sandbox", "id", id, "err", err)
	}
	m.teardownNetwork(id)
	if wd := m.wd.Load(); wd != nil {
		wd.Forget(id)
	}
	if m.endingOrGone(ls) {
		return nil, ErrNotFound // killed while it was being paused
	}
	if err := m.store.SetState(ctx, id, store.StatePaused, time.Now().Add(remaining)); err != nil {
		return nil, err
	}
	m.auditBy(ctx, id, "sandbox.paused", map[string]any{"persisted": sn.ID, "bytes": sn.SizeBytes})
	m.log.Info("sandbox paused and persisted", "id", id, "snapshot", sn.ID)
	return m.store.GetSandbox(ctx, id)
}

// restart starts a persisted sandbox again from its snapshot, with its
// id, access token, limits, network policy and create-time env.
func (m *Manager) restart(ctx context.Context, ls *liveSandbox) error {
	m.mu.Lock()
	rec := *ls.rec
	m.mu.Unlock()
	r := rec.Resources
	tmpl := rec.TemplateVersion
	if tmpl == "" {
		tmpl = rec.Template
	}
	req := CreateRequest{Template: tmpl, Snapshot: rec.Persisted, anySnapshot: true, Runtime: rec.Runtime, Tier: rec.Tier,
		Resources: &ResourceRequest{CPU: r.CPU, MemoryMB: r.MemoryMB, DiskMB: r.DiskMB, Pids: r.Pids, Nofile: r.Nofile},
		Env:       rec.Env}
	_, rc, err := m.validateBase(&req)
	if err != nil {
		return fmt.Errorf("restart %s: %w", rec.ID, err)
	}
	rc.ID, rc.AccessToken = rec.ID, rec.AccessToken
	if len(rec.Volumes) > 0 && m.cfg.Volumes != nil {
		defer m.cfg.Volumes.Hold()()
	}
	if rc.Volumes, err = m.volumeBinds(ctx, rec.Volumes); err != nil {
		return fmt.Errorf("restart %s: %w", rec.ID, err)
	}
	pol, err := parsePolicy(rec.Network, rec.Egress.Allow)
	if err != nil {
		return err
	}
	secrets, err := m.resolveSecrets(ctx, rec.Team, rec.Egress.Secrets)
	if err != nil {
		return err
	}
	if err := m.prepareNetwork(&rec, &rc, pol, secrets); err != nil {
		return refusedContent(&rec, err)
	}
	if _, err := m.driver.Start(ctx, rc); err != nil {
		m.teardownNetwork(rec.ID)
		return fmt.Errorf("restart %s: %w", rec.ID, refusedContent(&rec, err))
	}
	if err := m.activateNetwork(rec.ID, pol, secrets); err != nil {
		_ = m.driver.Stop(context.WithoutCancel(ctx), rec.ID, 0)
		m.teardownNetwork(rec.ID)
		return err
	}
	m.mu.Lock()
	ls.stopped = false
	ended := ls.ending
	m.mu.Unlock()
	if ended {
		// Killed during the restart: end waits for this call and then
		// stops what it started.
		return ErrNotFound
	}
	m.auditBy(ctx, rec.ID, "sandbox.restarted", map[string]any{"from": rec.Persisted})
	return nil
}
