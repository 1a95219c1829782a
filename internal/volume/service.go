package volume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/corralhq/corral/internal/idgen"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/store"
)

// Limits of the volume service.
const (
	// MaxPerSandbox bounds the volumes one sandbox mounts.
	MaxPerSandbox = 8
	// MaxVolumes bounds the volumes of a server (each holds a loop device).
	MaxVolumes = 256
)

// Request mounts a volume (by name or id) at Path in a new sandbox.
type Request struct {
	Volume string `json:"volume"`
	Path   string `json:"path"`
}

// ErrNotFound: no volume has that name or id.
var ErrNotFound = errors.New("volume not found")

// ErrUnavailable: the server has no volume store.
var ErrUnavailable = errors.New("volumes are not available on this server (they need root, loop devices and mkfs.ext4)")

// InvalidError is a request the caller must fix (API: 400 invalid_argument).
type InvalidError struct{ Msg string }

func (e *InvalidError) Error() string { return e.Msg }

func invalid(format string, args ...any) error {
	return &InvalidError{Msg: fmt.Sprintf(format, args...)}
}

// ConflictError refuses a call the volumes' state does not allow (API:
// 409 conflict): a name taken, a volume in use.
type ConflictError struct{ Msg string }

func (e *ConflictError) Error() string { return e.Msg }

// auditRecorder records volume events in the audit log (*audit.Log),
// with the team and key id of the request that caused them.
type auditRecorder interface {
	RecordBy(ctx context.Context, sandbox, kind string, data any)
}

var nameRe = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`)

// reservedMountPaths cannot hold a volume: the sandbox needs them as they
// are, or a volume there would hide the system.
var reservedMountPaths = []string{"/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr", "/var", "/tmp", "/home", "/home/user"}

// Service is the server's volumes: their records in the store, their
// file systems (Store) and the lock that keeps a volume from being
// deleted under a sandbox that is starting with it. It is safe for
// concurrent use.
type Service struct {
	disk  *Store // nil: volumes are unavailable
	st    *store.Store
	audit auditRecorder
	log   *slog.Logger
	// mu: creates of sandboxes that mount volumes hold it shared (Hold)
	// until their sandbox is recorded and started; volume creation and
	// deletion hold it exclusively, so a volume is never deleted under a
	// starting sandbox.
	mu sync.RWMutex
}

// NewService returns the volume service over disk (nil: every call that
// needs a file system fails with ErrUnavailable) and the store's records.
// audit may be nil.
func NewService(disk *Store, st *store.Store, audit auditRecorder, log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	return &Service{disk: disk, st: st, audit: audit, log: log}
}

func (s *Service) record(ctx context.Context, kind string, data any) {
	if s.audit != nil {
		s.audit.RecordBy(ctx, "", kind, data)
	}
}

// Create makes a volume of team (the caller's) of sizeMB MiB (0:
// DefaultSizeMB). Names are per team: another team's volume of that name
// neither conflicts nor is mentioned.
func (s *Service) Create(ctx context.Context, team, name string, sizeMB int64) (*store.Volume, error) {
	if team == "" {
		team = store.DefaultTeam
	}
	if !nameRe.MatchString(name) {
		return nil, invalid("volume name %q: use 1 to 63 of [a-zA-Z0-9._-], starting with a letter or digit", name)
	}
	if sizeMB == 0 {
		sizeMB = DefaultSizeMB
	}
	if sizeMB < MinSizeMB || sizeMB > MaxSizeMB {
		return nil, invalid("volume size must be between %d and %d MiB", MinSizeMB, MaxSizeMB)
	}
	if _, err := s.st.GetVolume(ctx, team, name); err == nil {
		return nil, &ConflictError{Msg: fmt.Sprintf("a volume named %q exists", name)}
	}
	if s.disk == nil {
		return nil, ErrUnavailable
	}
	n, err := s.st.CountVolumes(ctx)
	if err != nil {
		return nil, err
	}
	if n >= MaxVolumes {
		return nil, &ConflictError{Msg: fmt.Sprintf("this server holds %d volumes, the most it keeps; delete one first", MaxVolumes)}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v := &store.Volume{ID: idgen.New("vol", 17), Team: team, Name: name, SizeMB: sizeMB, Token: idgen.Token(), CreatedAt: time.Now().UTC()}
	if err := s.disk.Create(ctx, v.ID, sizeMB); err != nil {
		return nil, fmt.Errorf("create volume %s: %w", name, err)
	}
	if err := s.st.InsertVolume(ctx, v); err != nil {
		_ = s.disk.Remove(v.ID)
		if errors.Is(err, store.ErrVolumeExists) {
			return nil, &ConflictError{Msg: fmt.Sprintf("a volume named %q exists", name)}
		}
		return nil, err
	}
	s.record(ctx, "volume.created", map[string]any{"volume": v.ID, "name": name, "size_mb": sizeMB})
	return v, nil
}

// List lists team's volumes ("" = every team's).
func (s *Service) List(ctx context.Context, team string) ([]*store.Volume, error) {
	return s.st.ListVolumes(ctx, team)
}

// Get returns team's volume named or numbered ref (team "": any team's,
// see store.GetVolume). Another team's volume is ErrNotFound, exactly as
// a missing one.
func (s *Service) Get(ctx context.Context, team, ref string) (*store.Volume, error) {
	v, err := s.st.GetVolume(ctx, team, ref)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, ErrNotFound
	case errors.Is(err, store.ErrAmbiguous):
		return nil, invalid("volume name %q is used by several teams: give the volume's id, or the team with ?team=", ref)
	}
	return v, err
}

// Usage returns the bytes a volume uses and its file system's size.
func (s *Service) Usage(v *store.Volume) (used, size int64, err error) {
	if s.disk == nil {
		return 0, 0, ErrUnavailable
	}
	return s.disk.Usage(v.ID)
}

// Path returns the host directory of a volume (mounting it if the host
// lost the mount), for the volume content API.
func (s *Service) Path(ctx context.Context, v *store.Volume) (string, error) {
	if s.disk == nil {
		return "", ErrUnavailable
	}
	return s.disk.Mount(ctx, v.ID)
}

// Delete deletes team's volume ref (see Get) and everything on it. A
// volume that a sandbox (running or paused) mounts is not deleted.
func (s *Service) Delete(ctx context.Context, team, ref string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.Get(ctx, team, ref)
	if err != nil {
		return err
	}
	if s.disk == nil {
		return ErrUnavailable
	}
	users, err := s.st.VolumeUsers(ctx, v.ID)
	if err != nil {
		return err
	}
	if len(users) > 0 {
		return &ConflictError{Msg: fmt.Sprintf("volume %s is mounted by sandbox %s", v.Name, strings.Join(users, ", "))}
	}
	if err := s.disk.Remove(v.ID); err != nil {
		return &ConflictError{Msg: fmt.Sprintf("volume %s could not be removed: %v", v.Name, err)}
	}
	if err := s.st.DeleteVolume(ctx, v.ID); err != nil {
		return err
	}
	s.record(ctx, "volume.deleted", map[string]any{"volume": v.ID, "name": v.Name, "team": v.Team})
	return nil
}

// Hold keeps every volume from deletion until release is called: a
// create that mounts volumes holds it from the check of its requests
// until its sandbox is recorded and started.
func (s *Service) Hold() (release func()) {
	s.mu.RLock()
	return s.mu.RUnlock
}

// PurgeOrphans removes volumes on disk that have no record (a create
// that crashed between making the file system and recording it). It
// skips the round while a volume is being created or deleted, or a
// sandbox with volumes starts.
func (s *Service) PurgeOrphans(ctx context.Context) {
	if s.disk == nil || !s.mu.TryLock() {
		return
	}
	defer s.mu.Unlock()
	ids, err := s.disk.List()
	if err != nil {
		s.log.Error("reaper: list volumes", "err", err)
		return
	}
	for _, id := range ids {
		if _, err := s.st.GetVolume(ctx, "", id); !errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err := s.disk.Remove(id); err != nil {
			s.log.Error("reaper: remove volume", "volume", id, "err", err)
			continue
		}
		s.record(ctx, "reaper.reclaimed", map[string]any{"what": "volume " + id, "reason": "no_record"})
	}
}

// Resolve checks the volume requests of a create of team's sandbox
// (count, mount paths, that each volume exists in team) and returns the
// record's mounts. Another team's volume is refused exactly as a missing
// one: a sandbox never mounts another team's volume, and the answer does
// not tell whether its name or id exists. The caller holds Hold.
func (s *Service) Resolve(ctx context.Context, team string, reqs []Request) ([]store.VolumeMount, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	if len(reqs) > MaxPerSandbox {
		return nil, invalid("a sandbox mounts at most %d volumes", MaxPerSandbox)
	}
	if team == "" { // never every team's: a sandbox has one team
		team = store.DefaultTeam
	}
	var mounts []store.VolumeMount
	for _, r := range reqs {
		p := r.Path
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || strings.ContainsAny(p, "\x00:,") {
			return nil, invalid("volume mount path %q must be absolute and clean", p)
		}
		if slices.Contains(reservedMountPaths, p) || strings.HasPrefix(p, "/proc/") || strings.HasPrefix(p, "/sys/") || strings.HasPrefix(p, "/dev/") {
			return nil, invalid("volume mount path %q is reserved; use a path such as /data or /home/user/data", p)
		}
		for _, other := range mounts {
			if p == other.Path || strings.HasPrefix(p, other.Path+"/") || strings.HasPrefix(other.Path, p+"/") {
				return nil, invalid("volume mount paths %q and %q overlap", other.Path, p)
			}
			if other.ID == r.Volume || other.Name == r.Volume {
				return nil, invalid("volume %q is mounted twice", r.Volume)
			}
		}
		v, err := s.Get(ctx, team, r.Volume)
		if errors.Is(err, ErrNotFound) {
			return nil, invalid("volume %q does not exist", r.Volume)
		}
		if err != nil {
			return nil, err
		}
		mounts = append(mounts, store.VolumeMount{ID: v.ID, Name: v.Name, Path: p})
	}
	if s.disk == nil {
		return nil, ErrUnavailable
	}
	return mounts, nil
}

// Binds mounts each volume on the host if needed (after a reboot) and
// returns the binds the runtime makes.
func (s *Service) Binds(ctx context.Context, mounts []store.VolumeMount) ([]runtime.FileBind, error) {
	if len(mounts) == 0 {
		return nil, nil
	}
	if s.disk == nil {
		return nil, ErrUnavailable
	}
	var binds []runtime.FileBind
	for _, vm := range mounts {
		dir, err := s.disk.Mount(ctx, vm.ID)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", vm.Name, err)
		}
		binds = append(binds, runtime.FileBind{Source: dir, Destination: vm.Path})
	}
	return binds, nil
}

// Requests turns a record's mounts back into requests (fork).
func Requests(mounts []store.VolumeMount) []Request {
	var out []Request
	for _, vm := range mounts {
		out = append(out, Request{Volume: vm.ID, Path: vm.Path})
	}
	return out
}
