package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/corralhq/corral/internal/idgen"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template/registry"
	"github.com/corralhq/corral/internal/volume"
)

// SnapshotPrefix starts every snapshot id, so that a snapshot can be named
// where a template is expected (E2B's create from a snapshot); no template
// name starts with it.
const SnapshotPrefix = registry.SnapshotPrefix

// Snapshot limits.
const (
	MaxSnapshotName = 128
	MaxForkCount    = 10
)

var snapshotNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]*$`)

func snapLayers(sn *store.Snapshot) []string {
	if sn == nil {
		return nil
	}
	return sn.Layers
}

// Snapshot saves a live sandbox's writable layer as a new snapshot: the
// sandbox is frozen for the copy and thawed after (a paused sandbox stays
// paused). A sandbox started from the snapshot sees the same files. A
// snapshot is work Shutdown waits for (beginWork), so that its files and
// its record are both written or neither; once Shutdown has begun it is
// refused with ErrShuttingDown.
func (m *Manager) Snapshot(ctx context.Context, id, name string) (*store.Snapshot, error) {
	if len(name) > MaxSnapshotName || (name != "" && !snapshotNameRe.MatchString(name)) {
		return nil, invalid("snapshot name must be 1..%d characters of [A-Za-z0-9._:-]", MaxSnapshotName)
	}
	done, ok := m.beginWork()
	if !ok {
		return nil, ErrShuttingDown
	}
	defer done()
	ls, unlock, err := m.lockOp(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return m.snapshotLocked(ctx, ls, name)
}

// errPersisted refuses to copy the files of a sandbox whose processes a
// persisted pause stopped.
var errPersisted = &ConflictError{Msg: "the sandbox is paused and persisted; resume it first"}

// parentSnapshot is the snapshot a sandbox's files stack on: the one its
// last persisted pause saved, else the one it was created from ("" for
// none).
func parentSnapshot(rec *store.Sandbox) string {
	if rec.Persisted != "" {
		return rec.Persisted
	}
	return rec.Snapshot
}

// copyableRecord returns a copy of the record of a sandbox whose files
// are about to be copied, or errPersisted if its processes are stopped
// (a persisted pause). The caller holds ls.op.
func (m *Manager) copyableRecord(ls *liveSandbox) (store.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ls.stopped {
		return store.Sandbox{}, errPersisted
	}
	return *ls.rec, nil
}

// snapshotLocked is Snapshot for a caller that holds ls.op.
func (m *Manager) snapshotLocked(ctx context.Context, ls *liveSandbox, name string) (*store.Snapshot, error) {
	rec, err := m.copyableRecord(ls)
	if err != nil {
		return nil, err
	}
	id := rec.ID
	if m.cfg.SnapshotDir == "" {
		return nil, errors.New("snapshots are not configured")
	}
	snapID := idgen.New(SnapshotPrefix, idgen.SandboxLen)
	layer := filepath.Join(m.cfg.SnapshotDir, snapID, "layer")
	size, err := m.driver.Snapshot(ctx, id, layer)
	if err != nil {
		_ = os.RemoveAll(filepath.Dir(layer))
		return nil, m.goneOr(ls, fmt.Errorf("snapshot %s: %w", id, err))
	}
	tmpl := rec.Template
	if rec.TemplateVersion != "" {
		tmpl = rec.TemplateVersion // a snapshot pins the exact template version
	}
	parentSnap := parentSnapshot(&rec)
	sn := &store.Snapshot{ID: snapID, Team: rec.Team, Name: name, SandboxID: id, Template: tmpl, Parent: parentSnap,
		Layers: []string{layer}, SizeBytes: size, CreatedAt: time.Now().UTC()}
	if parentSnap != "" {
		parent, err := m.store.GetSnapshotAny(ctx, parentSnap)
		if err != nil {
			_ = os.RemoveAll(filepath.Dir(layer))
			return nil, fmt.Errorf("parent snapshot of %s: %w", id, err)
		}
		sn.Layers = append(sn.Layers, parent.Layers...)
	}
	if err := m.store.InsertSnapshot(ctx, sn); err != nil {
		_ = os.RemoveAll(filepath.Dir(layer))
		return nil, err
	}
	m.auditBy(ctx, id, "snapshot.created", map[string]any{"snapshot": snapID, "name": name, "bytes": size, "layers": len(sn.Layers)})
	m.log.Info("snapshot created", "sandbox", id, "snapshot", snapID, "bytes", size)
	return sn, nil
}

// DeleteSnapshot removes a snapshot. One that running sandboxes or other
// snapshots still use is hidden at once (no new sandbox can start from
// it) and its layer is removed by the reaper when nothing uses it any
// more, as E2B does for templates in use.
func (m *Manager) DeleteSnapshot(ctx context.Context, id string) error {
	if _, err := m.store.GetSnapshot(ctx, id); errors.Is(err, store.ErrNotFound) {
		return ErrNotFound
	} else if err != nil {
		return err
	}
	if err := m.store.MarkSnapshotDeleted(ctx, id); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return ErrNotFound
		}
		return err
	}
	m.auditBy(ctx, "", "snapshot.deleted", map[string]any{"snapshot": id})
	m.purgeSnapshot(ctx, id)
	return nil
}

// purgeSnapshot removes a snapshot marked deleted once nothing uses it,
// then its parent if that was marked deleted too.
func (m *Manager) purgeSnapshot(ctx context.Context, id string) {
	if _, err := m.store.GetSnapshot(ctx, id); err == nil {
		return // not marked deleted
	}
	sn, err := m.store.GetSnapshotAny(ctx, id)
	if err != nil {
		return
	}
	sbs, snaps, err := m.store.SnapshotUsers(ctx, id)
	if err != nil || len(sbs) > 0 || len(snaps) > 0 {
		return
	}
	if err := m.store.DeleteSnapshot(ctx, id); err != nil {
		return
	}
	if len(sn.Layers) > 0 {
		if err := os.RemoveAll(filepath.Dir(sn.Layers[0])); err != nil {
			m.log.Error("remove snapshot layer", "snapshot", id, "err", err)
		}
	}
	m.audit("", "snapshot.removed", map[string]any{"snapshot": id, "bytes": sn.SizeBytes})
	if sn.Parent != "" {
		m.purgeSnapshot(ctx, sn.Parent)
	}
}

// purgeDeletedSnapshots is the reaper's pass over snapshots marked deleted.
func (m *Manager) purgeDeletedSnapshots(ctx context.Context) {
	ids, err := m.store.DeletedSnapshots(ctx)
	if err != nil {
		return
	}
	for _, id := range ids {
		m.purgeSnapshot(ctx, id)
	}
}

// Fork snapshots a live sandbox and starts count new sandboxes from the
// snapshot with the same template, runtime, tier, resources, network
// policy, secrets, metadata and task (env vars given at create are not
// kept in the record, so they are not copied; processes are not copied).
// Its snapshot and each create are work Shutdown waits for, each on its
// own (Snapshot, Create): once Shutdown has begun, what is left of the
// fork is refused with ErrShuttingDown.
func (m *Manager) Fork(ctx context.Context, id string, count int, ttl *int64) ([]*store.Sandbox, *store.Snapshot, error) {
	if count < 1 || count > MaxForkCount {
		return nil, nil, invalid("count must be 1..%d", MaxForkCount)
	}
	parent, err := m.Get(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	sn, err := m.Snapshot(ctx, id, "fork-"+id)
	if err != nil {
		return nil, nil, err
	}
	r := parent.Resources
	// A fork keeps its parent's port access (a private parent's forks
	// are private too), each with its own traffic token.
	public := parent.TrafficToken == ""
	var out []*store.Sandbox
	for i := 0; i < count; i++ {
		req := CreateRequest{PublicTraffic: &public,
			Snapshot: sn.ID, Runtime: parent.Runtime, Tier: parent.Tier,
			Resources: &ResourceRequest{CPU: r.CPU, MemoryMB: r.MemoryMB, DiskMB: r.DiskMB, Pids: r.Pids, Nofile: r.Nofile},
			Timeout:   ttl, Metadata: parent.Metadata, Network: parent.Network, Allow: parent.Egress.Allow,
			Secrets: parent.Egress.Secrets, Task: parent.TaskID, Volumes: volume.Requests(parent.Volumes),
			Team: parent.Team,
		}
		sb, err := m.Create(ctx, req)
		if err != nil {
			return out, sn, fmt.Errorf("fork %d of %d: %w", i+1, count, err)
		}
		out = append(out, sb)
	}
	return out, sn, nil
}
