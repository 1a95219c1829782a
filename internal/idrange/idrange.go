// Package idrange chooses, checks and records the host uid/gid range that
// sandboxes' user namespaces map to.
//
// Every sandbox maps its uids and gids 0–65535 to the host ids
// BASE..BASE+65535, and template, snapshot and volume files are stored
// owned by those host ids. Whoever can act as one of those host ids on the
// host owns every sandbox's files (setuid sudo of the templates among
// them) and can connect to every agent socket. Two ways to get there
// without root:
//
//   - a delegation in /etc/subuid or /etc/subgid: newuidmap(1) and
//     newgidmap(1) let the delegated user map the ids into a user namespace
//     of its own and act as them (Debian's useradd gives the first user
//     100000:65536, the range corral used to hard-code);
//   - a user or group whose own id lies in the range.
//
// So the range must be one nobody holds: Ensure refuses a range that
// overlaps another entry of /etc/subuid or /etc/subgid or contains an id of
// /etc/passwd or /etc/group, and records the range as corral's own entry
// ("corral:BASE:65536") in both files, as Docker does for its dockremap
// user, so that useradd never hands it to a user created later.
package idrange

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Bounds of a range.
const (
	// Count is the number of ids in a range: a sandbox's ids 0–65535
	// (templates hold files of nobody, 65534).
	Count = 65536
	// MinBase is the lowest base: the range stays clear of the ids hosts
	// give to users and system accounts (0–65535).
	MinBase = 65536
	// MaxEnd bounds a range's end (exclusive): 2^31, so that no id is
	// negative as a signed 32-bit number.
	MaxEnd = 1 << 31
	// SearchBase is where Ensure starts looking for a free range when none
	// is configured or recorded: 2^30, far above the ranges useradd
	// delegates (100000–600100000 by default).
	SearchBase = 1 << 30
	// Owner is the name of corral's entries in /etc/subuid and /etc/subgid.
	Owner = "corral"
)

// SandboxUser is the uid and gid of "user", the unprivileged account of
// corral's templates (internal/template's recipe creates it), inside a
// sandbox: host id Base+SandboxUser.
const SandboxUser = 1000

// LegacyBase is the base every corral before configurable ranges used;
// a data dir with no recorded range was made with it.
const LegacyBase = 100000

// Range is a range of host uids and gids: Base..Base+Count-1, the same
// numbers for uids and gids. The zero Range means "not chosen".
type Range struct {
	Base  uint32
	Count uint32
}

// IsZero reports whether r is the zero Range.
func (r Range) IsZero() bool { return r == Range{} }

// End is the first id after the range.
func (r Range) End() uint64 { return uint64(r.Base) + uint64(r.Count) }

// String is "BASE:COUNT", the --uid-range syntax.
func (r Range) String() string { return fmt.Sprintf("%d:%d", r.Base, r.Count) }

// describe is "BASE-LAST (BASE:COUNT)" for messages.
func (r Range) describe() string {
	return fmt.Sprintf("%d-%d (%s)", r.Base, r.End()-1, r)
}

// overlaps reports whether r shares an id with [start, start+count).
func (r Range) overlaps(start, count uint64) bool {
	return start < r.End() && uint64(r.Base) < start+count
}

// Validate checks that r is a usable range: Count ids from a base of at
// least MinBase, ending at MaxEnd at the latest.
func (r Range) Validate() error {
	if r.Count != Count {
		return fmt.Errorf("uid range %s: the count must be %d (sandbox ids 0-%d)", r, Count, Count-1)
	}
	if r.Base < MinBase || r.End() > MaxEnd {
		return fmt.Errorf("uid range %s: the base must be between %d and %d", r, MinBase, MaxEnd-Count)
	}
	return nil
}

// Parse parses "BASE" or "BASE:COUNT" (decimal) and validates the range.
func Parse(s string) (Range, error) {
	base, count, found := strings.Cut(strings.TrimSpace(s), ":")
	b, err := strconv.ParseUint(base, 10, 32)
	if err != nil {
		return Range{}, fmt.Errorf("uid range %q: want BASE or BASE:COUNT (decimal)", s)
	}
	c := uint64(Count)
	if found {
		if c, err = strconv.ParseUint(count, 10, 32); err != nil {
			return Range{}, fmt.Errorf("uid range %q: want BASE or BASE:COUNT (decimal)", s)
		}
	}
	r := Range{Base: uint32(b), Count: uint32(c)}
	if err := r.Validate(); err != nil {
		return Range{}, err
	}
	return r, nil
}

// Files names the host files Ensure reads and writes. Zero fields mean
// the system's files (/etc/subuid, /etc/subgid, /etc/passwd, /etc/group);
// tests point them at copies.
type Files struct {
	SubUID, SubGID, Passwd, Group string
}

// InDir returns the Files named subuid, subgid, passwd and group in dir.
func InDir(dir string) Files {
	return Files{SubUID: filepath.Join(dir, "subuid"), SubGID: filepath.Join(dir, "subgid"),
		Passwd: filepath.Join(dir, "passwd"), Group: filepath.Join(dir, "group")}
}

func (f Files) withDefaults() Files {
	def := InDir("/etc")
	if f.SubUID == "" {
		f.SubUID = def.SubUID
	}
	if f.SubGID == "" {
		f.SubGID = def.SubGID
	}
	if f.Passwd == "" {
		f.Passwd = def.Passwd
	}
	if f.Group == "" {
		f.Group = def.Group
	}
	return f
}

// ErrNotFree is wrapped by the error of a range that someone else holds.
var ErrNotFree = errors.New("uid range is not free")

// ConflictError says why a range is not free.
type ConflictError struct {
	// Range is the range asked for.
	Range Range
	// Detail names the conflicting entry, for example
	// `/etc/subuid line 1 "alice:100000:65536" delegates ids in it to alice`.
	Detail string
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("uid range %s is not free: %s; whoever holds those ids can act as sandbox root on the host (newuidmap, or the ids themselves). Fix: start corral with --uid-range BASE set to a free range (or without it, to pick one), or remove the entry",
		e.Range.describe(), e.Detail)
}

// Unwrap makes errors.Is(err, ErrNotFree) hold.
func (e *ConflictError) Unwrap() error { return ErrNotFree }

// subEntry is one line of /etc/subuid or /etc/subgid.
type subEntry struct {
	file, text   string
	line         int
	owner        string
	start, count uint64
}

// hostID is one uid or gid of /etc/passwd or /etc/group.
type hostID struct {
	file, name, kind string
	line             int
	id               uint64
}

// host is what the files say.
type host struct {
	files Files
	subs  []subEntry
	ids   []hostID
	// ownerUser is the line of a /etc/passwd user named Owner (0: none).
	ownerUser int
}

// readFile returns the file's content; a missing file is empty.
func readFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("uid range: %w", err)
	}
	return string(b), nil
}

// load reads and parses the four files.
func load(f Files) (*host, error) {
	h := &host{files: f}
	for _, p := range []string{f.SubUID, f.SubGID} {
		data, err := readFile(p)
		if err != nil {
			return nil, err
		}
		subs, err := parseSub(p, data)
		if err != nil {
			return nil, err
		}
		h.subs = append(h.subs, subs...)
	}
	data, err := readFile(f.Passwd)
	if err != nil {
		return nil, err
	}
	for i, line := range strings.Split(data, "\n") {
		fs := strings.Split(line, ":")
		if len(fs) < 4 {
			continue
		}
		if fs[0] == Owner && h.ownerUser == 0 {
			h.ownerUser = i + 1
		}
		h.addID(f.Passwd, i+1, fs[0], "uid", fs[2])
		h.addID(f.Passwd, i+1, fs[0], "gid", fs[3])
	}
	if data, err = readFile(f.Group); err != nil {
		return nil, err
	}
	for i, line := range strings.Split(data, "\n") {
		if fs := strings.Split(line, ":"); len(fs) >= 3 {
			h.addID(f.Group, i+1, fs[0], "gid", fs[2])
		}
	}
	return h, nil
}

// addID records a passwd or group id. Fields that are not numbers (NIS
// "+" lines, junk) name no id and are skipped, as the C library does.
func (h *host) addID(file string, line int, name, kind, field string) {
	if id, err := strconv.ParseUint(field, 10, 32); err == nil {
		h.ids = append(h.ids, hostID{file: file, name: name, kind: kind, line: line, id: id})
	}
}

// parseSub parses /etc/subuid or /etc/subgid. A line that is neither
// blank, a comment nor NAME:START:COUNT (decimal, COUNT > 0) is an error:
// corral cannot tell which ids it delegates, so it refuses rather than
// guess.
func parseSub(file, data string) ([]subEntry, error) {
	var out []subEntry
	for i, line := range strings.Split(data, "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		fs := strings.Split(t, ":")
		bad := fmt.Errorf("uid range: %s line %d %q is malformed (want NAME:START:COUNT); fix or remove the line", file, i+1, t)
		if len(fs) != 3 || fs[0] == "" {
			return nil, bad
		}
		start, err1 := strconv.ParseUint(fs[1], 10, 32)
		count, err2 := strconv.ParseUint(fs[2], 10, 32)
		if err1 != nil || err2 != nil || count == 0 || start+count > 1<<32 {
			return nil, bad
		}
		out = append(out, subEntry{file: file, text: t, line: i + 1, owner: fs[0], start: start, count: count})
	}
	return out, nil
}

// check returns a ConflictError if anyone but corral holds an id of r.
func (h *host) check(r Range) error {
	if h.ownerUser != 0 {
		return &ConflictError{Range: r, Detail: fmt.Sprintf("%s line %d is a user named %q, to whom corral's own entries in %s and %s delegate the range (remove that user)",
			h.files.Passwd, h.ownerUser, Owner, h.files.SubUID, h.files.SubGID)}
	}
	for _, e := range h.subs {
		if e.owner != Owner && r.overlaps(e.start, e.count) {
			return &ConflictError{Range: r, Detail: fmt.Sprintf("%s line %d %q delegates ids in it to %s", e.file, e.line, e.text, e.owner)}
		}
	}
	for _, id := range h.ids {
		if r.overlaps(id.id, 1) {
			return &ConflictError{Range: r, Detail: fmt.Sprintf("%s line %d: %s %d of %q is in it", id.file, id.line, id.kind, id.id, id.name)}
		}
	}
	return nil
}

// own returns corral's recorded range: the first Owner entry of Count
// ids in /etc/subuid, else in /etc/subgid.
func (h *host) own() (Range, bool) {
	for _, e := range h.subs {
		if e.owner == Owner && e.count == Count {
			return Range{Base: uint32(e.start), Count: Count}, true
		}
	}
	return Range{}, false
}

// free returns the lowest Count-aligned range from SearchBase up that
// overlaps no entry (corral's included) and holds no passwd or group id.
func (h *host) free() (Range, error) {
	base := uint64(SearchBase)
	for base+Count <= MaxEnd {
		r := Range{Base: uint32(base), Count: Count}
		next := base
		for _, e := range h.subs {
			if r.overlaps(e.start, e.count) {
				next = max(next, e.start+e.count)
			}
		}
		for _, id := range h.ids {
			if r.overlaps(id.id, 1) {
				next = max(next, id.id+1)
			}
		}
		if next == base {
			return r, nil
		}
		base = (next + Count - 1) / Count * Count
	}
	return Range{}, fmt.Errorf("uid range: no free range of %d ids between %d and %d in %s, %s, %s and %s; set one with --uid-range BASE",
		Count, SearchBase, MaxEnd, h.files.SubUID, h.files.SubGID, h.files.Passwd, h.files.Group)
}

// has reports whether file holds corral's entry for exactly r.
func (h *host) has(file string, r Range) bool {
	for _, e := range h.subs {
		if e.file == file && e.owner == Owner && e.start == uint64(r.Base) && e.count == uint64(r.Count) {
			return true
		}
	}
	return false
}

// Ensure returns the range sandboxes map to and makes sure it is corral's
// alone. want is the configured (or recorded) range; the zero Range means
// corral's own entry in /etc/subuid or /etc/subgid if there is one, else
// the lowest free range from SearchBase up (see free).
//
// Security: defends against a host user who could act as sandbox root on
// the host. A range that overlaps an entry of /etc/subuid or /etc/subgid
// that is not corral's, or contains a uid or gid of /etc/passwd or
// /etc/group, is refused with a *ConflictError (wrapping ErrNotFree) that
// names the entry; so is any range while a user named "corral" exists
// (corral's entries would delegate the range to it). The range is then
// recorded as "corral:BASE:COUNT" in both files (appended, atomically, if
// missing) under shadow's lock files (FILE.lock, as useradd takes them),
// so that useradd never delegates it to a user created later. Nothing is
// written when the range is refused.
func Ensure(files Files, want Range) (Range, error) {
	f := files.withDefaults()
	if !want.IsZero() {
		if err := want.Validate(); err != nil {
			return Range{}, err
		}
	}
	var unlocks []func()
	defer func() {
		for _, u := range unlocks {
			u()
		}
	}()
	for _, p := range []string{f.SubUID, f.SubGID} {
		u, err := lockShadow(p)
		if err != nil {
			return Range{}, err
		}
		unlocks = append(unlocks, u)
	}
	h, err := load(f)
	if err != nil {
		return Range{}, err
	}
	r := want
	if r.IsZero() {
		var ok bool
		if r, ok = h.own(); !ok {
			if r, err = h.free(); err != nil {
				return Range{}, err
			}
		}
		if err := r.Validate(); err != nil {
			return Range{}, fmt.Errorf("corral's entry in %s or %s: %w", f.SubUID, f.SubGID, err)
		}
	}
	if err := h.check(r); err != nil {
		return Range{}, err
	}
	for _, p := range []string{f.SubUID, f.SubGID} {
		if !h.has(p, r) {
			if err := appendEntry(p, r); err != nil {
				return Range{}, err
			}
		}
	}
	return r, nil
}

// appendEntry adds "corral:BASE:COUNT" to path, keeping its content, mode
// and owner: it writes a copy next to it, syncs it and renames it over
// path, so a crash leaves the old file or the new one.
func appendEntry(path string, r Range) error {
	old, err := os.ReadFile(path)
	mode, uid, gid := os.FileMode(0o644), 0, 0
	switch {
	case err == nil:
		fi, err := os.Stat(path)
		if err != nil {
			return fmt.Errorf("uid range: %w", err)
		}
		mode = fi.Mode().Perm()
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			uid, gid = int(st.Uid), int(st.Gid)
		}
	case errors.Is(err, os.ErrNotExist):
	default:
		return fmt.Errorf("uid range: %w", err)
	}
	if len(old) > 0 && old[len(old)-1] != '\n' {
		old = append(old, '\n')
	}
	data := append(old, fmt.Sprintf("%s:%d:%d\n", Owner, r.Base, r.Count)...)
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".corral-*")
	if err != nil {
		return fmt.Errorf("uid range: record in %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(mode)
	}
	if err == nil {
		err = tmp.Chown(uid, gid)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("uid range: record in %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// lockTimeout bounds the wait for a lock another program holds.
var lockTimeout = 30 * time.Second

// lockShadow takes shadow's lock on path the way its commonio code does
// (useradd, usermod, newusers): a file PATH.<pid> holding our pid is
// hard-linked to PATH.lock, which fails while someone else holds it. A
// lock whose process is gone is stale and removed.
func lockShadow(path string) (func(), error) {
	lock := path + ".lock"
	mine := fmt.Sprintf("%s.%d", path, os.Getpid())
	_ = os.Remove(mine)
	if err := os.WriteFile(mine, []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return nil, fmt.Errorf("uid range: lock %s: %w", path, err)
	}
	defer os.Remove(mine)
	deadline := time.Now().Add(lockTimeout)
	for {
		err := os.Link(mine, lock)
		if err == nil {
			return func() { _ = os.Remove(lock) }, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("uid range: lock %s: %w", path, err)
		}
		b, _ := os.ReadFile(lock)
		pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
		if perr == nil && pid > 0 && errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			_ = os.Remove(lock)
			continue
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("uid range: %s is held (by process %s) for %s; is useradd or another corral running? Remove it if it is stale", lock, strings.TrimSpace(string(b)), lockTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
