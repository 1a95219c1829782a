package store

import (
	"context"
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func openKeys(t *testing.T, bk backend) *Store {
	t.Helper()
	s, err := Open(bk.addr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestCreateAPIKeyRefusesBadFields defends against keys for teams that
// cannot be named safely or that collide with ?team=all, unknown roles
// (a typo must not make an admin, or a key nobody can classify) and
// unbounded names: each is refused with an *InvalidKeyError naming the
// field, and nothing is stored.
func TestCreateAPIKeyRefusesBadFields(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		s := openKeys(t, bk)
		ctx := context.Background()
		cases := []struct {
			name, keyName, team, role, field string
		}{
			{"empty team", "n", "", RoleMember, "team"},
			{"reserved team all", "n", "all", RoleMember, "team"},
			{"upper-case team", "n", "Team", RoleMember, "team"},
			{"team with slash", "n", "a/b", RoleMember, "team"},
			{"team with space", "n", "a b", RoleMember, "team"},
			{"team starting with -", "n", "-a", RoleMember, "team"},
			{"team too long", "n", strings.Repeat("a", 64), RoleMember, "team"},
			{"empty role", "n", "a", "", "role"},
			{"unknown role", "n", "a", "root", "role"},
			{"upper-case role", "n", "a", "Admin", "role"},
			{"name too long", strings.Repeat("n", MaxKeyNameLen+1), "a", RoleMember, "name"},
			{"name with newline", "a\nb", "a", RoleMember, "name"},
			{"name not UTF-8", "a\xffb", "a", RoleMember, "name"},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				key, k, err := s.CreateAPIKey(ctx, c.keyName, c.team, c.role)
				var inv *InvalidKeyError
				if !errors.As(err, &inv) || !strings.HasPrefix(inv.Msg, c.field+":") || key != "" || k != nil {
					t.Fatalf("CreateAPIKey(%q, %q, %q) = %q, %+v, %v; want an InvalidKeyError about %s", c.keyName, c.team, c.role, key, k, err, c.field)
				}
			})
		}
		if list, err := s.ListAPIKeys(ctx, ""); err != nil || len(list) != 0 {
			t.Fatalf("refused creates stored %d keys (%v)", len(list), err)
		}
		for _, team := range []string{"a", "0", "team-b_2", strings.Repeat("z", 63)} {
			if _, _, err := s.CreateAPIKey(ctx, strings.Repeat("n", MaxKeyNameLen), team, RoleMember); err != nil {
				t.Errorf("team %q: %v", team, err)
			}
		}
	})
}

// TestAPIKeyLifecycle: a created key has E2B's format, is stored only as
// its hash (the value is in no record), authenticates until it is
// revoked and never after (revocation is idempotent and keeps its first
// time; an unknown id is ErrNotFound); lists filter by team; the last
// unrevoked admin key cannot be revoked (ErrLastAdminKey), so the
// server always keeps an admin.
func TestAPIKeyLifecycle(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		s := openKeys(t, bk)
		ctx := context.Background()
		admin, ak, err := s.CreateAPIKey(ctx, "root", "default", RoleAdmin)
		if err != nil {
			t.Fatal(err)
		}
		key, k, err := s.CreateAPIKey(ctx, "ci", "team-b", RoleMember)
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(key) || key == admin {
			t.Fatalf("key %q: want e2b_ + 40 lower-case hex, distinct", key)
		}
		if k.ID != KeyID(HashKey(key)) || len(k.ID) != KeyIDLen || k.Hash != HashKey(key) || k.Team != "team-b" || k.Role != RoleMember || k.Name != "ci" || k.RevokedAt != nil || k.CreatedAt.IsZero() {
			t.Fatalf("record %+v", k)
		}
		var dump strings.Builder
		rows, err := s.db.QueryContext(ctx, `SELECT hash||name||team||role FROM api_keys`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var v string
			rows.Scan(&v)
			dump.WriteString(v)
		}
		rows.Close()
		if strings.Contains(dump.String(), key[len(KeyPrefix):]) || strings.Contains(dump.String(), admin[len(KeyPrefix):]) {
			t.Fatal("a key's value is stored")
		}
		if got, err := s.LookupAPIKey(ctx, key); err != nil || got.ID != k.ID {
			t.Fatalf("lookup before revoke: %+v %v", got, err)
		}

		all, _ := s.ListAPIKeys(ctx, "")
		b, _ := s.ListAPIKeys(ctx, "team-b")
		none, _ := s.ListAPIKeys(ctx, "team-c")
		if len(all) != 2 || len(b) != 1 || b[0].ID != k.ID || len(none) != 0 {
			t.Fatalf("lists: all %d, team-b %+v, team-c %d", len(all), b, len(none))
		}

		at := time.UnixMilli(time.Now().UnixMilli()).UTC()
		r, changed, err := s.RevokeAPIKey(ctx, k.ID, at)
		if err != nil || !changed || r.RevokedAt == nil || !r.RevokedAt.Equal(at) {
			t.Fatalf("revoke: %+v %v %v", r, changed, err)
		}
		if _, err := s.LookupAPIKey(ctx, key); !errors.Is(err, ErrNotFound) {
			t.Fatalf("a revoked key authenticates: %v", err)
		}
		r, changed, err = s.RevokeAPIKey(ctx, k.ID, at.Add(time.Hour))
		if err != nil || changed || !r.RevokedAt.Equal(at) {
			t.Fatalf("second revoke: %+v %v %v; want unchanged revoked_at %v", r, changed, err, at)
		}
		for _, id := range []string{"0000000000000000", "", "nothex", strings.ToUpper(k.ID), k.ID[:8], k.Hash} {
			if _, _, err := s.RevokeAPIKey(ctx, id, at); !errors.Is(err, ErrNotFound) {
				t.Errorf("revoke %q: %v; want ErrNotFound", id, err)
			}
		}

		if _, _, err := s.RevokeAPIKey(ctx, ak.ID, at); !errors.Is(err, ErrLastAdminKey) {
			t.Fatalf("revoking the last admin key: %v; want ErrLastAdminKey", err)
		}
		if _, err := s.LookupAPIKey(ctx, admin); err != nil {
			t.Fatalf("the refused revocation revoked the last admin key: %v", err)
		}
		_, ak2, err := s.CreateAPIKey(ctx, "root2", "ops", RoleAdmin)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.RevokeAPIKey(ctx, ak.ID, at); err != nil {
			t.Fatalf("revoking an admin key with another one left: %v", err)
		}
		if _, _, err := s.RevokeAPIKey(ctx, ak2.ID, at); !errors.Is(err, ErrLastAdminKey) {
			t.Fatalf("revoking the new last admin key: %v; want ErrLastAdminKey", err)
		}
	})
}

// TestAddAPIKeyKeepsStoredKey defends against re-adding a known key value
// (what every server start does with admin.key) changing the stored
// key: its team, role, created_at and revocation stay as they were.
func TestAddAPIKeyKeepsStoredKey(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		s := openKeys(t, bk)
		ctx := context.Background()
		if err := s.AddAPIKey(ctx, "admin", "e2b_fixed", "", RoleAdmin); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.CreateAPIKey(ctx, "other", "default", RoleAdmin); err != nil {
			t.Fatal(err)
		}
		id := KeyID(HashKey("e2b_fixed"))
		before, _, err := s.RevokeAPIKey(ctx, id, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
		if err := s.AddAPIKey(ctx, "renamed", "e2b_fixed", "team-x", RoleMember); err != nil {
			t.Fatal(err)
		}
		after, err := s.GetAPIKey(ctx, id)
		if err != nil || after.RevokedAt == nil || !after.RevokedAt.Equal(*before.RevokedAt) || !after.CreatedAt.Equal(before.CreatedAt) ||
			after.Team != DefaultTeam || after.Role != RoleAdmin || after.Name != "admin" {
			t.Fatalf("after re-adding: %+v %v; want %+v unchanged", after, err, before)
		}
		if _, err := s.LookupAPIKey(ctx, "e2b_fixed"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("re-adding revived the key: %v", err)
		}
	})
}

// BenchmarkLookupAPIKey measures the per-request cost of checking a key
// (nothing is cached, so every request pays it) with 1000 keys stored.
func BenchmarkLookupAPIKey(b *testing.B) {
	s, err := Open(filepath.Join(b.TempDir(), "corral.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	var key string
	for i := 0; i < 1000; i++ {
		if key, _, err = s.CreateAPIKey(ctx, "k", "team", RoleMember); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.LookupAPIKey(ctx, key); err != nil {
			b.Fatal(err)
		}
	}
}
