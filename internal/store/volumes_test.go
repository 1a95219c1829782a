package store

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"
)

func TestVolumes(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		s, err := Open(bk.addr(t))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Millisecond)
		a := &Volume{ID: "vaaaa", Name: "data", SizeMB: 1024, Token: "tok", CreatedAt: now}
		if err := s.InsertVolume(ctx, a); err != nil {
			t.Fatal(err)
		}
		if err := s.InsertVolume(ctx, &Volume{ID: "vbbbb", Name: "data", SizeMB: 16, CreatedAt: now}); !errors.Is(err, ErrVolumeExists) {
			t.Fatalf("duplicate name: %v", err)
		}
		for _, ref := range []string{"vaaaa", "data"} {
			got, err := s.GetVolume(ctx, "", ref)
			if err != nil || !reflect.DeepEqual(got, a) {
				t.Fatalf("get %s: %+v %v", ref, got, err)
			}
		}
		if _, err := s.GetVolume(ctx, "", "nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("get unknown: %v", err)
		}
		mk := func(id, state string, vols ...VolumeMount) {
			sb := &Sandbox{ID: id, Template: "base", Runtime: "runc", Tier: "light", State: state, CreatedAt: now, ExpiresAt: now.Add(time.Hour), Volumes: vols}
			if err := s.InsertSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
		mk("s1", "running", VolumeMount{ID: "vaaaa", Name: "data", Path: "/data"})
		mk("s2", "ended", VolumeMount{ID: "vaaaa", Name: "data", Path: "/data"})
		mk("s3", "paused", VolumeMount{ID: "vother", Name: "x", Path: "/x"}, VolumeMount{ID: "vaaaa", Name: "data", Path: "/d2"})
		mk("s4", "running")
		users, err := s.VolumeUsers(ctx, "vaaaa")
		if err != nil || !reflect.DeepEqual(users, []string{"s1", "s3"}) {
			t.Fatalf("users %v %v, want [s1 s3]", users, err)
		}
		got, err := s.GetSandbox(ctx, "s3")
		if err != nil || len(got.Volumes) != 2 || got.Volumes[1].Path != "/d2" {
			t.Fatalf("sandbox volumes %+v %v", got, err)
		}
		if err := s.DeleteVolume(ctx, "vaaaa"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteVolume(ctx, "vaaaa"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}
		if vs, err := s.ListVolumes(ctx, ""); err != nil || len(vs) != 0 {
			t.Fatalf("list after delete %v %v", vs, err)
		}
	})
}
