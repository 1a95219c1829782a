// Package volume keeps corral's volumes: persistent, size-capped file
// systems that outlive sandboxes and that sandboxes mount. Each volume is
// a sparse ext4 image file mounted through a loop device (nosuid, nodev)
// at DIR/<id>/mnt; its root directory belongs to the sandbox user, in the
// shifted uid range every sandbox uses. The size cap is the file system's
// own size, so a sandbox that fills a volume gets ENOSPC and the host's
// disk is not touched beyond it.
//
// A volume stays mounted while it exists, across server restarts: an
// image is never mounted twice (that would corrupt it), and a sandbox that
// outlives the server keeps its view.
package volume

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Size bounds, in MiB.
const (
	MinSizeMB     = 16
	DefaultSizeMB = 1024
	MaxSizeMB     = 1 << 20 // 1 TiB
)

// idRe is what a volume id looks like (corral makes them).
var idRe = regexp.MustCompile(`^[a-z0-9]{1,64}$`)

// Store creates, mounts and removes volumes under one directory. It is
// safe for concurrent use.
type Store struct {
	dir       string
	ownerUID  int // host uid (and gid) of the volume root: the shifted sandbox user
	accessGID int // the only host group that may traverse to a volume: the shifted sandbox root's
	mu        sync.Mutex
	mkfs, mnt string
}

// New returns a store under dir whose volume roots belong to host uid and
// gid owner. dir and each volume's directory are root:accessGID 0710:
// the runtime (as the shifted sandbox root, group accessGID) reaches the
// mounts, unprivileged host users do not.
func New(dir string, owner, accessGID int) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	if err := privateDir(dir, accessGID); err != nil {
		return nil, err
	}
	s := &Store{dir: dir, ownerUID: owner, accessGID: accessGID}
	var err error
	if s.mkfs, err = exec.LookPath("mkfs.ext4"); err != nil {
		return nil, fmt.Errorf("volumes need mkfs.ext4 (e2fsprogs): %w", err)
	}
	if s.mnt, err = exec.LookPath("mount"); err != nil {
		return nil, fmt.Errorf("volumes need mount (util-linux): %w", err)
	}
	return s, nil
}

// Path is where volume id is mounted on the host.
func (s *Store) Path(id string) string { return filepath.Join(s.dir, id, "mnt") }

func (s *Store) image(id string) string { return filepath.Join(s.dir, id, "image.ext4") }

// Create makes volume id of sizeMB MiB and mounts it. On error nothing is
// left behind.
func (s *Store) Create(ctx context.Context, id string, sizeMB int64) (err error) {
	if !idRe.MatchString(id) {
		return fmt.Errorf("volume id %q is not valid", id)
	}
	if sizeMB < MinSizeMB || sizeMB > MaxSizeMB {
		return fmt.Errorf("volume size %d MiB is outside %d..%d", sizeMB, MinSizeMB, MaxSizeMB)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	dir := filepath.Join(s.dir, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("volume %s: %w", id, err)
	}
	defer func() {
		if err != nil {
			_ = s.removeLocked(id)
		}
	}()
	if err := privateDir(dir, s.accessGID); err != nil {
		return err
	}
	f, err := os.OpenFile(s.image(id), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("volume %s: %w", id, err)
	}
	err = f.Truncate(sizeMB << 20) // sparse: only what is written takes disk
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("volume %s: size the image: %w", id, err)
	}
	owner := strconv.Itoa(s.ownerUID)
	if out, err := exec.CommandContext(ctx, s.mkfs, "-q", "-F", "-m", "0", "-L", "corral-"+id[:min(len(id), 9)],
		"-E", "root_owner="+owner+":"+owner, s.image(id)).CombinedOutput(); err != nil {
		return fmt.Errorf("volume %s: mkfs.ext4: %w: %s", id, err, strings.TrimSpace(string(out)))
	}
	if err := os.Mkdir(s.Path(id), 0o700); err != nil {
		return fmt.Errorf("volume %s: %w", id, err)
	}
	return s.mountLocked(ctx, id)
}

// Mount makes sure volume id is mounted (after a reboot, say) and returns
// its path. A volume that is mounted already is left as it is.
func (s *Store) Mount(ctx context.Context, id string) (string, error) {
	if !idRe.MatchString(id) {
		return "", fmt.Errorf("volume id %q is not valid", id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.mountLocked(ctx, id); err != nil {
		return "", err
	}
	return s.Path(id), nil
}

func (s *Store) mountLocked(ctx context.Context, id string) error {
	mp := s.Path(id)
	mounted, err := mountinfo.Mounted(mp)
	if err != nil {
		return fmt.Errorf("volume %s: %w", id, err)
	}
	if mounted {
		return nil
	}
	if _, err := os.Stat(s.image(id)); err != nil {
		return fmt.Errorf("volume %s: image: %w", id, err)
	}
	if out, err := exec.CommandContext(ctx, s.mnt, "-t", "ext4", "-o", "loop,nosuid,nodev", s.image(id), mp).CombinedOutput(); err != nil {
		return fmt.Errorf("volume %s: mount: %w: %s", id, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Remove unmounts volume id and deletes it. The caller makes sure no
// sandbox uses it: an unmount that finds it busy fails and keeps it.
func (s *Store) Remove(id string) error {
	if !idRe.MatchString(id) {
		return fmt.Errorf("volume id %q is not valid", id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.removeLocked(id)
}

func (s *Store) removeLocked(id string) error {
	mp := s.Path(id)
	if mounted, _ := mountinfo.Mounted(mp); mounted {
		// Not MNT_DETACH: a busy volume must fail here, not linger.
		if err := unix.Unmount(mp, 0); err != nil {
			return fmt.Errorf("volume %s: unmount: %w", id, err)
		}
	}
	if err := os.RemoveAll(filepath.Join(s.dir, id)); err != nil {
		return fmt.Errorf("volume %s: %w", id, err)
	}
	return nil
}

// Usage returns the bytes used and the size of volume id's file system.
func (s *Store) Usage(id string) (used, size int64, err error) {
	var st unix.Statfs_t
	mp := s.Path(id)
	if mounted, _ := mountinfo.Mounted(mp); !mounted {
		return 0, 0, fmt.Errorf("volume %s: %w", id, ErrNotMounted)
	}
	if err := unix.Statfs(mp, &st); err != nil {
		return 0, 0, fmt.Errorf("volume %s: %w", id, err)
	}
	bs := int64(st.Bsize)
	return (int64(st.Blocks) - int64(st.Bfree)) * bs, int64(st.Blocks) * bs, nil
}

// privateDir makes dir root:gid 0710.
func privateDir(dir string, gid int) error {
	if err := os.Chown(dir, 0, gid); err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	if err := os.Chmod(dir, 0o710); err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	return nil
}

// ErrNotMounted: the volume's file system is not mounted.
var ErrNotMounted = errors.New("not mounted")

// List returns the ids of the volumes on disk.
func (s *Store) List() ([]string, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && idRe.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}
