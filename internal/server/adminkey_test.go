package server

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/store"
)

// TestAdminKeyRestartKeepsRevocation defends against a restart reviving a
// revoked admin key: every start adds DATA/admin.key to the store again,
// and an INSERT OR REPLACE there cleared the key's revoked_at (and reset
// its created_at), so a key revoked because it leaked worked again after
// the next restart. The first start makes an e2b_ + 40 hex key, admin of
// team default, in a 0600 file; later starts keep the file and the stored
// record exactly as they were.
func TestAdminKeyRestartKeepsRevocation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "admin.key")
	ctx := context.Background()
	open := func() *store.Store {
		st, err := store.Open(filepath.Join(dir, "corral.db"))
		if err != nil {
			t.Fatal(err)
		}
		return st
	}

	st := open()
	key, revoked, err := ensureAdminKey(ctx, st, path)
	if err != nil || revoked {
		t.Fatalf("first start: %v revoked %v", err, revoked)
	}
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(key) {
		t.Fatalf("admin key %q is not e2b_ + 40 lower-case hex", key)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin.key: %v mode %v, want 0600", err, fi.Mode().Perm())
	}
	k, err := st.LookupAPIKey(ctx, key)
	if err != nil || k.Team != store.DefaultTeam || k.Role != store.RoleAdmin || k.Name != "admin" {
		t.Fatalf("first start's key: %+v %v; want admin of team default", k, err)
	}
	created := k.CreatedAt
	// Another admin key, so that admin.key's key is not the last one.
	if _, _, err := st.CreateAPIKey(ctx, "ops", "ops", store.RoleAdmin); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.RevokeAPIKey(ctx, k.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	st.Close()

	time.Sleep(5 * time.Millisecond) // a re-insert would get a later created_at
	st = open()
	defer st.Close()
	again, revoked, err := ensureAdminKey(ctx, st, path)
	if err != nil || again != key || !revoked {
		t.Fatalf("restart: key kept %v, revoked %v, err %v; want the same key, reported revoked", again == key, revoked, err)
	}
	if _, err := st.LookupAPIKey(ctx, key); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after a restart the revoked admin key authenticates (err %v): the restart revived it", err)
	}
	got, err := st.GetAPIKey(ctx, k.ID)
	if err != nil || got.RevokedAt == nil || !got.CreatedAt.Equal(created) {
		t.Fatalf("record after restart: %+v %v; want revoked, created_at %v", got, err, created)
	}
	if b, _ := os.ReadFile(path); strings.TrimSpace(string(b)) != key {
		t.Fatalf("admin.key changed on restart: %q", b)
	}
}
