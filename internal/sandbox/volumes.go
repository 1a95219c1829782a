package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/corralhq/corral/internal/idgen"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/volume"
)

// Volume limits.
const (
	// MaxVolumesPerSandbox bounds the volumes one sandbox mounts.
	MaxVolumesPerSandbox = 8
	// MaxVolumes bounds the volumes of a server (each holds a loop device).
	MaxVolumes = 256
)

// VolumeRequest mounts a volume (by name or id) at Path in a new sandbox.
type VolumeRequest struct {
	Volume string `json:"volume"`
	Path   string `json:"path"`
}

// ErrVolumeNotFound: no volume has that name or id.
var ErrVolumeNotFound = errors.New("volume not found")

// ErrVolumesUnavailable: the server has no volume store.
var ErrVolumesUnavailable = errors.New("volumes are not available on this server (they need root, loop devices and mkfs.ext4)")

var volumeNameRe = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`)

// reservedMountPaths cannot hold a volume: the sandbox needs them as they
// are, or a volume there would hide the system.
var reservedMountPaths = []string{"/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr", "/var", "/tmp", "/home", "/home/user"}

// CreateVolume makes a volume of sizeMB MiB (0: volume.DefaultSizeMB).
func (m *Manager) CreateVolume(ctx context.Context, name string, sizeMB int64) (*store.Volume, error) {
	vs := m.cfg.Volumes
	if vs == nil {
		return nil, ErrVolumesUnavailable
	}
	if !volumeNameRe.MatchString(name) {
		return nil, invalid("volume name %q: use 1 to 63 of [a-zA-Z0-9._-], starting with a letter or digit", name)
	}
	if sizeMB == 0 {
		sizeMB = volume.DefaultSizeMB
	}
	if sizeMB < volume.MinSizeMB || sizeMB > volume.MaxSizeMB {
		return nil, invalid("volume size must be between %d and %d MiB", volume.MinSizeMB, volume.MaxSizeMB)
	}
	if _, err := m.store.GetVolume(ctx, name); err == nil {
		return nil, &ConflictError{Msg: fmt.Sprintf("a volume named %q exists", name)}
	}
	all, err := m.store.ListVolumes(ctx)
	if err != nil {
		return nil, err
	}
	if len(all) >= MaxVolumes {
		return nil, &ConflictError{Msg: fmt.Sprintf("this server holds %d volumes, the most it keeps; delete one first", MaxVolumes)}
	}
	m.volMu.Lock()
	defer m.volMu.Unlock()
	v := &store.Volume{ID: idgen.New("vol", 17), Name: name, SizeMB: sizeMB, Token: idgen.Token(), CreatedAt: time.Now().UTC()}
	if err := vs.Create(ctx, v.ID, sizeMB); err != nil {
		return nil, fmt.Errorf("create volume %s: %w", name, err)
	}
	if err := m.store.InsertVolume(ctx, v); err != nil {
		_ = vs.Remove(v.ID)
		if errors.Is(err, store.ErrVolumeExists) {
			return nil, &ConflictError{Msg: fmt.Sprintf("a volume named %q exists", name)}
		}
		return nil, err
	}
	m.audit("", "volume.created", map[string]any{"volume": v.ID, "name": name, "size_mb": sizeMB})
	return v, nil
}

// Volumes lists the volumes.
func (m *Manager) Volumes(ctx context.Context) ([]*store.Volume, error) {
	return m.store.ListVolumes(ctx)
}

// Volume returns the volume named or numbered ref.
func (m *Manager) Volume(ctx context.Context, ref string) (*store.Volume, error) {
	v, err := m.store.GetVolume(ctx, ref)
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrVolumeNotFound
	}
	return v, err
}

// VolumeUsage returns the bytes a volume uses and its file system's size.
func (m *Manager) VolumeUsage(v *store.Volume) (used, size int64, err error) {
	if m.cfg.Volumes == nil {
		return 0, 0, ErrVolumesUnavailable
	}
	return m.cfg.Volumes.Usage(v.ID)
}

// IDBase is the host uid/gid that sandbox uid/gid 0 maps to (the base of
// the server's uid range): volume files of sandbox uid N are owned by host
// uid IDBase+N.
func (m *Manager) IDBase() uint32 { return m.cfg.IDBase }

// VolumePath returns the host directory of a volume (mounting it if the
// host lost the mount), for the volume content API.
func (m *Manager) VolumePath(ctx context.Context, v *store.Volume) (string, error) {
	if m.cfg.Volumes == nil {
		return "", ErrVolumesUnavailable
	}
	return m.cfg.Volumes.Mount(ctx, v.ID)
}

// DeleteVolume deletes a volume and everything on it. A volume that a
// sandbox (running or paused) mounts is not deleted.
func (m *Manager) DeleteVolume(ctx context.Context, ref string) error {
	vs := m.cfg.Volumes
	if vs == nil {
		return ErrVolumesUnavailable
	}
	m.volMu.Lock()
	defer m.volMu.Unlock()
	v, err := m.Volume(ctx, ref)
	if err != nil {
		return err
	}
	users, err := m.store.VolumeUsers(ctx, v.ID)
	if err != nil {
		return err
	}
	if len(users) > 0 {
		return &ConflictError{Msg: fmt.Sprintf("volume %s is mounted by sandbox %s", v.Name, strings.Join(users, ", "))}
	}
	if err := vs.Remove(v.ID); err != nil {
		return &ConflictError{Msg: fmt.Sprintf("volume %s could not be removed: %v", v.Name, err)}
	}
	if err := m.store.DeleteVolume(ctx, v.ID); err != nil {
		return err
	}
	m.audit("", "volume.deleted", map[string]any{"volume": v.ID, "name": v.Name})
	return nil
}

// purgeOrphanVolumes removes volumes on disk that have no record (a
// create that crashed between making the file system and recording it).
// It skips the round while a volume is being created or deleted.
func (m *Manager) purgeOrphanVolumes(ctx context.Context) {
	vs := m.cfg.Volumes
	if vs == nil || !m.volMu.TryLock() {
		return
	}
	defer m.volMu.Unlock()
	ids, err := vs.List()
	if err != nil {
		m.log.Error("reaper: list volumes", "err", err)
		return
	}
	for _, id := range ids {
		if _, err := m.store.GetVolume(ctx, id); !errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err := vs.Remove(id); err != nil {
			m.log.Error("reaper: remove volume", "volume", id, "err", err)
			continue
		}
		m.audit("", "reaper.reclaimed", map[string]any{"what": "volume " + id, "reason": "no_record"})
	}
}

// gvisorNoVolumes explains why gVisor sandboxes cannot mount volumes here.
const gvisorNoVolumes = "gVisor sandboxes cannot mount volumes on this host: Debian's runsc (2022) answers stat on a bind-mounted volume with EINVAL; use runtime runc for volumes"

// resolveVolumes checks a create's volume requests and returns what the
// record and the runtime get. It mounts the volumes if the host lost
// their mounts (after a reboot). The caller holds m.volMu for reading.
func (m *Manager) resolveVolumes(ctx context.Context, rt runtime.Runtime, reqs []VolumeRequest) ([]store.VolumeMount, []runtime.FileBind, error) {
	if len(reqs) == 0 {
		return nil, nil, nil
	}
	if m.cfg.Volumes == nil {
		return nil, nil, ErrVolumesUnavailable
	}
	if rt == runtime.GVisor {
		return nil, nil, invalid(gvisorNoVolumes)
	}
	if len(reqs) > MaxVolumesPerSandbox {
		return nil, nil, invalid("a sandbox mounts at most %d volumes", MaxVolumesPerSandbox)
	}
	var mounts []store.VolumeMount
	for _, r := range reqs {
		p := r.Path
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || strings.ContainsAny(p, "\x00:,") {
			return nil, nil, invalid("volume mount path %q must be absolute and clean", p)
		}
		if slices.Contains(reservedMountPaths, p) || strings.HasPrefix(p, "/proc/") || strings.HasPrefix(p, "/sys/") || strings.HasPrefix(p, "/dev/") {
			return nil, nil, invalid("volume mount path %q is reserved; use a path such as /data or /home/user/data", p)
		}
		for _, other := range mounts {
			if p == other.Path || strings.HasPrefix(p, other.Path+"/") || strings.HasPrefix(other.Path, p+"/") {
				return nil, nil, invalid("volume mount paths %q and %q overlap", other.Path, p)
			}
			if other.ID == r.Volume || other.Name == r.Volume {
				return nil, nil, invalid("volume %q is mounted twice", r.Volume)
			}
		}
		v, err := m.Volume(ctx, r.Volume)
		if errors.Is(err, ErrVolumeNotFound) {
			return nil, nil, invalid("volume %q does not exist", r.Volume)
		}
		if err != nil {
			return nil, nil, err
		}
		mounts = append(mounts, store.VolumeMount{ID: v.ID, Name: v.Name, Path: p})
	}
	binds, err := m.volumeBinds(ctx, mounts)
	return mounts, binds, err
}

// volumeBinds mounts each volume on the host if needed and returns the
// binds the runtime makes.
func (m *Manager) volumeBinds(ctx context.Context, mounts []store.VolumeMount) ([]runtime.FileBind, error) {
	if len(mounts) == 0 {
		return nil, nil
	}
	if m.cfg.Volumes == nil {
		return nil, ErrVolumesUnavailable
	}
	var binds []runtime.FileBind
	for _, vm := range mounts {
		dir, err := m.cfg.Volumes.Mount(ctx, vm.ID)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", vm.Name, err)
		}
		binds = append(binds, runtime.FileBind{Source: dir, Destination: vm.Path})
	}
	return binds, nil
}

// volumeRequests turns a record's mounts back into requests (fork).
func volumeRequests(mounts []store.VolumeMount) []VolumeRequest {
	var out []VolumeRequest
	for _, vm := range mounts {
		out = append(out, VolumeRequest{Volume: vm.ID, Path: vm.Path})
	}
	return out
}
