package store

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// oldLayoutDB makes a database with the volumes, secrets and pools
// tables as corral made them before teams (name as the key), holding one
// row each.
func oldLayoutDB(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "corral.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`
		CREATE TABLE volumes (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, size_mb INTEGER NOT NULL, token TEXT NOT NULL, created_at INTEGER NOT NULL);
		CREATE TABLE secrets (name TEXT PRIMARY KEY, hosts TEXT NOT NULL, header TEXT NOT NULL, value TEXT NOT NULL,
			created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL);
		CREATE TABLE pools (template TEXT PRIMARY KEY, min INTEGER NOT NULL, max INTEGER NOT NULL, max_idle_s INTEGER NOT NULL);
		INSERT INTO volumes VALUES ('volold', 'data', 64, 'tok-old', 1000);
		INSERT INTO secrets VALUES ('github', '["api.github.com"]', 'Authorization', 'Bearer old-value', 1, 2);
		INSERT INTO pools VALUES ('base', 2, 3, 600);`); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTeamTablesMigrateFromOldLayout: a database made before teams keyed
// volumes, secrets and pools by name alone, and SQLite cannot change a
// key in place. On open the tables are rebuilt with (team, name) keys:
// every old row is kept and belongs to team default, and afterwards
// another team can use the same names (the old UNIQUE(name) would refuse
// them, or — for secrets and pools, keyed by name — replace team
// default's row, handing one team's credential to another). A second
// open changes nothing.
func TestTeamTablesMigrateFromOldLayout(t *testing.T) {
	ctx := context.Background()
	path := oldLayoutDB(t)
	for round := range 2 { // the second open finds the new layout
		s, err := Open(path)
		if err != nil {
			t.Fatalf("open %d: %v", round, err)
		}
		v, err := s.GetVolume(ctx, DefaultTeam, "data")
		if err != nil || v.ID != "volold" || v.Team != DefaultTeam || v.Token != "tok-old" || v.SizeMB != 64 {
			t.Fatalf("open %d: old volume %+v, %v; want kept, of team default", round, v, err)
		}
		sec, err := s.GetSecret(ctx, DefaultTeam, "github")
		if err != nil || sec.Value != "Bearer old-value" || sec.Team != DefaultTeam || sec.AllowHTTP {
			t.Fatalf("open %d: old secret %+v, %v; want kept, of team default", round, sec, err)
		}
		pools, err := s.ListPools(ctx)
		if err != nil || len(pools) == 0 || pools[0] != (Pool{Team: DefaultTeam, Template: "base", Min: 2, Max: 3, MaxIdleS: 600}) {
			t.Fatalf("open %d: old pools %+v, %v", round, pools, err)
		}
		if round == 0 {
			// The same names in another team, next to the old rows.
			if err := s.InsertVolume(ctx, &Volume{ID: "volb", Team: "team-b", Name: "data", SizeMB: 16, Token: "tok-b", CreatedAt: time.Now()}); err != nil {
				t.Fatalf("team B's volume named like default's: %v", err)
			}
			if err := s.PutSecret(ctx, &Secret{Team: "team-b", Name: "github", Hosts: []string{"api.github.com"}, Header: "Authorization", Value: "Bearer team-b"}); err != nil {
				t.Fatal(err)
			}
			if err := s.PutPool(ctx, Pool{Team: "team-b", Template: "base", Min: 1, Max: 1, MaxIdleS: 60}); err != nil {
				t.Fatal(err)
			}
		}
		if vs, _ := s.ListVolumes(ctx, ""); len(vs) != 2 {
			t.Fatalf("open %d: volumes %+v, want default's and team B's", round, vs)
		}
		if secs, _ := s.ListSecrets(ctx, ""); len(secs) != 2 {
			t.Fatalf("open %d: secrets %+v, want default's and team B's", round, secs)
		}
		if ps, _ := s.ListPools(ctx); len(ps) != 2 {
			t.Fatalf("open %d: pools %+v, want default's and team B's", round, ps)
		}
		s.Close()
	}
}

// TestSameNamesInTwoTeams: volumes, secrets and pools of one name in two
// teams are two records that never mix: each team's lookup finds its
// own, another team's record answers exactly as a missing one
// (ErrNotFound, never "exists"), a team's delete or replace touches its
// own only, and a list is of one team ("" = every team's, an admin's
// ?team=all). A name looked up in every team that two teams use is
// ErrAmbiguous, never one of them at random.
func TestSameNamesInTwoTeams(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		now := time.Now()
		for _, v := range []*Volume{{ID: "vola", Team: "team-a", Name: "data"}, {ID: "volb", Team: "team-b", Name: "data"}} {
			v.SizeMB, v.Token, v.CreatedAt = 16, "tok-"+v.ID, now
			if err := s.InsertVolume(ctx, v); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.InsertVolume(ctx, &Volume{ID: "vola2", Team: "team-a", Name: "data", SizeMB: 16, CreatedAt: now}); !errors.Is(err, ErrVolumeExists) {
			t.Fatalf("a second volume named data in team A: %v, want ErrVolumeExists", err)
		}
		for _, tc := range []struct{ team, ref, want string }{
			{"team-a", "data", "vola"}, {"team-b", "data", "volb"}, {"team-a", "vola", "vola"},
			{"team-a", "volb", ""}, {"team-b", "vola", ""}, {"team-c", "data", ""},
			{"", "volb", "volb"}, // every team's, by id
		} {
			v, err := s.GetVolume(ctx, tc.team, tc.ref)
			if tc.want == "" {
				if !errors.Is(err, ErrNotFound) {
					t.Errorf("team %q gets volume %q: %+v, %v; want ErrNotFound", tc.team, tc.ref, v, err)
				}
				continue
			}
			if err != nil || v.ID != tc.want {
				t.Errorf("team %q gets volume %q: %+v, %v; want %s", tc.team, tc.ref, v, err, tc.want)
			}
		}
		if _, err := s.GetVolume(ctx, "", "data"); !errors.Is(err, ErrAmbiguous) {
			t.Errorf("every team's volume named data: %v, want ErrAmbiguous", err)
		}
		if vs, _ := s.ListVolumes(ctx, "team-b"); len(vs) != 1 || vs[0].ID != "volb" {
			t.Errorf("team B's volumes: %+v", vs)
		}

		for _, team := range []string{"team-a", "team-b"} {
			if err := s.PutSecret(ctx, &Secret{Team: team, Name: "github", Hosts: []string{"api.github.com"}, Header: "Authorization", Value: "Bearer " + team}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.PutSecret(ctx, &Secret{Team: "team-b", Name: "github", Hosts: []string{"x.test"}, Header: "Authorization", Value: "Bearer b-rotated"}); err != nil {
			t.Fatal(err)
		}
		if a, err := s.GetSecret(ctx, "team-a", "github"); err != nil || a.Value != "Bearer team-a" || a.Hosts[0] != "api.github.com" {
			t.Fatalf("team A's secret after team B replaced its own: %+v, %v", a, err)
		}
		if _, err := s.GetSecret(ctx, "team-c", "github"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("team C gets github: %v, want ErrNotFound", err)
		}
		if err := s.DeleteSecret(ctx, "team-c", "github"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("team C deletes github: %v, want ErrNotFound", err)
		}
		if err := s.DeleteSecret(ctx, "team-b", "github"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetSecret(ctx, "team-a", "github"); err != nil {
			t.Fatalf("team A's secret after team B deleted its own: %v", err)
		}
		if l, _ := s.ListSecrets(ctx, "team-b"); len(l) != 0 {
			t.Fatalf("team B's secrets after its delete: %+v", l)
		}

		for _, team := range []string{"team-a", "team-b"} {
			if err := s.PutPool(ctx, Pool{Team: team, Template: "base", Min: 1, Max: 2, MaxIdleS: 60}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.PutPool(ctx, Pool{Team: "team-b", Template: "base"}); err != nil { // max 0: team B removes its pool
			t.Fatal(err)
		}
		if ps, _ := s.ListPools(ctx); len(ps) != 1 || ps[0].Team != "team-a" {
			t.Fatalf("pools after team B removed its own: %+v, want team A's only", ps)
		}
	})
}
