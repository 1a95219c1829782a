package agent

import (
	"path/filepath"
	"reflect"
	"testing"
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
