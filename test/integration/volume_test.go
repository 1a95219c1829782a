package integration

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"

	"github.com/corralhq/corral/internal/server"
	corral "github.com/corralhq/corral/sdk/go"
	"github.com/corralhq/corral/test/testserver"
)

type volumeJSON struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	SizeMB    int64  `json:"size_mb"`
	UsedBytes *int64 `json:"used_bytes"`
	Token     string `json:"token"`
}

// TestVolumes: a volume outlives the sandboxes that mount it, is capped at
// its size (ENOSPC inside, nothing beyond on the host), is mounted nosuid,
// cannot be deleted while a sandbox mounts it, and leaves nothing on the
// host once deleted. Bad requests change nothing.
//
// It runs under runc and under gVisor: gVisor's gofer serves the bind
// mount (read-write, nosuid, nodev) from the host's ext4 image.
func TestVolumes(t *testing.T) { eachRuntime(t, testVolumes) }

func testVolumes(t *testing.T, rt string) {
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("volumes need loop devices: " + err.Error())
	}
	name := "vol-" + randHex(4)
	var v volumeJSON
	if code := call(t, "POST", "/v1/volumes", map[string]any{"name": name, "size_mb": 32}, &v); code != http.StatusCreated {
		t.Fatalf("create volume: %d %+v", code, v)
	}
	t.Cleanup(func() { call(t, "DELETE", "/v1/volumes/"+v.ID, nil, nil) })
	hostDir := filepath.Join(env.dataDir, "volumes", v.ID)

	var e apiErr
	for _, tc := range []struct {
		body map[string]any
		code int
	}{
		{map[string]any{"name": name}, http.StatusConflict},
		{map[string]any{"name": "../etc"}, http.StatusBadRequest},
		{map[string]any{"name": "tiny-" + randHex(3), "size_mb": 1}, http.StatusBadRequest},
	} {
		if code := call(t, "POST", "/v1/volumes", tc.body, &e); code != tc.code {
			t.Fatalf("create %v: %d %+v, want %d", tc.body, code, e, tc.code)
		}
	}
	for _, tc := range []struct {
		mount []map[string]any
		want  string
	}{
		{[]map[string]any{{"volume": name, "path": "/etc"}}, "reserved"},
		{[]map[string]any{{"volume": name, "path": "data"}}, "absolute"},
		{[]map[string]any{{"volume": "no-such-volume", "path": "/data"}}, "does not exist"},
		{[]map[string]any{{"volume": name, "path": "/data"}, {"volume": name, "path": "/data/x"}}, "overlap"},
	} {
		var sb sandboxJSON
		code := call(t, "POST", "/v1/sandboxes", map[string]any{"runtime": rt, "volumes": tc.mount}, &sb)
		if code != http.StatusBadRequest {
			t.Fatalf("create with %v: %d, want 400", tc.mount, code)
		}
	}

	a := create(t, map[string]any{"runtime": rt, "volumes": []map[string]any{{"volume": name, "path": "/data"}}})
	if out := mustSh(t, a, "echo kept > /data/hello.txt && stat -c '%U %a' /data /data/hello.txt"); out != "user 755\nuser 644\n" {
		t.Fatalf("volume ownership: %q", out)
	}
	// The cap: 64 MiB into a 32 MiB volume ends in ENOSPC.
	res := sh(t, a, "dd if=/dev/zero of=/data/fill bs=1M count=64")
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left on device") {
		t.Fatalf("filling the volume: exit %d %q", res.ExitCode, res.Stderr)
	}
	var st volumeJSON
	call(t, "GET", "/v1/volumes/"+name, nil, &st)
	if st.UsedBytes == nil || *st.UsedBytes > 32<<20 || *st.UsedBytes < 16<<20 {
		t.Fatalf("used bytes after the fill: %v", st.UsedBytes)
	}
	fi, err := os.Stat(filepath.Join(hostDir, "image.ext4"))
	if err != nil || fi.Size() != 32<<20 {
		t.Fatalf("host image: %v %v", fi, err)
	}
	mustSh(t, a, "rm /data/fill")
	// nosuid: a setuid copy of id made by root does not make user root.
	mustSh(t, a, "cp /usr/bin/id /data/id && chmod 4755 /data/id", map[string]any{"user": "root"})
	if out := mustSh(t, a, "/data/id -u; /data/id -un"); out != "1000\nuser\n" {
		t.Fatalf("a setuid binary on the volume ran as %q", out)
	}
	if code := call(t, "DELETE", "/v1/volumes/"+name, nil, &e); code != http.StatusConflict || !strings.Contains(e.Message, a) {
		t.Fatalf("delete of a mounted volume: %d %+v", code, e)
	}

	// Another sandbox, after the first is gone, sees what it left.
	call(t, "DELETE", "/v1/sandboxes/"+a, nil, nil)
	b := create(t, map[string]any{"runtime": rt, "volumes": []map[string]any{{"volume": v.ID, "path": "/home/user/work"}}})
	if out := mustSh(t, b, "cat /home/user/work/hello.txt"); out != "kept\n" {
		t.Fatalf("second sandbox reads %q", out)
	}
	var got sandboxJSON
	call(t, "GET", "/v1/sandboxes/"+b, nil, &got)
	if len(got.Volumes) != 1 || got.Volumes[0].ID != v.ID || got.Volumes[0].Path != "/home/user/work" {
		t.Fatalf("sandbox record volumes: %+v", got.Volumes)
	}
	call(t, "DELETE", "/v1/sandboxes/"+b, nil, nil)

	if code := call(t, "DELETE", "/v1/volumes/"+name, nil, &e); code != http.StatusNoContent {
		t.Fatalf("delete: %d %+v", code, e)
	}
	if _, err := os.Stat(hostDir); !os.IsNotExist(err) {
		t.Fatalf("the volume's host dir is left: %v", err)
	}
	if mounted, _ := mountinfo.Mounted(filepath.Join(hostDir, "mnt")); mounted {
		t.Fatal("the volume is still mounted on the host")
	}
	if code := call(t, "GET", "/v1/volumes/"+name, nil, &e); code != http.StatusNotFound {
		t.Fatalf("get after delete: %d", code)
	}

	// What a create that crashed before recording its volume leaves, the
	// reaper removes.
	orphan := filepath.Join(env.dataDir, "volumes", "volorphan"+randHex(4))
	if err := os.MkdirAll(filepath.Join(orphan, "mnt"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(orphan, "image.ext4"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	env.srv.Manager.Reap(context.Background())
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Fatalf("the reaper left an orphan volume: %v", err)
	}
}

// TestCLIVolume: `corral volume create` prints the id, `corral run
// --volume NAME:/path` mounts it (files survive the run), `volume ls
// --json` lists it, `volume rm` deletes it; a bad --volume is a usage
// error that creates nothing.
func TestCLIVolume(t *testing.T) {
	need(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("volumes need loop devices: " + err.Error())
	}
	name := "clivol-" + randHex(3)
	out, stderr, code := corralCLI(t, "", "volume", "create", name, "--size", "16m")
	id := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(id, "vol") {
		t.Fatalf("volume create: exit %d %q %q", code, out, stderr)
	}
	t.Cleanup(func() { corralCLI(t, "", "volume", "rm", id) })
	if out, stderr, code := corralCLI(t, "", "run", "--volume", name+":/data", "--", "sh", "-c", "echo first > /data/f"); code != 0 {
		t.Fatalf("run with a volume: exit %d %q %q", code, out, stderr)
	}
	if out, _, code := corralCLI(t, "", "run", "--volume", id+":/srv/v", "--", "cat", "/srv/v/f"); code != 0 || out != "first\n" {
		t.Fatalf("second run reads %q (exit %d)", out, code)
	}
	if _, stderr, code := corralCLI(t, "", "run", "--volume", name, "--", "true"); code == 0 || !strings.Contains(stderr, "NAME:/absolute/path") {
		t.Fatalf("bad --volume: exit %d %q", code, stderr)
	}
	out, _, code = corralCLI(t, "", "volume", "ls", "--json")
	var list []volumeJSON
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil {
		t.Fatalf("volume ls --json: exit %d %q", code, out)
	}
	found := false
	for _, v := range list {
		found = found || v.ID == id && v.Name == name && v.SizeMB == 16
	}
	if !found {
		t.Fatalf("volume ls does not list %s: %s", id, out)
	}
	if _, stderr, code := corralCLI(t, "", "volume", "rm", name); code != 0 {
		t.Fatalf("volume rm: exit %d %q", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(env.dataDir, "volumes", id)); !os.IsNotExist(err) {
		t.Fatalf("volume rm left %v", err)
	}
}

// TestVolumePersistAndGVisor: a sandbox paused with persist (processes
// stopped, files saved) mounts its volume again when it resumes, and keeps
// the volume from being deleted meanwhile; a gVisor sandbox then mounts
// the same volume and reads and extends what the runc one wrote.
func TestVolumePersistAndGVisor(t *testing.T) {
	need(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("volumes need loop devices: " + err.Error())
	}
	name := "pvol-" + randHex(3)
	var v volumeJSON
	if code := call(t, "POST", "/v1/volumes", map[string]any{"name": name, "size_mb": 16}, &v); code != http.StatusCreated {
		t.Fatalf("create volume: %d", code)
	}
	t.Cleanup(func() { call(t, "DELETE", "/v1/volumes/"+v.ID, nil, nil) })

	id := create(t, map[string]any{"volumes": []map[string]any{{"volume": name, "path": "/data"}}})
	mustSh(t, id, "echo before > /data/p.txt")
	var sb sandboxJSON
	if code := call(t, "POST", "/v1/sandboxes/"+id+"/pause", map[string]any{"persist": true}, &sb); code != http.StatusOK {
		t.Fatalf("persist: %d", code)
	}
	var e apiErr
	if code := call(t, "DELETE", "/v1/volumes/"+name, nil, &e); code != http.StatusConflict {
		t.Fatalf("delete while a persisted sandbox mounts it: %d", code)
	}
	if code := call(t, "POST", "/v1/sandboxes/"+id+"/resume", nil, &sb); code != http.StatusOK {
		t.Fatalf("resume: %d", code)
	}
	if out := mustSh(t, id, "cat /data/p.txt && echo after >> /data/p.txt"); out != "before\n" {
		t.Fatalf("after resume the volume holds %q", out)
	}
	call(t, "DELETE", "/v1/sandboxes/"+id, nil, nil)

	// gVisor mounts it too (docs/environments.md#volumes).
	needGVisor(t)
	g := create(t, map[string]any{"runtime": "gvisor", "volumes": []map[string]any{{"volume": name, "path": "/data"}}})
	if out := mustSh(t, g, "cat /data/p.txt && echo gvisor >> /data/p.txt && ls -l /data/p.txt | cut -d' ' -f3"); out != "before\nafter\nuser\n" {
		t.Fatalf("under gVisor the volume holds %q", out)
	}
	call(t, "DELETE", "/v1/sandboxes/"+g, nil, nil)
}

// TestVolumesLeftByATestAreUnmounted: a test server's Close unmounts the
// volumes a failing test did not delete, so no loop mount outlives it.
func TestVolumesLeftByATestAreUnmounted(t *testing.T) {
	need(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("volumes need loop devices: " + err.Error())
	}
	ts, err := testserver.StartWith("../../cmd/corral", slog.LevelWarn, func(c *server.Config) { c.NoNetwork = true })
	if err != nil {
		t.Fatal(err)
	}
	c := corral.New(ts.URL, ts.Key)
	v, err := c.CreateVolume(context.Background(), "left-behind", 16)
	if err != nil {
		ts.Close()
		t.Fatal(err)
	}
	mp := filepath.Join(ts.DataDir, "volumes", v.ID, "mnt")
	if mounted, _ := mountinfo.Mounted(mp); !mounted {
		ts.Close()
		t.Fatalf("%s is not mounted", mp)
	}
	if err := ts.Close(); err != nil {
		t.Fatal(err)
	}
	if mounted, _ := mountinfo.Mounted(mp); mounted {
		t.Fatalf("%s is still mounted after Close", mp)
	}
}
