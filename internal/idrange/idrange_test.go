package idrange

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Range
		err  string
	}{
		{"300000", Range{300000, Count}, ""},
		{"300000:65536", Range{300000, Count}, ""},
		{" 1073741824 ", Range{1 << 30, Count}, ""},
		{"2147418112", Range{MaxEnd - Count, Count}, ""},
		{"2147418113", Range{}, "base must be between"},
		{"65535", Range{}, "base must be between"},
		{"0", Range{}, "base must be between"},
		{"300000:1000", Range{}, "count must be 65536"},
		{"300000:", Range{}, "want BASE"},
		{"0x186a0", Range{}, "want BASE"},
		{"-1", Range{}, "want BASE"},
		{"", Range{}, "want BASE"},
		{"300000:65536:1", Range{}, "want BASE"},
	} {
		got, err := Parse(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("Parse(%q) = %v, %v; want error containing %q", tt.in, got, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("Parse(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

// etc is the content of the four files of a test; unset files are absent.
type etc struct{ subuid, subgid, passwd, group string }

const debianPasswd = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\nalice:x:1000:1000::/home/alice:/bin/bash\n"
const debianGroup = "root:x:0:\nnogroup:x:65534:\nalice:x:1000:\n"

func writeEtc(t *testing.T, e etc) Files {
	t.Helper()
	dir := t.TempDir()
	f := InDir(dir)
	for p, s := range map[string]string{f.SubUID: e.subuid, f.SubGID: e.subgid, f.Passwd: e.passwd, f.Group: e.group} {
		if s == "" {
			continue
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return string(b)
}

// TestEnsure defends against a sandbox uid range that a host user holds:
// Debian's useradd delegates 100000:65536 to the first user, who can then
// become uid 100000 (sandbox root) with newuidmap and own every sandbox's
// files; a user or group whose id is in the range is the same. Such a
// range is refused with a message naming the entry, and nothing is
// written; a free range is chosen (or corral's recorded one reused) and
// recorded as corral's in both files.
func TestEnsure(t *testing.T) {
	const legacy = "alice:100000:65536\n"
	auto := Range{SearchBase, Count}
	for _, tt := range []struct {
		name string
		etc  etc
		want Range
		// got is the range Ensure returns, conflict a substring of its
		// error (then the files must be unchanged).
		got      Range
		conflict string
		// subuid and subgid are the files' content afterwards.
		subuid, subgid string
	}{
		{name: "empty host: the search base, recorded in both files",
			etc: etc{passwd: debianPasswd, group: debianGroup}, got: auto,
			subuid: "corral:1073741824:65536\n", subgid: "corral:1073741824:65536\n"},
		{name: "the first user's subuid entry is avoided, not reused",
			etc: etc{subuid: legacy, subgid: legacy, passwd: debianPasswd, group: debianGroup}, got: auto,
			subuid: legacy + "corral:1073741824:65536\n", subgid: legacy + "corral:1073741824:65536\n"},
		{name: "configured range overlapping a subuid entry",
			etc:  etc{subuid: legacy, passwd: debianPasswd, group: debianGroup},
			want: Range{LegacyBase, Count}, conflict: `subuid line 1 "alice:100000:65536" delegates ids in it to alice`},
		{name: "configured range overlapping the end of a subgid entry",
			etc:  etc{subgid: "root:1000:100000\nbob:200000:1\n", passwd: debianPasswd},
			want: Range{135536, Count}, conflict: `subgid line 2 "bob:200000:1" delegates ids in it to bob`},
		{name: "configured range containing a passwd uid",
			etc:  etc{passwd: debianPasswd + "svc:x:300500:100::/:/bin/false\n"},
			want: Range{300000, Count}, conflict: `passwd line 4: uid 300500 of "svc" is in it`},
		{name: "configured range containing a passwd primary gid",
			etc:  etc{passwd: debianPasswd + "svc:x:999:300001::/:/bin/false\n"},
			want: Range{300000, Count}, conflict: `passwd line 4: gid 300001 of "svc" is in it`},
		{name: "configured range containing a group gid",
			etc:  etc{group: debianGroup + "big:x:365535:\n"},
			want: Range{300000, Count}, conflict: `group line 4: gid 365535 of "big" is in it`},
		{name: "configured range next to entries is free",
			etc:  etc{subuid: "a:234464:65536\n", subgid: "b:365536:10\n", passwd: debianPasswd},
			want: Range{300000, Count}, got: Range{300000, Count},
			subuid: "a:234464:65536\ncorral:300000:65536\n", subgid: "b:365536:10\ncorral:300000:65536\n"},
		{name: "corral's own entry is reused and completed in subgid",
			etc: etc{subuid: "alice:100000:65536\ncorral:300000:65536\n", passwd: debianPasswd}, got: Range{300000, Count},
			subuid: "alice:100000:65536\ncorral:300000:65536\n", subgid: "corral:300000:65536\n"},
		{name: "corral's own entry is not a conflict for a configured range over it",
			etc:  etc{subuid: "corral:300000:65536\n", subgid: "corral:300000:65536\n"},
			want: Range{330000, Count}, got: Range{330000, Count},
			subuid: "corral:300000:65536\ncorral:330000:65536\n", subgid: "corral:300000:65536\ncorral:330000:65536\n"},
		{name: "corral's own entry taken by another user is refused",
			etc:      etc{subuid: "corral:300000:65536\n", subgid: "mallory:300000:65536\n"},
			conflict: `subgid line 1 "mallory:300000:65536" delegates ids in it to mallory`},
		{name: "a user named corral would get corral's delegation",
			etc:      etc{passwd: debianPasswd + "corral:x:1001:1001::/home/corral:/bin/bash\n"},
			conflict: `passwd line 4 is a user named "corral"`},
		{name: "the search skips delegated ranges and ids to the next aligned base",
			etc:    etc{subuid: "x:1073741824:100000\n", passwd: debianPasswd + "y:x:1073938000:1::/:/bin/false\n"},
			got:    Range{1073741824 + 3*Count, Count},
			subuid: "x:1073741824:100000\ncorral:1073938432:65536\n", subgid: "corral:1073938432:65536\n"},
		{name: "content without a final newline is kept",
			etc: etc{subuid: "# delegations\n\nalice:100000:65536"}, got: auto,
			subuid: "# delegations\n\nalice:100000:65536\ncorral:1073741824:65536\n", subgid: "corral:1073741824:65536\n"},
		{name: "recorded entries are not appended twice",
			etc: etc{subuid: "corral:1073741824:65536\n", subgid: "corral:1073741824:65536\n"}, want: auto, got: auto,
			subuid: "corral:1073741824:65536\n", subgid: "corral:1073741824:65536\n"},
		{name: "malformed subuid line: too few fields",
			etc: etc{subuid: "alice:100000\n"}, conflict: `subuid line 1 "alice:100000" is malformed`},
		{name: "malformed subgid line: hex start",
			etc: etc{subuid: "corral:300000:65536\n", subgid: "ok:1:1\nalice:0x186a0:65536\n"}, conflict: `subgid line 2 "alice:0x186a0:65536" is malformed`},
		{name: "malformed subuid line: zero count",
			etc: etc{subuid: "alice:100000:0\n"}, conflict: `is malformed`},
		{name: "malformed subuid line: past 2^32",
			etc: etc{subuid: "alice:4294967295:2\n"}, conflict: `is malformed`},
		{name: "malformed passwd lines name no id",
			etc: etc{passwd: "+::::::\nbroken\nodd:x:notanumber:1::/:/bin/sh\n" + debianPasswd}, got: auto,
			subuid: "corral:1073741824:65536\n", subgid: "corral:1073741824:65536\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := writeEtc(t, tt.etc)
			got, err := Ensure(f, tt.want)
			if tt.conflict != "" {
				if err == nil || !strings.Contains(err.Error(), tt.conflict) {
					t.Fatalf("Ensure = %v, %v; want an error containing %q", got, err, tt.conflict)
				}
				if !strings.Contains(err.Error(), "is malformed") {
					if !errors.Is(err, ErrNotFree) || !strings.Contains(err.Error(), "--uid-range") {
						t.Errorf("error %q: want ErrNotFree naming the fix (--uid-range)", err)
					}
				}
				if read(t, f.SubUID) != tt.etc.subuid || read(t, f.SubGID) != tt.etc.subgid {
					t.Errorf("a refused range changed the files: subuid %q, subgid %q", read(t, f.SubUID), read(t, f.SubGID))
				}
				return
			}
			if err != nil || got != tt.got {
				t.Fatalf("Ensure = %v, %v; want %v", got, err, tt.got)
			}
			if s := read(t, f.SubUID); s != tt.subuid {
				t.Errorf("subuid = %q, want %q", s, tt.subuid)
			}
			if s := read(t, f.SubGID); s != tt.subgid {
				t.Errorf("subgid = %q, want %q", s, tt.subgid)
			}
			left, _ := filepath.Glob(filepath.Join(filepath.Dir(f.SubUID), "*.lock"))
			tmps, _ := filepath.Glob(filepath.Join(filepath.Dir(f.SubUID), ".*corral-*"))
			if len(left)+len(tmps) > 0 {
				t.Errorf("left behind: %v %v", left, tmps)
			}
		})
	}
}

// TestEnsureKeepsModeAndOwner: the rewritten file keeps the mode of the
// original (a rename installs a new inode).
func TestEnsureKeepsModeAndOwner(t *testing.T) {
	f := writeEtc(t, etc{subuid: "alice:100000:65536\n"})
	if err := os.Chmod(f.SubUID, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := Ensure(f, Range{}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(f.SubUID)
	if err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode after Ensure: %v, %v; want 0640", fi.Mode(), err)
	}
}

// TestEnsureShadowLock: while useradd (or another corral) holds
// FILE.lock, Ensure does not write (two writers would lose one's entry);
// a lock left by a dead process is stale and taken over.
func TestEnsureShadowLock(t *testing.T) {
	held := writeEtc(t, etc{subuid: "alice:100000:65536\n"})
	// Held by a live process: this one.
	if err := os.WriteFile(held.SubGID+".lock", []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		t.Fatal(err)
	}
	old := lockTimeout
	lockTimeout = 200 * time.Millisecond
	_, err := Ensure(held, Range{})
	lockTimeout = old
	if err == nil || !strings.Contains(err.Error(), "is held") {
		t.Fatalf("Ensure under a held lock: %v", err)
	}
	if s := read(t, held.SubUID); s != "alice:100000:65536\n" {
		t.Errorf("subuid written under a held lock: %q", s)
	}
	if _, err := os.Stat(held.SubUID + ".lock"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the lock Ensure took on subuid is left behind: %v", err)
	}

	f := writeEtc(t, etc{})
	// A pid that cannot be running: above the kernel's pid_max limit.
	if err := os.WriteFile(f.SubUID+".lock", []byte("2147483647"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Ensure(f, Range{}); err != nil {
		t.Fatalf("stale lock: %v", err)
	}
	if _, err := os.Stat(f.SubUID + ".lock"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lock left behind: %v", err)
	}
}
