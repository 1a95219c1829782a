package agent

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"

	fspb "github.com/corralhq/corral/proto/filesystem"
)

func TestStat(t *testing.T) {
	e := newTestEnv(t, nil)
	h := e.home
	writeFile(t, h+"/a.txt", "x")
	if err := os.Chmod(h+"/a.txt", 0o640); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(h+"/a.txt", "user.e2b.k", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	must(t, os.Mkdir(h+"/d", 0o755))
	must(t, os.Symlink("a.txt", h+"/link"))
	must(t, os.Symlink("d", h+"/dlink"))
	must(t, os.Symlink("missing", h+"/dangling"))
	tests := []struct {
		name, path, wantPath string
		typ                  fspb.FileType
		mode                 uint32
		perms, target        string
		size                 int64
		md                   map[string]string
	}{
		{"relative file", "a.txt", h + "/a.txt", fspb.FileType_FILE_TYPE_FILE, 0o640, "-rw-r-----", "", 1, map[string]string{"k": "v"}},
		{"tilde dir", "~/d", h + "/d", fspb.FileType_FILE_TYPE_DIRECTORY, 0o755, "drwxr-xr-x", "", -1, nil},
		{"home", "", h, fspb.FileType_FILE_TYPE_DIRECTORY, 0o755, "drwxr-xr-x", "", -1, nil},
		{"symlink to file", h + "/link", h + "/link", fspb.FileType_FILE_TYPE_FILE, 0o777, "Lrwxrwxrwx", h + "/a.txt", -1, nil},
		{"symlink to dir", "dlink", h + "/dlink", fspb.FileType_FILE_TYPE_DIRECTORY, 0o777, "Lrwxrwxrwx", h + "/d", -1, nil},
		{"dangling symlink", "dangling", h + "/dangling", fspb.FileType_FILE_TYPE_UNSPECIFIED, 0o777, "Lrwxrwxrwx", h + "/missing", -1, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := e.fs.Stat(context.Background(), connect.NewRequest(&fspb.StatRequest{Path: tc.path}))
			if err != nil {
				t.Fatal(err)
			}
			en := r.Msg.GetEntry()
			if en.GetPath() != tc.wantPath || en.GetName() != filepath.Base(tc.wantPath) || en.GetType() != tc.typ ||
				en.GetMode() != tc.mode || en.GetPermissions() != tc.perms || en.GetSymlinkTarget() != tc.target ||
				en.GetOwner() != "root" || en.GetGroup() != "root" {
				t.Fatalf("entry %v", en)
			}
			if tc.size >= 0 && en.GetSize() != tc.size {
				t.Fatalf("size %d", en.GetSize())
			}
			if len(en.GetMetadata()) != len(tc.md) || en.GetMetadata()["k"] != tc.md["k"] {
				t.Fatalf("metadata %v", en.GetMetadata())
			}
			if time.Since(en.GetModifiedTime().AsTime()) > time.Minute {
				t.Fatalf("modified time %v", en.GetModifiedTime())
			}
		})
	}
	_, err := e.fs.Stat(context.Background(), connect.NewRequest(&fspb.StatRequest{Path: "nope"}))
	wantCode(t, err, connect.CodeNotFound, "path '"+h+"/nope' does not exist")
	_, err = e.fs.Stat(context.Background(), connect.NewRequest(&fspb.StatRequest{Path: "/" + strings.Repeat("a", maxPathLen)}))
	wantCode(t, err, connect.CodeInvalidArgument, "path too long")

	// The JSON the SDK sees: size as a string, timestamp with Z.
	r, err := e.fs.Stat(context.Background(), connect.NewRequest(&fspb.StatRequest{Path: "a.txt"}))
	must(t, err)
	js, err := protojson.Marshal(r.Msg.GetEntry())
	must(t, err)
	var m map[string]any
	must(t, json.Unmarshal(js, &m))
	mt, _ := m["modifiedTime"].(string)
	if m["size"] != "1" || m["mode"] != float64(416) || m["type"] != "FILE_TYPE_FILE" || !strings.HasSuffix(mt, "Z") {
		t.Errorf("JSON %s", js)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestListDir(t *testing.T) {
	e := newTestEnv(t, nil)
	root := e.home + "/root"
	for _, d := range []string{"b", "b/inner", "a"} {
		must(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	for _, f := range []string{"c.txt", "b/x.txt", "b/inner/deep.txt", "a/y.txt"} {
		writeFile(t, filepath.Join(root, f), f)
	}
	must(t, os.Symlink(root, e.home+"/rootlink"))
	tests := []struct {
		path  string
		depth uint32
		want  []string
	}{
		{"root", 0, []string{"a", "b", "c.txt"}},
		{"root", 1, []string{"a", "b", "c.txt"}},
		{"root", 2, []string{"a", "a/y.txt", "b", "b/inner", "b/x.txt", "c.txt"}},
		{"root", 3, []string{"a", "a/y.txt", "b", "b/inner", "b/inner/deep.txt", "b/x.txt", "c.txt"}},
		{"rootlink", 1, []string{"a", "b", "c.txt"}},
	}
	for _, tc := range tests {
		r, err := e.fs.ListDir(context.Background(), connect.NewRequest(&fspb.ListDirRequest{Path: tc.path, Depth: tc.depth}))
		must(t, err)
		var got []string
		for _, en := range r.Msg.GetEntries() {
			rel, _ := filepath.Rel(filepath.Join(e.home, tc.path), en.GetPath())
			got = append(got, rel)
			if en.GetName() != filepath.Base(rel) {
				t.Errorf("name %q for %q", en.GetName(), rel)
			}
		}
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("ListDir(%s, %d) = %v, want %v", tc.path, tc.depth, got, tc.want)
		}
	}
	_, err := e.fs.ListDir(context.Background(), connect.NewRequest(&fspb.ListDirRequest{Path: "root/c.txt"}))
	wantCode(t, err, connect.CodeInvalidArgument, "not a directory")
	_, err = e.fs.ListDir(context.Background(), connect.NewRequest(&fspb.ListDirRequest{Path: "missing"}))
	wantCode(t, err, connect.CodeNotFound, "does not exist")
}

func TestMakeDirMoveRemove(t *testing.T) {
	e := newTestEnv(t, nil)
	r, err := e.fs.MakeDir(context.Background(), connect.NewRequest(&fspb.MakeDirRequest{Path: "p/q/r"}))
	must(t, err)
	if en := r.Msg.GetEntry(); en.GetPath() != e.home+"/p/q/r" || en.GetType() != fspb.FileType_FILE_TYPE_DIRECTORY || en.GetMode() != 0o755 {
		t.Fatalf("entry %v", en)
	}
	for _, d := range []string{"p", "p/q", "p/q/r"} {
		fi, err := os.Stat(filepath.Join(e.home, d))
		must(t, err)
		if fi.Mode().Perm() != 0o755 || !fi.IsDir() {
			t.Fatalf("%s mode %v", d, fi.Mode())
		}
	}
	_, err = e.fs.MakeDir(context.Background(), connect.NewRequest(&fspb.MakeDirRequest{Path: "p/q"}))
	wantCode(t, err, connect.CodeAlreadyExists, "already exists")
	writeFile(t, e.home+"/file", "f")
	_, err = e.fs.MakeDir(context.Background(), connect.NewRequest(&fspb.MakeDirRequest{Path: "file"}))
	wantCode(t, err, connect.CodeInvalidArgument, "not a directory")
	_, err = e.fs.MakeDir(context.Background(), connect.NewRequest(&fspb.MakeDirRequest{Path: "file/sub"}))
	wantCode(t, err, connect.CodeInvalidArgument, "")

	mv, err := e.fs.Move(context.Background(), connect.NewRequest(&fspb.MoveRequest{Source: "file", Destination: "new/parent/moved"}))
	must(t, err)
	if en := mv.Msg.GetEntry(); en.GetPath() != e.home+"/new/parent/moved" || en.GetSize() != 1 || en.GetType() != fspb.FileType_FILE_TYPE_FILE {
		t.Fatalf("moved entry %v", en)
	}
	if _, err := os.Stat(e.home + "/file"); !os.IsNotExist(err) {
		t.Fatalf("source still exists: %v", err)
	}
	_, err = e.fs.Move(context.Background(), connect.NewRequest(&fspb.MoveRequest{Source: "file", Destination: "x"}))
	wantCode(t, err, connect.CodeNotFound, "does not exist")

	for _, p := range []string{"p", "new/parent/moved", "never-existed"} {
		_, err := e.fs.Remove(context.Background(), connect.NewRequest(&fspb.RemoveRequest{Path: p}))
		must(t, err)
		if _, err := os.Lstat(filepath.Join(e.home, p)); !os.IsNotExist(err) {
			t.Fatalf("%s not removed: %v", p, err)
		}
	}
}

// fsEvent is a comparable watch event.
type fsEvent struct {
	name string
	typ  fspb.EventType
}

func TestWatchDir(t *testing.T) {
	e := newTestEnv(t, nil)
	must(t, os.Mkdir(e.home+"/w", 0o755))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req := connect.NewRequest(&fspb.WatchDirRequest{Path: "w", Recursive: true, IncludeEntry: true})
	req.Header().Set("Keepalive-Ping-Interval", "1")
	st, err := e.fs.WatchDir(ctx, req)
	must(t, err)
	if !st.Receive() || st.Msg().GetStart() == nil {
		t.Fatalf("first message not start: %v %v", st.Msg(), st.Err())
	}
	events := make(chan *fspb.WatchDirResponse, 100)
	go func() {
		for st.Receive() {
			events <- st.Msg()
		}
		close(events)
	}()
	next := func(want fsEvent) *fspb.FilesystemEvent {
		t.Helper()
		timeout := time.After(5 * time.Second)
		for {
			select {
			case m, ok := <-events:
				if !ok {
					t.Fatalf("stream ended waiting for %v: %v", want, st.Err())
				}
				if fe := m.GetFilesystem(); fe != nil && fe.GetName() == want.name && fe.GetType() == want.typ {
					return fe
				}
			case <-timeout:
				t.Fatalf("no event %v", want)
			}
		}
	}
	writeFile(t, e.home+"/w/f.txt", "hi")
	fe := next(fsEvent{"f.txt", fspb.EventType_EVENT_TYPE_CREATE})
	if fe.GetEntry().GetPath() != e.home+"/w/f.txt" {
		t.Fatalf("create entry %v", fe.GetEntry())
	}
	next(fsEvent{"f.txt", fspb.EventType_EVENT_TYPE_WRITE})
	must(t, os.Mkdir(e.home+"/w/sub", 0o755))
	next(fsEvent{"sub", fspb.EventType_EVENT_TYPE_CREATE})
	time.Sleep(100 * time.Millisecond) // the watch on sub is added on its create event
	writeFile(t, e.home+"/w/sub/g.txt", "x")
	next(fsEvent{"sub/g.txt", fspb.EventType_EVENT_TYPE_CREATE})
	must(t, os.Chmod(e.home+"/w/f.txt", 0o600))
	next(fsEvent{"f.txt", fspb.EventType_EVENT_TYPE_CHMOD})
	must(t, os.Rename(e.home+"/w/f.txt", e.home+"/w/h.txt"))
	next(fsEvent{"f.txt", fspb.EventType_EVENT_TYPE_RENAME})
	must(t, os.Remove(e.home+"/w/h.txt"))
	next(fsEvent{"h.txt", fspb.EventType_EVENT_TYPE_REMOVE})
	// Keepalive after a second of silence.
	select {
	case m := <-events:
		if m.GetKeepalive() == nil {
			t.Fatalf("want keepalive, got %v", m)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("no keepalive")
	}

	for _, tc := range []struct {
		path string
		code connect.Code
	}{{"missing", connect.CodeNotFound}, {"w/sub/g.txt", connect.CodeInvalidArgument}} {
		st, err := e.fs.WatchDir(context.Background(), connect.NewRequest(&fspb.WatchDirRequest{Path: tc.path}))
		if err == nil {
			for st.Receive() {
				t.Fatalf("unexpected %v", st.Msg())
			}
			err = st.Err()
		}
		wantCode(t, err, tc.code, "")
	}
}

func TestPolledWatcher(t *testing.T) {
	e := newTestEnv(t, nil)
	cw, err := e.fs.CreateWatcher(context.Background(), connect.NewRequest(&fspb.CreateWatcherRequest{Path: ""}))
	must(t, err)
	id := cw.Msg.GetWatcherId()
	writeFile(t, e.home+"/polled.txt", "x")
	var got []string
	if !eventually(5*time.Second, func() bool {
		r, err := e.fs.GetWatcherEvents(context.Background(), connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
		must(t, err)
		for _, ev := range r.Msg.GetEvents() {
			got = append(got, ev.GetName()+":"+ev.GetType().String())
		}
		return strings.Contains(strings.Join(got, ","), "polled.txt:EVENT_TYPE_CREATE")
	}) {
		t.Fatalf("events %v", got)
	}
	_, err = e.fs.RemoveWatcher(context.Background(), connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: id}))
	must(t, err)
	_, err = e.fs.GetWatcherEvents(context.Background(), connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
	wantCode(t, err, connect.CodeNotFound, "not found")
}
