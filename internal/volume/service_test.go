package volume

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/store"
)

// TestResolveRefusesBadMounts: a create's volume requests are hostile
// input (a caller could mount a volume over /etc or /proc to hide the
// system from the sandbox, or the same volume twice, which would mount
// one ext4 image twice and corrupt it). Each bad request is refused with
// an InvalidError naming the problem, and a good one resolves to the
// volume's id. It runs without root: Resolve reads only records.
func TestResolveRefusesBadMounts(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	for _, v := range []*store.Volume{{ID: "vola", Name: "a"}, {ID: "volb", Name: "b"}} {
		v.SizeMB, v.Token, v.CreatedAt = 16, "tok-"+v.ID, time.Now()
		if err := st.InsertVolume(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	s := NewService(&Store{}, st, nil, nil)
	many := make([]Request, MaxPerSandbox+1)
	for i := range many {
		many[i] = Request{Volume: "a", Path: "/data" + strings.Repeat("x", i)}
	}
	for _, tc := range []struct {
		name string
		reqs []Request
		want string // "" for success
	}{
		{"ok", []Request{{"a", "/data"}, {"volb", "/home/user/b"}}, ""},
		{"relative", []Request{{"a", "data"}}, "must be absolute and clean"},
		{"unclean", []Request{{"a", "/data/../etc"}}, "must be absolute and clean"},
		{"comma", []Request{{"a", "/data,ro"}}, "must be absolute and clean"},
		{"over /etc", []Request{{"a", "/etc"}}, "is reserved"},
		{"under /proc", []Request{{"a", "/proc/self"}}, "is reserved"},
		{"nested", []Request{{"a", "/data"}, {"b", "/data/b"}}, "overlap"},
		{"twice", []Request{{"a", "/data"}, {"vola", "/other"}}, "mounted twice"},
		{"missing", []Request{{"nope", "/data"}}, "does not exist"},
		{"too many", many, "at most"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mounts, err := s.Resolve(ctx, "", tc.reqs)
			if tc.want == "" {
				if err != nil || len(mounts) != 2 || mounts[0].ID != "vola" || mounts[1].ID != "volb" {
					t.Fatalf("Resolve = %+v, %v", mounts, err)
				}
				return
			}
			var inv *InvalidError
			if !errors.As(err, &inv) || !strings.Contains(inv.Msg, tc.want) {
				t.Fatalf("Resolve = %+v, %v; want an InvalidError containing %q", mounts, err, tc.want)
			}
		})
	}
}

// TestServiceWithoutDisk: a server without loop devices or mkfs.ext4
// runs without volumes; every call that needs a file system answers
// ErrUnavailable (API: 503 volumes_unavailable) and changes nothing.
func TestServiceWithoutDisk(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	if err := st.InsertVolume(ctx, &store.Volume{ID: "vola", Name: "a", SizeMB: 16, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	s := NewService(nil, st, nil, nil)
	if _, err := s.Create(ctx, "", "b", 0); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Create: %v", err)
	}
	if err := s.Delete(ctx, "", "a"); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Delete: %v", err)
	}
	if _, err := s.Resolve(ctx, "", []Request{{"a", "/data"}}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Resolve: %v", err)
	}
	if vs, err := s.List(ctx, ""); err != nil || len(vs) != 1 {
		t.Errorf("List: %v, %v; want the one recorded volume", vs, err)
	}
}

// TestResolveOnlyOwnTeam: a create may mount only its own team's
// volumes. Team B naming team A's volume (by name or by id) must be
// refused exactly as a volume that does not exist — the same error text —
// so that B can neither mount A's data nor learn that A has a volume of
// that name; B's own volume of the same name resolves to B's.
func TestResolveOnlyOwnTeam(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	for _, v := range []*store.Volume{{ID: "vola", Team: "team-a", Name: "data"}, {ID: "volb", Team: "team-b", Name: "data"}, {ID: "volx", Team: "team-a", Name: "only-a"}} {
		v.SizeMB, v.Token, v.CreatedAt = 16, "tok-"+v.ID, time.Now()
		if err := st.InsertVolume(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	s := NewService(&Store{}, st, nil, nil)
	if m, err := s.Resolve(ctx, "team-b", []Request{{"data", "/data"}}); err != nil || len(m) != 1 || m[0].ID != "volb" {
		t.Fatalf("team B's own data: %+v, %v; want volb", m, err)
	}
	_, missing := s.Resolve(ctx, "team-b", []Request{{"nope", "/data"}})
	for _, ref := range []string{"only-a", "volx", "vola"} {
		_, err := s.Resolve(ctx, "team-b", []Request{{ref, "/data"}})
		var inv *InvalidError
		if !errors.As(err, &inv) || err.Error() != strings.Replace(missing.Error(), "nope", ref, 1) {
			t.Errorf("team B mounts team A's %q: %v; want the error of a missing volume (%v)", ref, err, missing)
		}
		if _, err := s.Get(ctx, "team-b", ref); !errors.Is(err, ErrNotFound) {
			t.Errorf("team B gets team A's %q: %v, want ErrNotFound", ref, err)
		}
	}
}
