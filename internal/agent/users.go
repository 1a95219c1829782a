package agent

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
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

// userDB is a snapshot of the account files, read again whenever they
// change (userCache) so that users added inside the sandbox (useradd) are
// seen without a restart. It is never modified once loaded.
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
	// The buffer grows as lines need it (account files' lines are short).
	sc.Buffer(make([]byte, 0, 4<<10), 1<<20)
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

// userCache keeps the last userDB loaded with the identity of the files it
// was read from (device, inode, size, modification and change times), so
// that a request costs two stat calls instead of reading and parsing both
// files (and 128 KiB of garbage) every time.
//
// It defends against a stale account database: a file replaced (useradd
// renames a new one in place) has a new inode, one rewritten in place a
// new change time. Change times come from a coarse clock (a jiffy), so two
// writes of the same size in one tick could look alike: a snapshot is
// only kept when both files' times are more than racyWindow in the past
// when they were read, so any later write gets a time that differs
// (TestUserCacheSeesRewrite).
type userCache struct {
	mu sync.Mutex
	// db and keys are the snapshot and the files' identities it was read
	// with; db is nil when none is kept. Guarded by mu.
	db   *userDB
	keys [2]fileKey
	// window is racyWindow unless a test sets it.
	window time.Duration
}

// racyWindow is how old a file's times must be for a snapshot read from
// it to be kept (see userCache).
const racyWindow = time.Second

// fileKey is what tells one version of a file from another; the zero
// value stands for a file that does not exist.
type fileKey struct {
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
}

// statKey returns the key of path, the zero key when it does not exist.
func statKey(path string) (fileKey, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if err == unix.ENOENT {
			return fileKey{}, nil
		}
		return fileKey{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	return fileKey{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}, nil
}

// recent reports whether k's times are later than before.
func (k fileKey) recent(before time.Time) bool {
	return !time.Unix(k.mtime.Unix()).Before(before) || !time.Unix(k.ctime.Unix()).Before(before)
}

// load returns the account database of passwdFile and groupFile, from the
// snapshot when neither file changed since it was read.
func (c *userCache) load(passwdFile, groupFile string) (*userDB, error) {
	now := time.Now()
	var keys [2]fileKey
	for i, f := range []string{passwdFile, groupFile} {
		k, err := statKey(f)
		if err != nil {
			return nil, err
		}
		keys[i] = k
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.db != nil && c.keys == keys {
		return c.db, nil
	}
	db, err := loadUserDB(passwdFile, groupFile)
	if err != nil {
		c.db = nil
		return nil, err
	}
	c.db, c.keys = nil, keys
	w := c.window
	if w == 0 {
		w = racyWindow
	}
	if old := now.Add(-w); !keys[0].recent(old) && !keys[1].recent(old) {
		c.db = db
	}
	return db, nil
}
