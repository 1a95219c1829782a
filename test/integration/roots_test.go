package integration

// Template content that names host files (issue 10, item 7): the control
// plane runs as host root and reads paths inside template and sandbox
// root file systems; every such path must resolve inside that root.

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	corral "github.com/corralhq/corral/sdk/go"
)

// imageEntry is one entry of a crafted image layer: a file (data), a
// directory (dir) or a symbolic link (link).
type imageEntry struct {
	name string
	data string
	link string
	dir  bool
	fifo bool
}

// rootPasswd is the /etc/passwd of the crafted images: root only, so that
// the agent (which needs the file) starts and commands run as root.
const rootPasswd = "root:x:0:0:root:/root:/bin/sh\n"

// craftedImage imports a one-layer image holding /etc/passwd (root only),
// /tmp (a directory) and extra as template version "<prefix><hex>:v1" and
// returns the import's answer; an entry of extra named like one of those
// replaces it. The image is built here, as a docker-save tarball.
func craftedImage(t *testing.T, prefix string, extra ...imageEntry) *corral.ImportedTemplate {
	t.Helper()
	var entries []imageEntry
	for _, e := range []imageEntry{{name: "etc/", dir: true}, {name: "etc/passwd", data: rootPasswd}, {name: "tmp/", dir: true}} {
		replaced := false
		for _, x := range extra {
			replaced = replaced || strings.TrimSuffix(x.name, "/") == strings.TrimSuffix(e.name, "/")
		}
		if !replaced {
			entries = append(entries, e)
		}
	}
	entries = append(entries, extra...)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(e.data)), ModTime: time.Unix(1700000000, 0)}
		switch {
		case e.dir:
			hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeDir, 0o755, 0
			if e.name == "tmp/" {
				hdr.Mode = 0o1777
			}
		case e.link != "":
			hdr.Typeflag, hdr.Linkname, hdr.Mode, hdr.Size = tar.TypeSymlink, e.link, 0o777, 0
		case e.fifo:
			hdr.Typeflag, hdr.Size = tar.TypeFifo, 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			io.WriteString(tw, e.data)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layerBytes := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerBytes)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	var tb bytes.Buffer
	tag, _ := name.NewTag("corral/crafted:v1")
	if err := tarball.Write(tag, img, &tb); err != nil {
		t.Fatal(err)
	}
	ref := prefix + randHex(3) + ":v1"
	res, err := corral.New(env.url, env.key).ImportTemplate(context.Background(), ref, &tb)
	if err != nil {
		t.Fatalf("import %s: %v", ref, err)
	}
	t.Cleanup(func() { corral.New(env.url, env.key).DeleteTemplate(context.Background(), ref) })
	return res
}

// upAndOut is a relative link target that climbs out of any template dir
// with ".." and then names host path p.
func upAndOut(p string) string {
	return strings.Repeat("../", 24) + strings.TrimPrefix(p, "/")
}

// hostFiles reads host files that must never change or reach a sandbox.
func hostFiles(t *testing.T, paths ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out[p] = string(b)
	}
	return out
}

// TestTemplateCABundleLinksToHostFiles defends against an image whose CA
// bundle (/etc/ssl/certs/ca-certificates.crt) is a symbolic link to a
// host file: the egress CA's private key (DATA/ca/ca-key.pem, absolute
// link) or the admin API key (DATA/admin.key, a relative link climbing
// out of the template dir with ".."). A sandbox with a secret gets the
// template's bundle with corral's egress CA appended; read on the host
// through the link, that bundle carried the host file into the sandbox.
// Now the bundle is resolved inside the template's root: the sandbox
// starts, its bundle (read inside the sandbox) holds the egress CA and
// neither key, no bundle corral wrote on the host holds them, and the
// host files are unchanged. A bundle that is a FIFO, which blocked the
// create for ever, is refused with 400 invalid_argument.
func TestTemplateCABundleLinksToHostFiles(t *testing.T) {
	need(t)
	if env.srv.Gateway == nil {
		t.Skip("the test server has no network gateway (secrets need it)")
	}
	ctx := context.Background()
	c := corral.New(env.url, env.key)
	keyPath := filepath.Join(env.dataDir, "ca", "ca-key.pem")
	adminPath := filepath.Join(env.dataDir, "admin.key")
	before := hostFiles(t, keyPath, adminPath)
	caCert := hostFiles(t, filepath.Join(env.dataDir, "ca", "ca.pem"))[filepath.Join(env.dataDir, "ca", "ca.pem")]
	secret := "rootlink" + randHex(2)
	if _, err := c.PutSecret(ctx, secret, []string{"secret.test"}, "Authorization", "Bearer "+randHex(16)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.DeleteSecret(context.Background(), secret) })
	const bundle = "/etc/ssl/certs/ca-certificates.crt"
	cases := []struct{ name, link string }{
		{"absolute link to the CA key", keyPath},
		{"relative link to the admin key", upAndOut(adminPath)},
		{"absolute link to the admin key", adminPath},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := craftedImage(t, "cabundle", imageEntry{name: "etc/ssl/", dir: true}, imageEntry{name: "etc/ssl/certs/", dir: true},
				imageEntry{name: strings.TrimPrefix(bundle, "/"), link: tc.link})
			sb, err := c.Create(ctx, corral.CreateOptions{Template: res.Template.Name + ":" + res.Template.Version, Timeout: time.Minute,
				Network: "allow", Allow: []string{"secret.test"}, Secrets: []string{secret}})
			if err != nil {
				t.Fatalf("create with a secret: %v", err)
			}
			t.Cleanup(func() { c.Kill(context.Background(), sb.ID) })
			got, err := sb.Files().Read(ctx, bundle)
			if err != nil {
				t.Fatalf("read the bundle inside: %v", err)
			}
			for p, content := range before {
				if strings.Contains(string(got), strings.TrimSpace(content)) {
					t.Fatalf("the sandbox's CA bundle holds host file %s", p)
				}
			}
			if !strings.Contains(string(got), strings.TrimSpace(caCert)) {
				t.Fatalf("the sandbox's CA bundle lacks the egress CA (%d bytes)", len(got))
			}
			written, _ := filepath.Glob(filepath.Join(env.dataDir, "net", "ca-bundle-*.crt"))
			for _, f := range written {
				b, _ := os.ReadFile(f)
				for p, content := range before {
					if strings.Contains(string(b), strings.TrimSpace(content)) {
						t.Fatalf("bundle %s that corral wrote holds host file %s", f, p)
					}
				}
			}
		})
	}
	// A bundle that is a FIFO blocked the read (and the create) for ever;
	// now it is refused at once, with a stable code.
	t.Run("fifo", func(t *testing.T) {
		res := craftedImage(t, "cabundle", imageEntry{name: "etc/ssl/", dir: true}, imageEntry{name: "etc/ssl/certs/", dir: true},
			imageEntry{name: strings.TrimPrefix(bundle, "/"), fifo: true})
		body, _ := json.Marshal(map[string]any{"template": res.Template.Name + ":" + res.Template.Version,
			"network": "allow", "allow": []string{"secret.test"}, "secrets": []string{secret}})
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // a generous bound on a hang, not a timing assertion
		defer cancel()
		req, _ := http.NewRequestWithContext(rctx, "POST", env.url+"/v1/sandboxes", bytes.NewReader(body))
		req.Header.Set("X-API-Key", env.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("create with a FIFO as the CA bundle: %v", err)
		}
		defer resp.Body.Close()
		var e apiErr
		json.NewDecoder(resp.Body).Decode(&e)
		if resp.StatusCode != http.StatusBadRequest || e.Code != "invalid_argument" || !strings.Contains(e.Message, bundle) {
			t.Fatalf("create: status %d %+v; want 400 invalid_argument naming %s", resp.StatusCode, e, bundle)
		}
	})
	for p, content := range hostFiles(t, keyPath, adminPath) {
		if content != before[p] {
			t.Fatalf("host file %s changed", p)
		}
	}
}

// TestTemplatePasswdAndSudoLinksToHostFiles defends against an image
// whose /etc/passwd or /usr/bin/sudo is a symbolic link to a host file:
// corral looks them up (passwd at import, for the user "user"; sudo at
// create, to decide no_new_privs) and, through the link, let a host file
// decide: a host passwd with "user" made the template run as a user the
// image does not have; a host file at the sudo path turned no_new_privs
// off for a template without sudo. Now both are resolved inside the
// image's root, where the link's absolute target names the image's own
// file: the image's passwd (root only) makes the template run as root,
// and a sudo path that resolves to nothing inside keeps no_new_privs on.
func TestTemplatePasswdAndSudoLinksToHostFiles(t *testing.T) {
	need(t)
	ctx := context.Background()
	c := corral.New(env.url, env.key)
	hostDir := t.TempDir()
	hostPasswd := filepath.Join(hostDir, "passwd")
	if err := os.WriteFile(hostPasswd, []byte(rootPasswd+"user:x:1000:1000::/home/user:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	inImage := strings.TrimPrefix(hostPasswd, "/")
	var parents []imageEntry
	for d := filepath.Dir(inImage); d != "."; d = filepath.Dir(d) {
		parents = append([]imageEntry{{name: d + "/", dir: true}}, parents...)
	}

	t.Run("passwd", func(t *testing.T) {
		// The link's absolute target exists both on the host (with "user")
		// and in the image (root only): inside the root it is the image's.
		res := craftedImage(t, "passwdlink", append(parents,
			imageEntry{name: inImage, data: rootPasswd},
			imageEntry{name: "etc/passwd", link: hostPasswd})...)
		var cfg struct{ User string }
		if err := json.Unmarshal(res.Template.Config, &cfg); err != nil || cfg.User != "root" {
			t.Fatalf("template config %s (%v): want user root, as the image's own passwd has no user \"user\"", res.Template.Config, err)
		}
		sb, err := c.Create(ctx, corral.CreateOptions{Template: res.Template.Name + ":" + res.Template.Version, Timeout: time.Minute})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		t.Cleanup(func() { c.Kill(context.Background(), sb.ID) })
		if got, err := sb.Files().Read(ctx, "/etc/passwd"); err != nil || string(got) != rootPasswd {
			t.Fatalf("/etc/passwd inside: %q %v", got, err)
		}
	})

	t.Run("sudo", func(t *testing.T) {
		for _, link := range []string{env.bin, upAndOut(env.bin)} {
			res := craftedImage(t, "sudolink", imageEntry{name: "usr/", dir: true}, imageEntry{name: "usr/bin/", dir: true},
				imageEntry{name: "usr/bin/sudo", link: link})
			sb, err := c.Create(ctx, corral.CreateOptions{Template: res.Template.Name + ":" + res.Template.Version, Timeout: time.Minute})
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			t.Cleanup(func() { c.Kill(context.Background(), sb.ID) })
			var spec struct {
				Process struct {
					NoNewPrivileges bool `json:"noNewPrivileges"`
				} `json:"process"`
			}
			b, err := os.ReadFile(filepath.Join(env.dataDir, "sandboxes", sb.ID, "config.json"))
			if err != nil || json.Unmarshal(b, &spec) != nil {
				t.Fatalf("read the sandbox's OCI spec: %v", err)
			}
			if !spec.Process.NoNewPrivileges {
				t.Fatalf("/usr/bin/sudo -> %s (a host file): no_new_privs is off", link)
			}
		}
	})
}

// tmpLinkTarget makes a host directory with a marker file that a sandbox
// whose /tmp links to it must never see or change, and returns it with a
// check that it is unchanged.
func tmpLinkTarget(t *testing.T) (string, func()) {
	t.Helper()
	// Not under /tmp: a /tmp linking to /tmp/x would be a link loop
	// inside the sandbox, which runsc refuses on its own.
	dir, err := os.MkdirTemp("/var/tmp", "corral-tmplink-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "marker"), []byte("host"), 0o666); err != nil {
		t.Fatal(err)
	}
	return dir, func() {
		t.Helper()
		ents, err := os.ReadDir(dir)
		if err != nil || len(ents) != 1 || ents[0].Name() != "marker" {
			t.Fatalf("host dir %s now holds %v (%v); want only marker", dir, ents, err)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "marker")); string(b) != "host" {
			t.Fatalf("host marker changed: %q", b)
		}
	}
}

// createExpect creates a sandbox; it returns the id if it started, or
// the error's code and message if it was refused.
func createExpect(t *testing.T, body map[string]any) (id string, status int, e apiErr) {
	t.Helper()
	data, _ := json.Marshal(body)
	var raw json.RawMessage
	status = call(t, "POST", "/v1/sandboxes", data, &raw)
	if status == http.StatusCreated {
		var sb sandboxJSON
		json.Unmarshal(raw, &sb)
		t.Cleanup(func() { call(t, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil) })
		return sb.ID, status, e
	}
	json.Unmarshal(raw, &e)
	return "", status, e
}

// checkTmpRefused asserts a gVisor create was refused as the unsafe /tmp
// it is, with a stable code and a message naming no host path.
func checkTmpRefused(t *testing.T, id string, status int, e apiErr, hostDir string) {
	t.Helper()
	if id != "" {
		got, err := corral.New(env.url, env.key).Sandbox(id).Files().WithUser("root").Read(context.Background(), "/tmp/marker")
		t.Fatalf("a gVisor sandbox whose /tmp links to host dir %s started; /tmp/marker inside: %q %v", hostDir, got, err)
	}
	if status != http.StatusBadRequest || e.Code != "invalid_argument" || !strings.Contains(e.Message, "/tmp") {
		t.Fatalf("create: status %d %+v; want 400 invalid_argument naming /tmp", status, e)
	}
	if strings.Contains(e.Message, env.dataDir) || strings.Contains(e.Message, hostDir) {
		t.Fatalf("the refusal names a host path: %q", e.Message)
	}
}

// TestGVisorTmpLinkToHostDir defends against an image whose /tmp is a
// symbolic link to a host directory: under gVisor, /tmp is bound from the
// sandbox's root file system (so that it counts against the disk cap),
// and runsc resolves that bind source on the host, as root: it mounted
// the host directory read-write into the sandbox. Now a gVisor sandbox
// whose /tmp is not a real directory is refused (400 invalid_argument,
// naming /tmp and no host path); under runc (no /tmp bind) the link is
// resolved inside the sandbox and the sandbox starts. The host directory
// is unchanged either way.
func TestGVisorTmpLinkToHostDir(t *testing.T) {
	need(t)
	hostDir, unchanged := tmpLinkTarget(t)
	// The link's target exists inside the image too, so that runsc finds
	// the mount point: without the fix, the bind then succeeds.
	var dirs []imageEntry
	for d := strings.TrimPrefix(hostDir, "/"); d != "."; d = filepath.Dir(d) {
		dirs = append([]imageEntry{{name: d + "/", dir: true}}, dirs...)
	}
	res := craftedImage(t, "tmplink", append(dirs, imageEntry{name: "tmp", link: hostDir})...)
	ref := res.Template.Name + ":" + res.Template.Version
	t.Run("runc", func(t *testing.T) {
		id, status, e := createExpect(t, map[string]any{"template": ref, "runtime": "runc"})
		if id == "" {
			t.Fatalf("runc create: status %d %+v; want a sandbox (no /tmp bind under runc)", status, e)
		}
		sb := corral.New(env.url, env.key).Sandbox(id)
		if got, err := sb.Files().Read(context.Background(), "/tmp/marker"); err == nil {
			t.Fatalf("the runc sandbox reads the host marker through /tmp: %q", got)
		}
		_ = sb.Files().Write(context.Background(), "/tmp/probe", []byte("x"))
		unchanged()
	})
	t.Run("gvisor", func(t *testing.T) {
		needGVisor(t)
		id, status, e := createExpect(t, map[string]any{"template": ref, "runtime": "gvisor"})
		checkTmpRefused(t, id, status, e, hostDir)
		unchanged()
	})
}

// TestGVisorTmpLinkFromSnapshot defends against the same bind through a
// snapshot instead of an image: root in a runc sandbox replaces /tmp by a
// link to a host directory and snapshots the sandbox; a gVisor sandbox
// started from that snapshot had runsc bind the host directory at /tmp.
// Now it is refused (400 invalid_argument) and the host directory is
// unchanged.
func TestGVisorTmpLinkFromSnapshot(t *testing.T) {
	needGVisor(t)
	hostDir, unchanged := tmpLinkTarget(t)
	src := create(t, map[string]any{"runtime": "runc"})
	// The link's target exists inside too, so that runsc finds the mount
	// point: without the fix, the bind then succeeds.
	mustSh(t, src, "mkdir -p "+hostDir+" && rm -rf /tmp && ln -s "+hostDir+" /tmp && test -L /tmp", map[string]any{"user": "root"})
	var sn snapshotJSON
	if code := call(t, "POST", "/v1/sandboxes/"+src+"/snapshots", nil, &sn); code != http.StatusCreated {
		t.Fatalf("snapshot: status %d", code)
	}
	t.Cleanup(func() { call(t, "DELETE", "/v1/snapshots/"+sn.ID, nil, nil) })
	id, status, e := createExpect(t, map[string]any{"snapshot": sn.ID, "runtime": "gvisor"})
	checkTmpRefused(t, id, status, e, hostDir)
	if !strings.Contains(e.Message, "snapshot "+sn.ID) {
		t.Fatalf("the refusal does not name the snapshot: %q", e.Message)
	}
	t.Logf("refused: %s", e.Message)
	unchanged()
}
