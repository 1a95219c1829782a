package agent

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

func TestUserDB(t *testing.T) {
	dir := t.TempDir()
	passwd := filepath.Join(dir, "passwd")
	group := filepath.Join(dir, "group")
	writeFile(t, passwd, "# comment\nroot:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:User:/home/user:/bin/bash\nbroken:x:notanumber:1:::\nuser:x:2000:2000::/dup:/bin/sh\nnohome:x:1001:1001:::/bin/sh\n")
	writeFile(t, group, "root:x:0:\nuser:x:1000:\nsudo:x:27:user,other\ndocker:x:999: user \nother:x:50:root\n")
	db, err := loadUserDB(passwd, group)
	must(t, err)
	tests := []struct {
		name    string
		want    *user
		wantErr bool
	}{
		{"root", &user{Name: "root", UID: 0, GID: 0, Home: "/root", Groups: []uint32{0, 50}}, false},
		{"user", &user{Name: "user", UID: 1000, GID: 1000, Home: "/home/user", Groups: []uint32{1000, 27, 999}}, false},
		{"nohome", &user{Name: "nohome", UID: 1001, GID: 1001, Home: "/", Groups: []uint32{1001}}, false},
		{"broken", nil, true},
		{"ghost", nil, true},
	}
	for _, tc := range tests {
		u, err := db.lookup(tc.name)
		if (err != nil) != tc.wantErr || (!tc.wantErr && !reflect.DeepEqual(u, tc.want)) {
			t.Errorf("lookup(%s) = %+v, %v; want %+v", tc.name, u, err, tc.want)
		}
	}
	if db.userName(1000) != "user" || db.userName(4242) != "4242" || db.groupName(27) != "sudo" || db.groupName(7) != "7" {
		t.Errorf("names: %s %s %s %s", db.userName(1000), db.userName(4242), db.groupName(27), db.groupName(7))
	}
}

func TestResolvePath(t *testing.T) {
	u := &user{Home: "/home/user"}
	for in, want := range map[string]string{
		"":          "/home/user",
		"~":         "/home/user",
		"~/a/../b":  "/home/user/b",
		"rel/x":     "/home/user/rel/x",
		"/abs//y/":  "/abs/y",
		"../escape": "/home/escape",
	} {
		got, err := resolvePath(in, u)
		if err != nil || got != want {
			t.Errorf("resolvePath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := resolvePath("a\x00b", u); err == nil {
		t.Error("NUL accepted")
	}
}

// TestUserCacheSeesRewrite defends against a stale account database: the
// agent keeps the parsed account files between requests, and a command
// must still run as the account the files name now. A file rewritten in
// place with the same size right after a read (its change time may fall
// in the same clock tick), one replaced by rename, and one removed are all
// seen at the next load; files that did not change are not read again.
func TestUserCacheSeesRewrite(t *testing.T) {
	dir := t.TempDir()
	passwd := filepath.Join(dir, "passwd")
	group := filepath.Join(dir, "group")
	uidOf := func(t *testing.T, c *userCache) uint32 {
		t.Helper()
		db, err := c.load(passwd, group)
		must(t, err)
		u, err := db.lookup("user")
		must(t, err)
		return u.UID
	}
	t.Run("rewritten in place, same size", func(t *testing.T) {
		var c userCache
		writeFile(t, passwd, "user:x:1000:1000::/home/user:/bin/sh\n")
		writeFile(t, group, "user:x:1000:\n")
		if got := uidOf(t, &c); got != 1000 {
			t.Fatalf("uid %d, want 1000", got)
		}
		writeFile(t, passwd, "user:x:1001:1000::/home/user:/bin/sh\n")
		if got := uidOf(t, &c); got != 1001 {
			t.Fatalf("after the rewrite: uid %d, want 1001", got)
		}
	})
	t.Run("replaced by rename", func(t *testing.T) {
		c := userCache{window: time.Nanosecond}
		writeFile(t, passwd, "user:x:1000:1000::/home/user:/bin/sh\n")
		if got := uidOf(t, &c); got != 1000 {
			t.Fatalf("uid %d, want 1000", got)
		}
		tmp := filepath.Join(dir, "passwd+")
		writeFile(t, tmp, "user:x:1002:1000::/home/user:/bin/sh\n")
		must(t, os.Rename(tmp, passwd))
		if got := uidOf(t, &c); got != 1002 {
			t.Fatalf("after the rename: uid %d, want 1002", got)
		}
	})
	t.Run("group file removed", func(t *testing.T) {
		c := userCache{window: time.Nanosecond}
		writeFile(t, passwd, "user:x:1000:1000::/home/user:/bin/sh\n")
		writeFile(t, group, "user:x:1000:\nextra:x:77:user\n")
		db, err := c.load(passwd, group)
		must(t, err)
		if u, _ := db.lookup("user"); len(u.Groups) != 2 {
			t.Fatalf("groups %v, want 2", u.Groups)
		}
		must(t, os.Remove(group))
		db, err = c.load(passwd, group)
		must(t, err)
		if u, _ := db.lookup("user"); len(u.Groups) != 1 {
			t.Fatalf("after the removal: groups %v, want 1", u.Groups)
		}
	})
	t.Run("unchanged files are not read again", func(t *testing.T) {
		c := userCache{window: time.Nanosecond}
		writeFile(t, passwd, "user:x:1000:1000::/home/user:/bin/sh\n")
		writeFile(t, group, "user:x:1000:\n")
		// Older than the (test's) window, so the snapshot is kept.
		deadline := time.Now().Add(time.Minute)
		var a, b *userDB
		for time.Now().Before(deadline) {
			var err error
			a, err = c.load(passwd, group)
			must(t, err)
			if b, err = c.load(passwd, group); err != nil || a == b {
				break
			}
		}
		if a != b {
			t.Fatal("the snapshot of unchanged files was not kept")
		}
	})
}
