package oci

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
)

// Snapshot copies the sandbox's overlay upper directory (its writable
// layer, with overlay whiteouts, opaque-directory xattrs and the shifted
// ownership) to dst while the sandbox is frozen with the cgroup freezer.
// dst must not exist; on failure nothing is left at dst.
func (d *Driver) Snapshot(ctx context.Context, id, dst string) (int64, error) {
	if err := d.held(id); err != nil {
		return 0, err
	}
	if _, err := os.Lstat(dst); err == nil {
		return 0, fmt.Errorf("snapshot destination %s exists", dst)
	}
	rc := d.binary(d.runtimeOf(id))
	st, err := rc.State(ctx, id)
	if err != nil {
		return 0, fmt.Errorf("state of %s: %w", id, err)
	}
	if st.Status != "paused" {
		if err := d.Pause(ctx, id); err != nil {
			return 0, fmt.Errorf("freeze %s for the snapshot: %w", id, err)
		}
		defer func() { _ = d.Resume(context.WithoutCancel(ctx), id) }()
	}
	upper := filepath.Join(d.dir(id), "disk", "upper")
	tmp := dst + ".partial"
	_ = os.RemoveAll(tmp)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return 0, err
	}
	// cp -a keeps device nodes (overlay whiteouts are 0:0 character
	// devices), ownership, modes, times and xattrs (trusted.overlay.opaque
	// marks opaque directories).
	out, err := exec.CommandContext(ctx, "cp", "-a", upper, tmp).CombinedOutput()
	if err != nil {
		_ = os.RemoveAll(tmp)
		return 0, fmt.Errorf("copy writable layer: %v: %s", err, out)
	}
	if err := os.Rename(tmp, dst); err != nil {
		_ = os.RemoveAll(tmp)
		return 0, err
	}
	var size int64
	err = filepath.WalkDir(dst, func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if info, ierr := e.Info(); ierr == nil && info.Mode().IsRegular() {
			size += info.Size()
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return size, err
	}
	return size, nil
}
