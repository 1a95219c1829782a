package volumecontent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	testVolume = "vol1"
	testToken  = "secret-token"
	hostBase   = 100000
	secretText = "TOP SECRET host content"
)

// env is a handler over a volume directory next to a directory outside the
// volume that hostile links point at.
type env struct {
	t       *testing.T
	base    string // parent of both: must never appear in an answer
	vol     string // the volume's data directory
	outside string // host data outside the volume
	srv     *httptest.Server

	mu      sync.Mutex
	writes  []string
	deletes []string
}

func newEnv(t *testing.T, opts Options) *env {
	t.Helper()
	base := t.TempDir()
	e := &env{t: t, base: base, vol: filepath.Join(base, "vol"), outside: filepath.Join(base, "outside")}
	for _, d := range []string{e.vol, filepath.Join(e.outside, "outdir")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(e.outside, "secret.txt"), []byte(secretText), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.outside, "outdir", "inner.txt"), []byte(secretText), 0o600); err != nil {
		t.Fatal(err)
	}
	resolve := func(_ context.Context, id, token string) (string, error) {
		switch id {
		case testVolume:
			if token != testToken {
				return "", ErrUnauthorized
			}
			return e.vol, nil
		case "broken":
			return "", errors.New("database down at " + base)
		case "gone":
			return filepath.Join(base, "no-such-dir"), nil
		}
		return "", ErrNotFound
	}
	if opts.HostBase == 0 {
		opts.HostBase = hostBase
	}
	opts.OnWrite = func(id, p string, size int64) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.writes = append(e.writes, id+":"+p+":"+strconv.FormatInt(size, 10))
	}
	opts.OnDelete = func(id, p string) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.deletes = append(e.deletes, id+":"+p)
	}
	mux := http.NewServeMux()
	mux.Handle("/volumecontent/", New(resolve, opts))
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	return e
}

// requireRoot skips tests that create files through the API: the handler
// chowns them into the shifted id range, which only root may do.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("creating files through the API chowns them: needs root")
	}
}

// call makes one API request as the volume's owner.
func (e *env) call(method, route, p string, q url.Values, body io.Reader) (int, []byte, http.Header) {
	e.t.Helper()
	return e.callAs(method, route, p, q, body, "Bearer "+testToken, testVolume)
}

func (e *env) callAs(method, route, p string, q url.Values, body io.Reader, auth, volume string) (int, []byte, http.Header) {
	e.t.Helper()
	if q == nil {
		q = url.Values{}
	}
	if p != "" {
		q.Set("path", p)
	}
	u := e.srv.URL + "/volumecontent/" + volume + "/" + route + "?" + q.Encode()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	// Link targets are the sandbox's own text (the tests plant absolute
	// host paths in some); everything else must not name the host.
	if bytes.Contains(targetRe.ReplaceAll(b, nil), []byte(e.base)) {
		e.t.Errorf("%s %s %q: answer leaks a host path: %s", method, route, p, b)
	}
	if bytes.Contains(b, []byte(secretText)) {
		e.t.Errorf("%s %s %q: answer leaks host content: %s", method, route, p, b)
	}
	if res.StatusCode >= 400 {
		var eb map[string]any
		if err := json.Unmarshal(b, &eb); err != nil {
			e.t.Errorf("%s %s %q: error body is not JSON: %q", method, route, p, b)
		} else if eb["code"] != strconv.Itoa(res.StatusCode) || eb["message"] == "" || len(eb) != 2 {
			e.t.Errorf("%s %s %q: error body %s does not match status %d", method, route, p, b, res.StatusCode)
		}
	}
	return res.StatusCode, b, res.Header
}

// stat decodes a VolumeEntryStat, checking it has exactly the schema's
// fields.
func (e *env) stat(b []byte) entryStat {
	e.t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		e.t.Fatalf("not a JSON object: %q", b)
	}
	checkFields(e.t, m)
	var s entryStat
	if err := json.Unmarshal(b, &s); err != nil {
		e.t.Fatal(err)
	}
	return s
}

func checkFields(t *testing.T, m map[string]any) {
	t.Helper()
	want := []string{"atime", "ctime", "gid", "mode", "mtime", "name", "path", "size", "type", "uid"}
	if m["type"] == "symlink" {
		want = append(want, "target")
		sort.Strings(want)
	}
	var got []string
	for k := range m {
		got = append(got, k)
	}
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("fields %v, want %v", got, want)
	}
	for _, k := range []string{"size", "mode", "uid", "gid"} {
		if _, ok := m[k].(float64); !ok {
			t.Errorf("%s = %#v, want a number", k, m[k])
		}
	}
	for _, k := range []string{"name", "path", "type"} {
		if _, ok := m[k].(string); !ok {
			t.Errorf("%s = %#v, want a string", k, m[k])
		}
	}
	for _, k := range []string{"atime", "mtime", "ctime"} {
		s, _ := m[k].(string)
		if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
			t.Errorf("%s = %#v, want an RFC 3339 date-time", k, m[k])
		}
	}
}

func (e *env) list(b []byte) []entryStat {
	e.t.Helper()
	var ms []map[string]any
	if err := json.Unmarshal(b, &ms); err != nil {
		e.t.Fatalf("not a JSON array: %q", b)
	}
	for _, m := range ms {
		checkFields(e.t, m)
	}
	var out []entryStat
	if err := json.Unmarshal(b, &out); err != nil {
		e.t.Fatal(err)
	}
	return out
}

func paths(es []entryStat) []string {
	out := []string{}
	for _, s := range es {
		out = append(out, s.Path)
	}
	return out
}

// write puts a file into the volume directly, as a sandbox would.
func (e *env) write(rel, content string) {
	e.t.Helper()
	p := filepath.Join(e.vol, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) symlink(target, rel string) {
	e.t.Helper()
	if err := os.Symlink(target, filepath.Join(e.vol, rel)); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) read(rel string) string {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.vol, rel))
	if err != nil {
		e.t.Fatal(err)
	}
	return string(b)
}

func owner(t *testing.T, p string) (uid, gid uint32, mode os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid, fi.Mode()
}

// outsideSnapshot records everything below the outside directory.
func (e *env) outsideSnapshot() map[string]string {
	e.t.Helper()
	snap := map[string]string{}
	err := filepath.Walk(e.outside, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		v := fi.Mode().String() + " " + strconv.Itoa(int(st.Uid)) + ":" + strconv.Itoa(int(st.Gid))
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += " " + string(b)
		}
		snap[p] = v
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return snap
}

// checkOutside fails unless the outside directory is as in before, and
// leftover-free: nothing created, changed or removed there.
func (e *env) checkOutside(before map[string]string) {
	e.t.Helper()
	after := e.outsideSnapshot()
	for p, v := range before {
		if after[p] != v {
			e.t.Errorf("outside %s changed: %q -> %q", p, v, after[p])
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			e.t.Errorf("outside %s was created", p)
		}
	}
}

var targetRe = regexp.MustCompile(`"target":"[^"]*"`)

func q(kv ...string) url.Values {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v
}

func TestAuthAndRouting(t *testing.T) {
	e := newEnv(t, Options{})
	e.write("f.txt", "x")
	tests := []struct {
		name   string
		method string
		route  string
		auth   string
		volume string
		want   int
	}{
		{"no token", "GET", "path", "", testVolume, 401},
		{"empty bearer", "GET", "path", "Bearer ", testVolume, 401},
		{"basic auth", "GET", "path", "Basic " + testToken, testVolume, 401},
		{"wrong token", "GET", "path", "Bearer nope", testVolume, 401},
		{"wrong token on write", "PUT", "file", "Bearer nope", testVolume, 401},
		{"unknown volume", "GET", "path", "Bearer " + testToken, "other", 404},
		{"resolver failure", "GET", "path", "Bearer " + testToken, "broken", 500},
		{"volume dir missing", "GET", "path", "Bearer " + testToken, "gone", 500},
		{"unknown route", "GET", "files", "Bearer " + testToken, testVolume, 404},
		{"wrong method", "POST", "path", "Bearer " + testToken, testVolume, 405},
		{"lowercase scheme", "GET", "path", "bearer " + testToken, testVolume, 200},
		{"ok", "GET", "path", "Bearer " + testToken, testVolume, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, b, h := e.callAs(tt.method, tt.route, "/f.txt", nil, strings.NewReader("new"), tt.auth, tt.volume)
			if st != tt.want {
				t.Fatalf("status %d, want %d: %s", st, tt.want, b)
			}
			if st == 405 && h.Get("Allow") != "GET, PATCH, DELETE" {
				t.Errorf("Allow = %q", h.Get("Allow"))
			}
		})
	}
	if got := e.read("f.txt"); got != "x" {
		t.Errorf("unauthorized write changed the file: %q", got)
	}
}

func TestGetInfo(t *testing.T) {
	e := newEnv(t, Options{})
	e.write("dir/f.txt", "hello")
	if err := os.Chmod(filepath.Join(e.vol, "dir/f.txt"), 0o640); err != nil {
		t.Fatal(err)
	}
	e.symlink("dir/f.txt", "link")
	mtime := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(e.vol, "dir/f.txt"), mtime, mtime); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		path                   string
		status                 int
		name, typ, wantPath    string
		size                   int64
		mode                   uint32
		target                 string
		checkMtime, checkOwner bool
	}{
		{path: "/dir/f.txt", status: 200, name: "f.txt", typ: "file", wantPath: "/dir/f.txt", size: 5, mode: 0o640, checkMtime: true, checkOwner: true},
		{path: "dir/f.txt", status: 200, name: "f.txt", typ: "file", wantPath: "/dir/f.txt", size: 5, mode: 0o640},
		{path: "/dir/./x/../f.txt", status: 200, name: "f.txt", typ: "file", wantPath: "/dir/f.txt", size: 5, mode: 0o640},
		{path: "//dir//f.txt", status: 200, name: "f.txt", typ: "file", wantPath: "/dir/f.txt", size: 5, mode: 0o640},
		{path: "/dir", status: 200, name: "dir", typ: "directory", wantPath: "/dir", mode: 0o755},
		{path: "/", status: 200, name: "/", typ: "directory", wantPath: "/", mode: 0o755},
		{path: "/link", status: 200, name: "link", typ: "symlink", wantPath: "/link", size: 9, mode: 0o777, target: "dir/f.txt"},
		{path: "/missing", status: 404},
		{path: "/dir/f.txt/x", status: 404},
		{path: "", status: 400},
	}
	if err := os.Chmod(e.vol, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			st, b, _ := e.call("GET", "path", tt.path, nil, nil)
			if st != tt.status {
				t.Fatalf("status %d, want %d: %s", st, tt.status, b)
			}
			if st != 200 {
				return
			}
			s := e.stat(b)
			if s.Name != tt.name || s.Type != tt.typ || s.Path != tt.wantPath || s.Mode != tt.mode || s.Target != tt.target {
				t.Errorf("got %+v", s)
			}
			if tt.typ != "directory" && s.Size != tt.size {
				t.Errorf("size %d, want %d", s.Size, tt.size)
			}
			if tt.checkMtime && !s.Mtime.Equal(mtime) {
				t.Errorf("mtime %v, want %v", s.Mtime, mtime)
			}
			if tt.checkOwner && os.Geteuid() == 0 && (s.UID != OverflowID || s.GID != OverflowID) {
				t.Errorf("host root's file reported as %d:%d, want the overflow id", s.UID, s.GID)
			}
		})
	}
}

func TestListDir(t *testing.T) {
	e := newEnv(t, Options{})
	e.write("a/b/c/d/e.txt", "e")
	e.write("a/b/x.txt", "x")
	e.write("a/y.txt", "yy")
	e.write("top.txt", "t")
	e.symlink("a", "alink")
	if err := syscall.Mkfifo(filepath.Join(e.vol, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name   string
		path   string
		depth  string
		status int
		want   []string
	}{
		{"root default depth", "/", "", 200, []string{"/a", "/alink", "/fifo", "/top.txt"}},
		{"depth 1", "/a", "1", 200, []string{"/a/b", "/a/y.txt"}},
		{"depth 2", "/a", "2", 200, []string{"/a/b", "/a/b/c", "/a/b/x.txt", "/a/y.txt"}},
		{"depth 3", "a", "3", 200, []string{"/a/b", "/a/b/c", "/a/b/c/d", "/a/b/x.txt", "/a/y.txt"}},
		{"depth capped", "/a", "4294967295", 200, []string{"/a/b", "/a/b/c", "/a/b/c/d", "/a/b/c/d/e.txt", "/a/b/x.txt", "/a/y.txt"}},
		{"links are listed not entered", "/", "2", 200, []string{"/a", "/a/b", "/a/y.txt", "/alink", "/fifo", "/top.txt"}},
		{"through an inside link", "/alink", "1", 200, []string{"/alink/b", "/alink/y.txt"}},
		{"empty dir", "/a/b/c/d", "1", 200, []string{"/a/b/c/d/e.txt"}},
		{"depth 0", "/a", "0", 400, nil},
		{"depth not a number", "/a", "two", 400, nil},
		{"depth negative", "/a", "-1", 400, nil},
		{"not a dir", "/top.txt", "", 400, nil},
		{"fifo", "/fifo", "", 400, nil},
		{"missing", "/nope", "", 404, nil},
		{"no path", "", "", 400, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := url.Values{}
			if tt.depth != "" {
				v.Set("depth", tt.depth)
			}
			st, b, h := e.call("GET", "dir", tt.path, v, nil)
			if st != tt.status {
				t.Fatalf("status %d, want %d: %s", st, tt.status, b)
			}
			if st != 200 {
				return
			}
			if ct := h.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if got := paths(e.list(b)); !slices.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}

	if err := os.MkdirAll(filepath.Join(e.vol, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	st, b, _ := e.call("GET", "dir", "/empty", nil, nil)
	if st != 200 || strings.TrimSpace(string(b)) != "[]" {
		t.Errorf("empty dir: %d %q, want 200 []", st, b)
	}
	_, b, _ = e.call("GET", "dir", "/", nil, nil)
	for _, s := range e.list(b) {
		want, ok := map[string]string{"/a": "directory", "/alink": "symlink", "/fifo": "unknown", "/top.txt": "file", "/empty": "directory"}[s.Path]
		if !ok || s.Type != want {
			t.Errorf("%s: type %q, want %q", s.Path, s.Type, want)
		}
		if s.Path == "/alink" && s.Target != "a" {
			t.Errorf("link target %q", s.Target)
		}
	}
}

func TestMakeDir(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, Options{})
	e.write("file", "x")
	tests := []struct {
		name   string
		path   string
		params url.Values
		status int
		mode   uint32
		uid    uint32
	}{
		{"simple", "/d1", nil, 201, 0o755, 1000},
		{"with owner and mode", "/d2", q("uid", "0", "gid", "0", "mode", "448"), 201, 0o700, 0},
		{"sticky", "/d3", q("mode", "1023"), 201, 0o1777, 1000},
		{"exists", "/d1", nil, 409, 0, 0},
		{"exists with force", "/d1", q("force", "true"), 201, 0o755, 1000},
		{"root", "/", nil, 409, 0, 0},
		{"root with force", "/", q("force", "true"), 201, 0o755, 0},
		{"missing parent", "/p/q/r", nil, 404, 0, 0},
		{"parent is a file", "/file/sub", q("force", "true"), 409, 0, 0},
		{"is a file", "/file", q("force", "true"), 409, 0, 0},
		{"bad uid", "/d4", q("uid", "65536"), 400, 0, 0},
		{"bad mode", "/d4", q("mode", "4096"), 400, 0, 0},
		{"octal-looking mode is decimal", "/d4", q("mode", "0o755"), 400, 0, 0},
		{"bad force", "/d4", q("force", "yes please"), 400, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, b, _ := e.call("POST", "dir", tt.path, tt.params, nil)
			if st != tt.status {
				t.Fatalf("status %d, want %d: %s", st, tt.status, b)
			}
			if st != 201 {
				return
			}
			s := e.stat(b)
			if s.Type != "directory" || s.Mode != tt.mode || s.Path != tt.path {
				t.Errorf("got %+v", s)
			}
			if tt.path != "/" && s.UID != tt.uid {
				t.Errorf("uid %d, want %d", s.UID, tt.uid)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(e.vol, "d4")); !os.IsNotExist(err) {
		t.Errorf("refused mkdir created d4: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.vol, "p")); !os.IsNotExist(err) {
		t.Errorf("mkdir without force created parents: %v", err)
	}

	// force creates the parents, owned like the directory.
	st, b, _ := e.call("POST", "dir", "/p/q/r", q("force", "true", "uid", "7", "gid", "8", "mode", "448"), nil)
	if st != 201 {
		t.Fatalf("force mkdir: %d %s", st, b)
	}
	for rel, mode := range map[string]os.FileMode{"p": 0o755, "p/q": 0o755, "p/q/r": 0o700} {
		uid, gid, m := owner(t, filepath.Join(e.vol, rel))
		if uid != hostBase+7 || gid != hostBase+8 || m.Perm() != mode || !m.IsDir() {
			t.Errorf("%s: %d:%d %v, want %d:%d %v", rel, uid, gid, m, hostBase+7, hostBase+8, mode)
		}
	}
	uid, gid, m := owner(t, filepath.Join(e.vol, "d3"))
	if uid != hostBase+DefaultUID || gid != hostBase+DefaultGID || m&os.ModeSticky == 0 {
		t.Errorf("d3: %d:%d %v", uid, gid, m)
	}
}

func TestWriteAndReadFile(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, Options{MaxFileBytes: 1000})
	if err := os.Mkdir(filepath.Join(e.vol, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	e.write("old.txt", "old content")

	tests := []struct {
		name    string
		path    string
		params  url.Values
		body    string
		status  int
		content string // expected on disk afterwards at path
		mode    uint32
	}{
		{"new", "/new.txt", nil, "hello", 201, "hello", 0o644},
		{"new relative", "dir/n.txt", q("mode", "384"), "rel", 201, "rel", 0o600},
		{"empty", "/empty.txt", nil, "", 201, "", 0o644},
		{"exists without force", "/old.txt", nil, "nope", 409, "old content", 0},
		{"overwrite with force", "/old.txt", q("force", "true", "mode", "420"), "new content", 201, "new content", 0o644},
		{"force on new file", "/forced.txt", q("force", "true"), "f", 201, "f", 0o644},
		{"directory", "/dir", q("force", "true"), "x", 409, "", 0},
		{"root", "/", q("force", "true"), "x", 409, "", 0},
		{"missing parent", "/nodir/x.txt", nil, "x", 404, "", 0},
		{"parent is a file", "/old.txt/x", nil, "x", 404, "", 0},
		{"max size", "/max.bin", nil, strings.Repeat("m", 1000), 201, strings.Repeat("m", 1000), 0o644},
		{"too large", "/big.bin", nil, strings.Repeat("b", 1001), 413, "", 0},
		{"too large overwrite", "/old.txt", q("force", "true"), strings.Repeat("b", 1001), 413, "new content", 0},
		{"bad gid", "/g.txt", q("gid", "-1"), "x", 400, "", 0},
		{"bad mode", "/g.txt", q("mode", "99999"), "x", 400, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, b, _ := e.call("PUT", "file", tt.path, tt.params, strings.NewReader(tt.body))
			if st != tt.status {
				t.Fatalf("status %d, want %d: %s", st, tt.status, b)
			}
			if st == 201 {
				s := e.stat(b)
				want := "/" + strings.TrimPrefix(tt.path, "/")
				if s.Type != "file" || s.Path != want || s.Size != int64(len(tt.body)) || s.Mode != tt.mode || s.UID != DefaultUID || s.GID != DefaultGID {
					t.Errorf("got %+v", s)
				}
			}
			if tt.content != "" || st == 201 {
				if got := e.read(tt.path); got != tt.content {
					t.Errorf("on disk %q, want %q", got, tt.content)
				}
			}
			// Read it back through the API.
			if st == 201 {
				st, b, h := e.call("GET", "file", tt.path, nil, nil)
				if st != 200 || string(b) != tt.body || h.Get("Content-Type") != "application/octet-stream" || h.Get("Content-Length") != strconv.Itoa(len(tt.body)) {
					t.Errorf("read back: %d %q %v", st, b, h)
				}
			}
		})
	}
	for _, name := range []string{"big.bin", "g.txt", "nodir"} {
		if _, err := os.Lstat(filepath.Join(e.vol, name)); !os.IsNotExist(err) {
			t.Errorf("refused upload left %s: %v", name, err)
		}
	}
	noStaging(t, e.vol)

	// A chunked upload has no Content-Length: the limit cuts it off while
	// streaming, and the old content stays.
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write(bytes.Repeat([]byte("c"), 1500))
		pw.Close()
	}()
	st, b, _ := e.call("PUT", "file", "/old.txt", q("force", "true"), pr)
	if st != 413 || e.read("old.txt") != "new content" {
		t.Errorf("chunked too large: %d %s, content %q", st, b, e.read("old.txt"))
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	want := []string{"vol1:/new.txt:5", "vol1:/dir/n.txt:3", "vol1:/empty.txt:0", "vol1:/old.txt:11", "vol1:/forced.txt:1", "vol1:/max.bin:1000"}
	if !slices.Equal(e.writes, want) {
		t.Errorf("OnWrite calls %v, want %v", e.writes, want)
	}
}

func TestReadFileErrors(t *testing.T) {
	e := newEnv(t, Options{})
	e.write("dir/f.txt", "content")
	if err := syscall.Mkfifo(filepath.Join(e.vol, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.symlink("fifo", "fifolink")
	e.symlink("dir/f.txt", "flink")
	tests := []struct {
		path   string
		status int
		body   string
	}{
		{"/dir/f.txt", 200, "content"},
		{"/flink", 200, "content"},
		{"/dir", 400, ""},
		{"/fifo", 400, ""}, // must not block
		{"/fifolink", 400, ""},
		{"/missing", 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			st, b, _ := e.call("GET", "file", tt.path, nil, nil)
			if st != tt.status || (st == 200 && string(b) != tt.body) {
				t.Errorf("%d %q, want %d %q", st, b, tt.status, tt.body)
			}
		})
	}
}

func TestUpdateMetadata(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, Options{})
	e.write("f.txt", "x")
	e.write("d/g.txt", "x")
	e.symlink("f.txt", "flink")
	tests := []struct {
		name   string
		path   string
		body   string
		status int
		uid    uint32
		gid    uint32
		mode   uint32
		disk   string // checked on disk
	}{
		{"all", "/f.txt", `{"uid":1001,"gid":1002,"mode":493}`, 200, 1001, 1002, 0o755, "f.txt"},
		{"mode only", "/f.txt", `{"mode":384}`, 200, 1001, 1002, 0o600, "f.txt"},
		{"uid only", "/f.txt", `{"uid":0}`, 200, 0, 1002, 0o600, "f.txt"},
		{"max ids", "/d", `{"uid":65535,"gid":65535,"mode":1533}`, 200, 65535, 65535, 0o2775, "d"},
		{"empty", "/f.txt", `{}`, 200, 0, 1002, 0o600, "f.txt"},
		{"no body", "/f.txt", ``, 200, 0, 1002, 0o600, "f.txt"},
		{"uid too large", "/f.txt", `{"uid":65536}`, 400, 0, 0, 0, ""},
		{"negative gid", "/f.txt", `{"gid":-1}`, 400, 0, 0, 0, ""},
		{"mode too large", "/f.txt", `{"mode":4096}`, 400, 0, 0, 0, ""},
		{"fractional", "/f.txt", `{"mode":1.5}`, 400, 0, 0, 0, ""},
		{"not json", "/f.txt", `mode=7`, 400, 0, 0, 0, ""},
		{"missing", "/nope", `{"mode":384}`, 404, 0, 0, 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, b, _ := e.call("PATCH", "path", tt.path, nil, strings.NewReader(tt.body))
			if st != tt.status {
				t.Fatalf("status %d, want %d: %s", st, tt.status, b)
			}
			if st != 200 {
				return
			}
			s := e.stat(b)
			if s.UID != tt.uid || s.GID != tt.gid || s.Mode != tt.mode || s.Path != tt.path {
				t.Errorf("got %+v", s)
			}
			uid, gid, _ := owner(t, filepath.Join(e.vol, tt.disk))
			if uid != hostBase+tt.uid || gid != hostBase+tt.gid {
				t.Errorf("on disk %d:%d, want shifted %d:%d", uid, gid, hostBase+tt.uid, hostBase+tt.gid)
			}
		})
	}
	// Through a link inside the volume: the target changes, the answer
	// describes the link.
	st, b, _ := e.call("PATCH", "path", "/flink", nil, strings.NewReader(`{"mode":420}`))
	if st != 200 || e.stat(b).Type != "symlink" {
		t.Fatalf("patch through inside link: %d %s", st, b)
	}
	if _, _, m := owner(t, filepath.Join(e.vol, "f.txt")); m.Perm() != 0o644 {
		t.Errorf("link target mode %v, want 0644", m)
	}
}

func TestOwnershipShift(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, Options{})
	e.write("hostroot.txt", "x") // owned by host root: not a sandbox id
	if err := os.Lchown(filepath.Join(e.vol, "hostroot.txt"), 0, hostBase+65536); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name             string
		params           url.Values
		apiUID, apiGID   uint32
		diskUID, diskGID uint32
	}{
		{"default", nil, 1000, 1000, hostBase + 1000, hostBase + 1000},
		{"sandbox root", q("uid", "0", "gid", "0"), 0, 0, hostBase, hostBase},
		{"top of range", q("uid", "65535", "gid", "12"), 65535, 12, hostBase + 65535, hostBase + 12},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := "/own" + strconv.Itoa(i)
			st, b, _ := e.call("PUT", "file", p, tt.params, strings.NewReader("x"))
			if st != 201 {
				t.Fatalf("status %d: %s", st, b)
			}
			s := e.stat(b)
			if s.UID != tt.apiUID || s.GID != tt.apiGID {
				t.Errorf("API shows %d:%d, want %d:%d", s.UID, s.GID, tt.apiUID, tt.apiGID)
			}
			uid, gid, _ := owner(t, filepath.Join(e.vol, p))
			if uid != tt.diskUID || gid != tt.diskGID {
				t.Errorf("disk %d:%d, want %d:%d", uid, gid, tt.diskUID, tt.diskGID)
			}
		})
	}
	st, b, _ := e.call("GET", "path", "/hostroot.txt", nil, nil)
	if s := e.stat(b); st != 200 || s.UID != OverflowID || s.GID != OverflowID {
		t.Errorf("ids outside the sandbox range: %d %+v, want %d:%d", st, s, OverflowID, OverflowID)
	}
	for _, v := range []url.Values{q("uid", "65536"), q("gid", "100000"), q("uid", "-5"), q("uid", "x")} {
		if st, b, _ := e.call("PUT", "file", "/bad", v, strings.NewReader("x")); st != 400 {
			t.Errorf("%v: %d %s, want 400", v, st, b)
		}
	}
}

func TestRemove(t *testing.T) {
	e := newEnv(t, Options{})
	e.write("f.txt", "x")
	e.write("tree/a/b/c.txt", "x")
	e.symlink("tree", "treelink")
	tests := []struct {
		path   string
		status int
		gone   string
		kept   string
	}{
		{"/f.txt", 204, "f.txt", ""},
		{"/treelink", 204, "treelink", "tree/a/b/c.txt"}, // the link, not the tree
		{"/tree", 204, "tree", ""},
		{"/f.txt", 404, "", ""},
		{"/", 400, "", "."},
		{"", 400, "", "."},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			st, b, _ := e.call("DELETE", "path", tt.path, nil, nil)
			if st != tt.status {
				t.Fatalf("status %d, want %d: %s", st, tt.status, b)
			}
			if st == 204 && len(b) != 0 {
				t.Errorf("204 with a body: %q", b)
			}
			if tt.gone != "" {
				if _, err := os.Lstat(filepath.Join(e.vol, tt.gone)); !os.IsNotExist(err) {
					t.Errorf("%s still there: %v", tt.gone, err)
				}
			}
			if tt.kept != "" {
				if _, err := os.Lstat(filepath.Join(e.vol, tt.kept)); err != nil {
					t.Errorf("%s removed: %v", tt.kept, err)
				}
			}
		})
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if want := []string{"vol1:/f.txt", "vol1:/treelink", "vol1:/tree"}; !slices.Equal(e.deletes, want) {
		t.Errorf("OnDelete calls %v, want %v", e.deletes, want)
	}
}

// TestInsideLinks: links that stay inside the volume are followed for
// content and replaced, not followed, where the entry itself is at stake.
func TestInsideLinks(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, Options{})
	e.write("real/target.txt", "original")
	e.symlink("real/target.txt", "rel-link")
	e.symlink("../real/target.txt", "real2")
	e.symlink("loop-b", "loop-a")
	e.symlink("loop-a", "loop-b")
	e.symlink("nothing-here", "dangling")

	// Writing through a link to a file inside overwrites the target.
	st, b, _ := e.call("PUT", "file", "/rel-link", q("force", "true"), strings.NewReader("updated"))
	if st != 201 || e.read("real/target.txt") != "updated" {
		t.Fatalf("write through inside link: %d %s, target %q", st, b, e.read("real/target.txt"))
	}
	if fi, err := os.Lstat(filepath.Join(e.vol, "rel-link")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("link was replaced: %v %v", fi, err)
	}
	// A link whose target climbs above the volume root via a dir is
	// resolved lexically inside the root, which here stays inside.
	if st, b, _ := e.call("GET", "file", "/real/../rel-link", nil, nil); st != 200 || string(b) != "updated" {
		t.Errorf("read: %d %q", st, b)
	}
	tests := []struct {
		method, route, path string
		status              int
	}{
		{"GET", "file", "/loop-a", 400},
		{"GET", "path", "/loop-a", 200}, // lstat: the link itself
		{"GET", "file", "/dangling", 404},
		{"PUT", "file", "/dangling", 404}, // force: would create "nothing-here"
		{"POST", "dir", "/dangling", 409},
	}
	for _, tt := range tests {
		v := q("force", "true")
		if st, b, _ := e.call(tt.method, tt.route, tt.path, v, strings.NewReader("x")); st != tt.status {
			t.Errorf("%s %s %s: %d %s, want %d", tt.method, tt.route, tt.path, st, b, tt.status)
		}
	}
	if _, err := os.Lstat(filepath.Join(e.vol, "nothing-here")); !os.IsNotExist(err) {
		t.Errorf("write through dangling link created its target: %v", err)
	}
}

// hostileLinks plants links to the outside directory, by absolute and by
// relative target.
func hostileLinks(e *env) {
	e.symlink(filepath.Join(e.outside, "secret.txt"), "abs-file")
	e.symlink("../outside/secret.txt", "rel-file")
	e.symlink(filepath.Join(e.outside, "outdir"), "abs-dir")
	e.symlink("../outside/outdir", "rel-dir")
	e.symlink("..", "up")
	e.symlink("/", "slash")
	if err := os.Mkdir(filepath.Join(e.vol, "sub"), 0o755); err != nil {
		e.t.Fatal(err)
	}
	e.symlink("../../outside", "sub/up2")
}

func TestHostileLinksToFiles(t *testing.T) {
	requireRoot(t)
	for _, link := range []string{"/abs-file", "/rel-file", "/up/outside/secret.txt", "/sub/up2/secret.txt", "/slash" + "/etc/passwd"} {
		t.Run(link, func(t *testing.T) {
			e := newEnv(t, Options{})
			hostileLinks(e)
			passwd, _ := os.ReadFile("/etc/passwd")
			before := e.outsideSnapshot()

			tests := []struct {
				name   string
				method string
				route  string
				params url.Values
				body   string
				status int
			}{
				{"read", "GET", "file", nil, "", 403},
				{"write with force", "PUT", "file", q("force", "true"), "pwned", 403},
				{"chmod", "PATCH", "path", nil, `{"mode":511}`, 403},
				{"chown", "PATCH", "path", nil, `{"uid":0,"gid":0}`, 403},
				{"mkdir under", "POST", "dir", q("force", "true"), "", 0}, // 403 or 409: never created
				{"list", "GET", "dir", nil, "", 0},
			}
			for _, tt := range tests {
				p := link
				if tt.name == "mkdir under" {
					p += "/newdir"
				}
				st, b, _ := e.call(tt.method, tt.route, p, tt.params, strings.NewReader(tt.body))
				if (tt.status != 0 && st != tt.status) || st < 400 {
					t.Errorf("%s: status %d, want %d: %s", tt.name, st, tt.status, b)
				}
			}
			e.checkOutside(before)
			if now, _ := os.ReadFile("/etc/passwd"); !bytes.Equal(now, passwd) {
				t.Fatal("/etc/passwd changed")
			}
			if _, err := os.Lstat("/etc/passwd/newdir"); err == nil {
				t.Error("created /etc/passwd/newdir")
			}

			// Deleting a planted link removes the link, nothing else.
			if strings.Count(link, "/") == 1 {
				st, b, _ := e.call("DELETE", "path", link, nil, nil)
				if st != 204 {
					t.Errorf("delete link: %d %s", st, b)
				}
				if _, err := os.Lstat(filepath.Join(e.vol, link)); !os.IsNotExist(err) {
					t.Errorf("link still there: %v", err)
				}
				e.checkOutside(before)
			}
		})
	}
}

func TestHostileLinksToDirs(t *testing.T) {
	requireRoot(t)
	for _, dir := range []string{"/abs-dir", "/rel-dir", "/up/outside/outdir", "/sub/up2/outdir", "/slash/tmp"} {
		t.Run(dir, func(t *testing.T) {
			e := newEnv(t, Options{})
			hostileLinks(e)
			before := e.outsideSnapshot()
			tests := []struct {
				name   string
				method string
				route  string
				path   string
				params url.Values
				body   string
			}{
				{"list", "GET", "dir", dir, q("depth", "3"), ""},
				{"stat inside", "GET", "path", dir + "/inner.txt", nil, ""},
				{"read inside", "GET", "file", dir + "/inner.txt", nil, ""},
				{"mkdir under", "POST", "dir", dir + "/made", nil, ""},
				{"mkdir -p under", "POST", "dir", dir + "/made/deeper", q("force", "true"), ""},
				{"write under", "PUT", "file", dir + "/new.txt", nil, "pwned"},
				{"overwrite under", "PUT", "file", dir + "/inner.txt", q("force", "true"), "pwned"},
				{"chmod dir", "PATCH", "path", dir, nil, `{"mode":511}`},
				{"chmod inside", "PATCH", "path", dir + "/inner.txt", nil, `{"mode":511}`},
				{"delete inside", "DELETE", "path", dir + "/inner.txt", nil, ""},
			}
			for _, tt := range tests {
				st, b, _ := e.call(tt.method, tt.route, tt.path, tt.params, strings.NewReader(tt.body))
				if st != 403 {
					t.Errorf("%s: status %d, want 403: %s", tt.name, st, b)
				}
			}
			e.checkOutside(before)
			for _, p := range []string{"/tmp/made", "/tmp/new.txt"} {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("created %s", p)
				}
			}

			// A listing of the volume shows the links and does not enter
			// them.
			st, b, _ := e.call("GET", "dir", "/", q("depth", "16"), nil)
			if st != 200 || bytes.Contains(b, []byte("inner.txt")) || bytes.Contains(b, []byte("passwd")) {
				t.Errorf("listing entered a hostile link: %d %s", st, b)
			}
			// Removing a directory that holds a hostile link removes the
			// link, not its target.
			if st, b, _ := e.call("DELETE", "path", "/sub", nil, nil); st != 204 {
				t.Errorf("delete /sub: %d %s", st, b)
			}
			e.checkOutside(before)
		})
	}
}

func TestHostilePaths(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, Options{})
	e.write("etc/passwd", "volume's own passwd")
	passwd, _ := os.ReadFile("/etc/passwd")
	before := e.outsideSnapshot()
	tests := []struct {
		path   string
		status int // for every route
	}{
		{"../outside/secret.txt", 400},
		{"/../outside/secret.txt", 400},
		{"/../../etc/passwd", 400},
		{"a/../../outside/secret.txt", 400},
		{"..", 400},
		{"/..", 400},
		{"x\x00y", 400},
		{"/etc/passwd\x00.txt", 400},
		{"/" + strings.Repeat("a/", 2100), 400},
	}
	routes := []struct {
		method, route string
		params        url.Values
		body          string
	}{
		{"GET", "file", nil, ""},
		{"GET", "path", nil, ""},
		{"GET", "dir", nil, ""},
		{"PUT", "file", q("force", "true"), "pwned"},
		{"POST", "dir", q("force", "true"), ""},
		{"PATCH", "path", nil, `{"mode":511}`},
		{"DELETE", "path", nil, ""},
	}
	for _, tt := range tests {
		for _, r := range routes {
			st, b, _ := e.call(r.method, r.route, tt.path, r.params, strings.NewReader(r.body))
			if st != tt.status {
				t.Errorf("%s %s %q: %d %s, want %d", r.method, r.route, tt.path, st, b, tt.status)
			}
		}
	}
	e.checkOutside(before)
	if now, _ := os.ReadFile("/etc/passwd"); !bytes.Equal(now, passwd) {
		t.Fatal("/etc/passwd changed")
	}
	if got := e.read("etc/passwd"); got != "volume's own passwd" {
		t.Errorf("volume file changed: %q", got)
	}

	// Absolute paths are inside the volume: "/etc/passwd" is the volume's.
	if st, b, _ := e.call("GET", "file", "//etc//passwd", nil, nil); st != 200 || string(b) != "volume's own passwd" {
		t.Errorf("//etc//passwd: %d %q", st, b)
	}
	if st, _, _ := e.call("GET", "file", "/etc/shadow", nil, nil); st != 404 {
		t.Errorf("/etc/shadow: %d, want 404", st)
	}
}

// noStaging fails if an upload's staging file was left in dir.
func noStaging(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), ".corral-upload-") {
			t.Errorf("staging file %s left behind", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestSwapRace swaps a directory and a file for links to the outside while
// requests run: whatever the interleaving, nothing outside changes.
func TestSwapRace(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, Options{})
	before := e.outsideSnapshot()
	flipDir := filepath.Join(e.vol, "flip")
	flipFile := filepath.Join(e.vol, "flipfile")

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_ = os.RemoveAll(flipDir)
			_ = os.Remove(flipFile)
			if i%2 == 0 {
				_ = os.Symlink(e.outside, flipDir)
				_ = os.Symlink(filepath.Join(e.outside, "secret.txt"), flipFile)
			} else {
				_ = os.Mkdir(flipDir, 0o755)
				_ = os.WriteFile(filepath.Join(flipDir, "secret.txt"), []byte("inside"), 0o644)
				_ = os.WriteFile(flipFile, []byte("inside"), 0o644)
			}
		}
	}()

	reqs := []struct {
		method, route, path string
		params              url.Values
		body                string
	}{
		{"PUT", "file", "/flip/secret.txt", q("force", "true"), "pwned"},
		{"PUT", "file", "/flip/new.txt", nil, "pwned"},
		{"PUT", "file", "/flipfile", q("force", "true"), "pwned"},
		{"POST", "dir", "/flip/made/deep", q("force", "true"), ""},
		{"PATCH", "path", "/flip", nil, `{"mode":511,"uid":0}`},
		{"PATCH", "path", "/flipfile", nil, `{"mode":511,"uid":0}`},
		{"PATCH", "path", "/flip/secret.txt", nil, `{"mode":511,"uid":0}`},
		{"GET", "file", "/flip/secret.txt", nil, ""},
		{"GET", "file", "/flipfile", nil, ""},
		{"GET", "dir", "/flip", q("depth", "3"), ""},
		{"DELETE", "path", "/flip/secret.txt", nil, ""},
		{"DELETE", "path", "/flip", nil, ""},
	}
	statuses := map[int]int{}
	deadline := time.Now().Add(2 * time.Second)
	for n := 0; time.Now().Before(deadline); n++ {
		r := reqs[n%len(reqs)]
		st, b, _ := e.call(r.method, r.route, r.path, r.params, strings.NewReader(r.body))
		statuses[st]++
		if st >= 500 {
			t.Errorf("%s %s %s: %d %s", r.method, r.route, r.path, st, b)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("statuses: %v", statuses)
	if statuses[403] == 0 || statuses[200]+statuses[201]+statuses[204] == 0 {
		t.Errorf("the race did not exercise both states: %v", statuses)
	}
	e.checkOutside(before)
}

func TestJSONErrorShape(t *testing.T) {
	e := newEnv(t, Options{})
	st, b, h := e.call("GET", "path", "/nope", nil, nil)
	if st != 404 || h.Get("Content-Type") != "application/json" {
		t.Fatalf("%d %v", st, h)
	}
	var body map[string]any
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatal(err)
	}
	if body["code"] != "404" || body["message"] != "path /nope not found" {
		t.Errorf("body %v", body)
	}
}

func TestCleanPath(t *testing.T) {
	tests := []struct {
		in, api, rel string
		bad          bool
	}{
		{"/", "/", ".", false},
		{".", "/", ".", false},
		{"///", "/", ".", false},
		{"a", "/a", "a", false},
		{"/a/b/", "/a/b", "a/b", false},
		{"/a/./b/../c", "/a/c", "a/c", false},
		{"a/..", "/", ".", false},
		{"", "", "", true},
		{"..", "", "", true},
		{"/a/../..", "", "", true},
		{"/../etc/passwd", "", "", true},
		{"a\x00", "", "", true},
	}
	for _, tt := range tests {
		api, rel, err := cleanPath(tt.in)
		if (err != nil) != tt.bad || api != tt.api || rel != tt.rel {
			t.Errorf("cleanPath(%q) = %q, %q, %v", tt.in, api, rel, err)
		}
	}
}
