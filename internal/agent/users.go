package agent

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// user is an account resolved from /etc/passwd and /etc/group. The agent is a
// static binary (CGO_ENABLED=0), so it parses these files itself rather than
// going through NSS.
type user struct {
	Name   string
	UID    uint32
	GID    uint32
	Home   string
	Groups []uint32 // supplementary groups, primary group included
}

// userDB is a snapshot of the account files, read per request so that users
// added inside the sandbox (useradd) are seen without a restart.
type userDB struct {
	users  map[string]*user
	byUID  map[uint32]string
	byGID  map[uint32]string
	member map[string][]uint32
}

func loadUserDB(passwdFile, groupFile string) (*userDB, error) {
	db := &userDB{
		users:  map[string]*user{},
		byUID:  map[uint32]string{},
		byGID:  map[uint32]string{},
		member: map[string][]uint32{},
	}
	if err := eachRecord(groupFile, 4, func(f []string) {
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil {
			return
		}
		if _, ok := db.byGID[uint32(gid)]; !ok {
			db.byGID[uint32(gid)] = f[0]
		}
		for _, m := range strings.Split(f[3], ",") {
			if m = strings.TrimSpace(m); m != "" {
				db.member[m] = append(db.member[m], uint32(gid))
			}
		}
	}); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	if err := eachRecord(passwdFile, 7, func(f []string) {
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return
		}
		if _, ok := db.users[f[0]]; ok {
			return // first entry wins, as with getpwnam
		}
		db.users[f[0]] = &user{Name: f[0], UID: uint32(uid), GID: uint32(gid), Home: f[5]}
		if _, ok := db.byUID[uint32(uid)]; !ok {
			db.byUID[uint32(uid)] = f[0]
		}
	}); err != nil {
		return nil, err
	}
	for name, u := range db.users {
		groups := []uint32{u.GID}
		for _, g := range db.member[name] {
			if g != u.GID {
				groups = append(groups, g)
			}
		}
		u.Groups = groups
		if u.Home == "" {
			u.Home = "/"
		}
	}
	return db, nil
}

// eachRecord calls fn for each colon-separated record of file with at least n
// fields, skipping comments and blank lines.
func eachRecord(file string, n int, fn func([]string)) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		fields := strings.Split(line, ":")
		if len(fields) < n {
			continue
		}
		fn(fields)
	}
	return sc.Err()
}

// lookup returns the named user.
func (db *userDB) lookup(name string) (*user, error) {
	if u, ok := db.users[name]; ok {
		return u, nil
	}
	return nil, fmt.Errorf("unknown user %q", name)
}

// userName returns the name for uid, or the number as a string.
func (db *userDB) userName(uid uint32) string {
	if n, ok := db.byUID[uid]; ok {
		return n
	}
	return strconv.FormatUint(uint64(uid), 10)
}

// groupName returns the name for gid, or the number as a string.
func (db *userDB) groupName(gid uint32) string {
	if n, ok := db.byGID[gid]; ok {
		return n
	}
	return strconv.FormatUint(uint64(gid), 10)
}
