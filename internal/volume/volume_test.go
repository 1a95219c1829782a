package volume

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/moby/sys/mountinfo"
)

func newStore(t *testing.T) *Store {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("volumes need root (loop mounts)")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("volumes need loop devices: " + err.Error())
	}
	s, err := New(t.TempDir(), 101000, 100000)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func countMounts(t *testing.T, mp string) int {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(mp))
	if err != nil {
		t.Fatal(err)
	}
	return len(ms)
}

// TestVolumeLifecycle: a created volume is a mounted ext4 owned by the
// shifted sandbox user, capped at its size (ENOSPC past it), mounted once
// however often Mount is called, and gone from the host after Remove.
func TestVolumeLifecycle(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	if err := s.Create(ctx, "vol1", 16); err != nil {
		t.Fatal(err)
	}
	mp := s.Path("vol1")
	if n := countMounts(t, mp); n != 1 {
		t.Fatalf("%d mounts at %s, want 1", n, mp)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(mp, &st); err != nil || st.Uid != 101000 || st.Gid != 101000 {
		t.Fatalf("volume root owned by %d:%d (%v), want 101000:101000", st.Uid, st.Gid, err)
	}
	for i := 0; i < 3; i++ {
		if _, err := s.Mount(ctx, "vol1"); err != nil {
			t.Fatal(err)
		}
	}
	if n := countMounts(t, mp); n != 1 {
		t.Fatalf("Mount mounted the image again: %d mounts", n)
	}
	// The cap: writing 32 MiB into a 16 MiB volume ends in ENOSPC.
	f, err := os.Create(filepath.Join(mp, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	var werr error
	for i := 0; i < 32 && werr == nil; i++ {
		_, werr = f.Write(buf)
	}
	if werr == nil {
		werr = f.Sync()
	}
	f.Close()
	if !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("filling the volume: %v, want ENOSPC", werr)
	}
	used, size, err := s.Usage("vol1")
	if err != nil || size <= 0 || size > 16<<20 || used < size/2 {
		t.Fatalf("usage %d of %d (%v)", used, size, err)
	}
	ids, err := s.List()
	if err != nil || len(ids) != 1 || ids[0] != "vol1" {
		t.Fatalf("list %v %v", ids, err)
	}

	// A busy volume is not removed.
	busy, err := os.Open(filepath.Join(mp, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("vol1"); err == nil {
		t.Fatal("removed a volume with an open file")
	}
	busy.Close()
	if err := s.Remove("vol1"); err != nil {
		t.Fatal(err)
	}
	if n := countMounts(t, mp); n != 0 {
		t.Fatalf("%d mounts left at %s", n, mp)
	}
	if _, err := os.Stat(filepath.Dir(mp)); !os.IsNotExist(err) {
		t.Fatalf("volume dir left: %v", err)
	}
}

func TestVolumeCreateErrors(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	tests := []struct {
		name, id string
		size     int64
		want     string
	}{
		{"bad id", "../x", 16, "not valid"},
		{"upper case", "Vol", 16, "not valid"},
		{"too small", "v", MinSizeMB - 1, "outside"},
		{"too big", "v", MaxSizeMB + 1, "outside"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.Create(ctx, tc.id, tc.size); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
	if ids, _ := s.List(); len(ids) != 0 {
		t.Fatalf("failed creates left %v", ids)
	}
	if err := s.Create(ctx, "dup", 16); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Remove("dup") })
	if err := s.Create(ctx, "dup", 16); err == nil {
		t.Fatal("created a volume twice")
	}
	if n := countMounts(t, s.Path("dup")); n != 1 {
		t.Fatalf("the second create changed the first: %d mounts", n)
	}
}
