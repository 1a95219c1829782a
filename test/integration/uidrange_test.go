package integration

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"io/fs"
	"log"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/corralhq/corral/internal/idrange"
	"github.com/corralhq/corral/internal/server"
	corral "github.com/corralhq/corral/sdk/go"
)

// TestSandboxRangeIsNotDebiansFirstUserRange defends against the host's
// first user reaching every sandbox: Debian's useradd delegates
// 100000:65536 in /etc/subuid to the first user created, who can then
// become uid 100000 with newuidmap, which is sandbox root as far as the
// host is concerned (every sandbox's files, setuid sudo of the templates,
// agent sockets). The shared server's sandboxes must map to a range that
// does not meet it.
func TestSandboxRangeIsNotDebiansFirstUserRange(t *testing.T) {
	need(t)
	id := create(t, nil)
	f := strings.Fields(mustSh(t, id, "cat /proc/self/uid_map /proc/self/gid_map"))
	if len(f) != 6 {
		t.Fatalf("uid_map and gid_map: %q", f)
	}
	for _, m := range [][]string{f[:3], f[3:]} {
		base, _ := strconv.ParseUint(m[1], 10, 32)
		count, _ := strconv.ParseUint(m[2], 10, 32)
		if m[0] != "0" || count != idrange.Count {
			t.Fatalf("map %q: want 0 BASE %d", m, idrange.Count)
		}
		if base < 100000+65536 && base+count > 100000 {
			t.Errorf("sandbox ids map to host %d-%d, which overlaps 100000-165535, the range Debian's useradd delegates to the first user", base, base+count-1)
		}
	}
}

// writeIDFiles writes subuid, subgid, passwd and group into a fresh dir.
func writeIDFiles(t *testing.T, subuid, subgid, passwd, group string) idrange.Files {
	t.Helper()
	f := idrange.InDir(t.TempDir())
	for p, s := range map[string]string{f.SubUID: subuid, f.SubGID: subgid, f.Passwd: passwd, f.Group: group} {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// TestServerRefusesDelegatedUIDRange defends against sandboxes mapped to
// host ids somebody else holds: a configured range that overlaps another
// user's /etc/subuid or /etc/subgid entry, or contains a user's uid, and
// a data dir made with such a range, make server.Open fail with a message
// naming the range, the entry and the fix; it writes nothing (no entry in
// subuid or subgid, no database, no recorded range).
func TestServerRefusesDelegatedUIDRange(t *testing.T) {
	need(t)
	const passwd = "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/bash\n"
	const group = "root:x:0:\nalice:x:1000:\n"
	legacy := func(t *testing.T, data string) {
		// A data dir of a corral that hard-coded 100000: a database and
		// no recorded range.
		if err := os.WriteFile(filepath.Join(data, "corral.db"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name                          string
		subuid, subgid, passwd, group string
		want                          idrange.Range
		prepare                       func(*testing.T, string)
		msg                           []string
	}{
		{name: "the first user's subuid range",
			subuid: "alice:100000:65536\n", subgid: "alice:100000:65536\n", passwd: passwd, group: group,
			want: idrange.Range{Base: 100000, Count: idrange.Count},
			msg:  []string{"100000-165535", `"alice:100000:65536" delegates ids in it to alice`, "--uid-range", "remove the entry"}},
		{name: "a subgid entry inside",
			subgid: "bob:310000:10\n", passwd: passwd, group: group,
			want: idrange.Range{Base: 300000, Count: idrange.Count},
			msg:  []string{"300000-365535", `"bob:310000:10" delegates ids in it to bob`, "--uid-range"}},
		{name: "a user's uid inside",
			passwd: passwd + "svc:x:300500:1000::/:/bin/false\n", group: group,
			want: idrange.Range{Base: 300000, Count: idrange.Count},
			msg:  []string{"300000-365535", `uid 300500 of "svc" is in it`, "--uid-range"}},
		{name: "a legacy data dir whose range the first user holds",
			subuid: "alice:100000:65536\n", subgid: "alice:100000:65536\n", passwd: passwd, group: group,
			prepare: legacy,
			msg:     []string{"uid range 100000:65536", `"alice:100000:65536" delegates ids in it to alice`, "new --data dir"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			files := writeIDFiles(t, tt.subuid, tt.subgid, tt.passwd, tt.group)
			data := filepath.Join(t.TempDir(), "data")
			if err := os.MkdirAll(data, 0o711); err != nil {
				t.Fatal(err)
			}
			if tt.prepare != nil {
				tt.prepare(t, data)
			}
			s, err := server.Open(context.Background(), server.Config{DataDir: data, AgentBinary: env.bin, NoNetwork: true,
				IDRange: tt.want, IDFiles: files, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err == nil {
				s.Close(context.Background())
				t.Fatalf("server started with sandbox uids %s, which the host has delegated", s.IDRange())
			}
			if !errors.Is(err, idrange.ErrNotFree) {
				t.Errorf("error %v does not wrap idrange.ErrNotFree", err)
			}
			for _, m := range tt.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not say %q", err, m)
				}
			}
			for p, was := range map[string]string{files.SubUID: tt.subuid, files.SubGID: tt.subgid} {
				if b, _ := os.ReadFile(p); string(b) != was {
					t.Errorf("%s changed to %q", p, b)
				}
			}
			if _, err := os.Stat(filepath.Join(data, server.IDRangeFile)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a refused range was recorded in the data dir: %v", err)
			}
			if tt.prepare == nil {
				if _, err := os.Stat(filepath.Join(data, "corral.db")); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("a refused server created its database: %v", err)
				}
			}
		})
	}
}

// owner returns the host uid and gid of path.
func owner(t *testing.T, path string) (uint32, uint32) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid, st.Gid
}

// findFile returns the path of the first file named base under root.
func findFile(t *testing.T, root, base string) string {
	t.Helper()
	var found string
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && found == "" && d.Name() == base {
			found = p
		}
		return nil
	})
	if found == "" {
		t.Fatalf("no %s under %s", base, root)
	}
	return found
}

// TestConfiguredUIDRange: a server configured with --uid-range 300000
// (a range nobody holds) works end to end in it: sudo inside gives root,
// the uid and gid maps show the base outside, the range is recorded as
// corral's in subuid and subgid and in the data dir, and every file the
// server stores is owned by base+uid on the host: a sandbox's writable
// layer, a built template's layer, an imported template, a snapshot (and a
// sandbox restored from it), and a volume written from inside.
func TestConfiguredUIDRange(t *testing.T) {
	const base = 300000
	r := idrange.Range{Base: base, Count: idrange.Count}
	s := startGovServer(t, "uid-range", func(c *server.Config) { c.IDRange = r })
	data := s.ts.DataDir
	if got := s.ts.Srv.IDRange(); got != r {
		t.Fatalf("server range %s, want %s", got, r)
	}
	for _, p := range []string{"subuid", "subgid"} {
		b, err := os.ReadFile(filepath.Join(s.ts.Tmp, "etc", p))
		if err != nil || !strings.Contains("\n"+string(b), "\ncorral:300000:65536\n") {
			t.Errorf("%s does not record corral's range: %q %v", p, b, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(data, server.IDRangeFile)); err != nil || string(b) != "300000:65536\n" {
		t.Errorf("data dir record %q %v", b, err)
	}
	ctx := context.Background()
	c := s.c
	sb, err := c.Create(ctx, corral.CreateOptions{Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), sb.ID) })
	run := func(sb *corral.Sandbox, cmd string) string {
		t.Helper()
		res, err := sb.Run(ctx, cmd, corral.RunOptions{})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%q: %+v %v", cmd, res, err)
		}
		return res.Stdout
	}
	if out := run(sb, "sudo -n id -u; id -u; cat /proc/self/uid_map /proc/self/gid_map | tr -s ' ' | sed 's/^ //'"); out != "0\n1000\n0 300000 65536\n0 300000 65536\n" {
		t.Fatalf("ids inside: %q", out)
	}
	run(sb, "echo mine > /home/user/mine.txt && sudo -n sh -c 'echo root > /opt/root.txt'")
	upper := filepath.Join(data, "sandboxes", sb.ID, "disk", "upper")
	for p, want := range map[string]uint32{"home/user/mine.txt": base + 1000, "opt/root.txt": base} {
		if u, g := owner(t, filepath.Join(upper, p)); u != want || g != want {
			t.Errorf("%s owned by %d:%d on the host, want %d:%d", p, u, g, want, want)
		}
	}

	// A snapshot keeps the ids; a sandbox restored from it sees its files
	// as their owners.
	sn, err := c.Snapshot(ctx, sb.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if u, _ := owner(t, findFile(t, filepath.Join(data, "snapshots", sn.ID), "mine.txt")); u != base+1000 {
		t.Errorf("snapshot file owned by %d, want %d", u, base+1000)
	}
	restored, err := c.Create(ctx, corral.CreateOptions{Snapshot: sn.ID, Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), restored.ID) })
	if out := run(restored, "cat /home/user/mine.txt; stat -c '%U %G' /home/user/mine.txt /opt/root.txt; echo more >> /home/user/mine.txt"); out != "mine\nuser user\nroot root\n" {
		t.Fatalf("restored sandbox: %q", out)
	}

	// A template built from a spec: its layer is owned by the range, and a
	// sandbox of it sees the file as the user's.
	tname := "uidr" + strings.ToLower(randHex(3))
	tv, err := c.BuildTemplate(ctx, corral.TemplateSpec{Name: tname, Version: "1", Base: "base",
		Files: []corral.TemplateFile{{Path: "/home/user/app.txt", ContentBase64: base64.StdEncoding.EncodeToString([]byte("app")), Owner: "user", Mode: "0640"}},
		Run:   []corral.TemplateCommand{{Command: "echo built > /home/user/built.txt", User: "user"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"app.txt", "built.txt"} {
		if u, g := owner(t, findFile(t, filepath.Join(data, "template-versions", tname), f)); u != base+1000 || g != base+1000 {
			t.Errorf("template layer's %s owned by %d:%d, want %d", f, u, g, base+1000)
		}
	}
	tsb, err := c.Create(ctx, corral.CreateOptions{Template: tv.Ref, Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), tsb.ID) })
	if out := run(tsb, "stat -c '%U %a' /home/user/app.txt /home/user/built.txt; cat /home/user/built.txt"); out != "user 640\nuser 644\nbuilt\n" {
		t.Fatalf("sandbox of the built template: %q", out)
	}

	// An imported image is shifted into the range.
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	u, _ := url.Parse(reg.URL)
	ref, err := name.ParseReference(u.Host+"/corral/uidrange:v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, testImage(t)); err != nil {
		t.Fatal(err)
	}
	iname := "uidrimp" + strings.ToLower(randHex(3))
	if _, err := c.PullTemplate(ctx, iname+":v1", ref.String(), true); err != nil {
		t.Fatal(err)
	}
	if u, g := owner(t, findFile(t, filepath.Join(data, "template-versions", "imports"), "hello.txt")); u != base || g != base {
		t.Errorf("imported file owned by %d:%d, want %d", u, g, base)
	}
	isb, err := c.Create(ctx, corral.CreateOptions{Template: iname + ":v1", Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), isb.ID) })
	if got, err := isb.Files().Read(ctx, "/srv/hello.txt"); err != nil || string(got) != "hello from an imported image\n" {
		t.Fatalf("file of the imported template: %q %v", got, err)
	}

	// A volume written from inside holds files of base+uid.
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Logf("volumes not checked, no loop devices: %v", err)
		return
	}
	v, err := c.CreateVolume(ctx, "uidr-"+randHex(4), 32)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.DeleteVolume(context.Background(), v.ID) })
	vsb, err := c.Create(ctx, corral.CreateOptions{Volumes: []corral.VolumeMount{{Volume: v.ID, Path: "/data"}}, Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), vsb.ID) })
	if out := run(vsb, "echo kept > /data/hello.txt && stat -c '%U' /data /data/hello.txt"); out != "user\nuser\n" {
		t.Fatalf("volume inside: %q", out)
	}
	mnt := filepath.Join(data, "volumes", v.ID, "mnt")
	for _, p := range []string{mnt, filepath.Join(mnt, "hello.txt")} {
		if u, g := owner(t, p); u != base+1000 || g != base+1000 {
			t.Errorf("volume %s owned by %d:%d on the host, want %d", p, u, g, base+1000)
		}
	}
}
