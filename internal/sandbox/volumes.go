package sandbox

import (
	"context"
	"errors"

	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/volume"
)

// volumes is what the Manager needs of the server's volumes
// (*volume.Service): check a create's requests, mount them for the
// runtime, keep them from deletion while a sandbox starts with them, and
// reclaim volumes without a record (the reaper).
type volumes interface {
	Resolve(ctx context.Context, team string, reqs []volume.Request) ([]store.VolumeMount, error)
	Binds(ctx context.Context, mounts []store.VolumeMount) ([]runtime.FileBind, error)
	Hold() (release func())
	PurgeOrphans(ctx context.Context)
}

// gvisorNoVolumes explains why gVisor sandboxes cannot mount volumes
// under a legacy runsc (Config.GVisorLegacy).
const gvisorNoVolumes = "gVisor sandboxes cannot mount volumes on this server: it runs Debian's runsc (2022), which answers stat on a bind-mounted volume with EINVAL (make runsc builds the pinned one); use runtime runc for volumes"

// holdVolumes keeps the volumes from deletion while a create that mounts
// some runs (volumes.Hold); it returns the release.
func (m *Manager) holdVolumes(reqs []volume.Request) func() {
	if len(reqs) == 0 || m.cfg.Volumes == nil {
		return func() {}
	}
	return m.cfg.Volumes.Hold()
}

// resolveVolumes checks the volume requests of a create of team's
// sandbox (team's volumes only) and returns what the record and the
// runtime get. It mounts the volumes if the host lost
// their mounts (after a reboot). The caller holds the volumes
// (holdVolumes).
func (m *Manager) resolveVolumes(ctx context.Context, team string, rt runtime.Runtime, reqs []volume.Request) ([]store.VolumeMount, []runtime.FileBind, error) {
	if len(reqs) == 0 {
		return nil, nil, nil
	}
	if m.cfg.Volumes == nil {
		return nil, nil, volume.ErrUnavailable
	}
	if rt == runtime.GVisor && m.cfg.GVisorLegacy {
		return nil, nil, invalid(gvisorNoVolumes)
	}
	mounts, err := m.cfg.Volumes.Resolve(ctx, team, reqs)
	var inv *volume.InvalidError
	if errors.As(err, &inv) {
		return nil, nil, invalid("%s", inv.Msg)
	}
	if err != nil {
		return nil, nil, err
	}
	binds, err := m.cfg.Volumes.Binds(ctx, mounts)
	return mounts, binds, err
}

// volumeBinds mounts a record's volumes on the host if needed and returns
// the binds the runtime makes (restart of a persisted sandbox).
func (m *Manager) volumeBinds(ctx context.Context, mounts []store.VolumeMount) ([]runtime.FileBind, error) {
	if len(mounts) == 0 {
		return nil, nil
	}
	if m.cfg.Volumes == nil {
		return nil, volume.ErrUnavailable
	}
	return m.cfg.Volumes.Binds(ctx, mounts)
}
