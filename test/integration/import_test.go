package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"log"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	corral "github.com/corralhq/corral/sdk/go"
)

// testImage is a one-layer image with /etc/passwd (root only), a text file
// and a static binary (the corral binary, so that a command can run
// without a shell), with env and working dir in its config.
func testImage(t *testing.T) v1.Image {
	t.Helper()
	bin, err := os.ReadFile(env.bin)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, mode int64, data []byte, typ byte) {
		hdr := &tar.Header{Name: name, Mode: mode, Size: int64(len(data)), Typeflag: typ, ModTime: time.Unix(1700000000, 0)}
		if typ == tar.TypeDir {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			tw.Write(data)
		}
	}
	add("etc/", 0o755, nil, tar.TypeDir)
	add("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/corral\n"), tar.TypeReg)
	add("bin/", 0o755, nil, tar.TypeDir)
	add("bin/corral", 0o755, bin, tar.TypeReg)
	add("srv/", 0o755, nil, tar.TypeDir)
	add("srv/hello.txt", 0o644, []byte("hello from an imported image\n"), tar.TypeReg)
	add("tmp/", 0o1777, nil, tar.TypeDir)
	tw.Close()
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
	cf.Config.Env = []string{"PATH=/bin", "IMAGE_MARK=imported"}
	cf.Config.WorkingDir = "/srv"
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// TestTemplateImport: an image pulled from a registry (in-process, on
// 127.0.0.1) and the same image from a docker-save tarball (CLI) become
// template versions; a sandbox from it runs the image's binary and sees
// its files and env; inspect lists the largest file.
func TestTemplateImport(t *testing.T) {
	need(t)
	ctx := context.Background()
	c := corral.New(env.url, env.key)
	img := testImage(t)

	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	u, _ := url.Parse(reg.URL)
	ref, err := name.ParseReference(u.Host+"/corral/test:v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	tname := "imported" + randHex(3)
	res, err := c.PullTemplate(ctx, tname+":v1", ref.String(), true)
	if err != nil {
		t.Fatal(err)
	}
	if res.Template.Source != "import" || !strings.HasPrefix(res.Template.Digest, "sha256:") {
		t.Fatalf("imported %+v", res.Template)
	}
	sb, err := c.Create(ctx, corral.CreateOptions{Template: tname + ":v1", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), sb.ID) })
	data, err := sb.Files().Read(ctx, "/srv/hello.txt")
	if err != nil || string(data) != "hello from an imported image\n" {
		t.Fatalf("file from the image: %q %v", data, err)
	}
	var out struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
		Message  string `json:"message"`
	}
	if code := call(t, "POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"cmd": []string{"/bin/corral", "--help"}}, &out); code != 200 || out.ExitCode != 0 || !strings.Contains(out.Stdout, "corral") {
		t.Fatalf("running the image's binary: %d %+v", code, out)
	}
	// The image's env and working dir became the template's defaults.
	tv, err := c.Templates(ctx, tname)
	if err != nil || len(tv) != 1 || !strings.Contains(string(tv[0].Config), `"IMAGE_MARK":"imported"`) || !strings.Contains(string(tv[0].Config), `"workdir":"/srv"`) {
		t.Fatalf("template config: %+v %v", tv, err)
	}

	// The same image as a docker-save tarball, through the CLI.
	tarPath := filepath.Join(t.TempDir(), "img.tar")
	tag, _ := name.NewTag("corral/test:v1")
	if err := tarball.WriteToFile(tarPath, tag, img); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := corralCLI(t, "", "template", "import", "--server", env.url, "--api-key", env.key, tname+":v2", tarPath)
	if code != 0 || strings.TrimSpace(stdout) != tname+":v2" {
		t.Fatalf("template import: exit %d %q %q", code, stdout, stderr)
	}
	layers, err := c.InspectTemplate(ctx, tname+":v2", 3)
	if err != nil || len(layers) == 0 || len(layers[0].Largest) == 0 || layers[0].Largest[0].Path != "bin/corral" && layers[0].Largest[0].Path != "/bin/corral" {
		t.Fatalf("inspect: %+v %v", layers, err)
	}
	// A template version in use cannot be deleted; an unused one can.
	if err := c.DeleteTemplate(ctx, tname+":v1"); err == nil {
		t.Fatal("deleted a version a running sandbox uses")
	}
	if _, err := c.UseTemplate(ctx, tname+":v1"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTemplate(ctx, tname+":v2"); err != nil {
		t.Fatalf("delete unused v2: %v", err)
	}
	// Both versions named one extracted image: it stays while v1 names
	// it and goes with the last version.
	importDir := filepath.Join(env.dataDir, "template-versions", "imports", "import-"+strings.TrimPrefix(res.Template.Digest, "sha256:")[:16])
	if _, err := os.Stat(filepath.Join(importDir, "rootfs", "srv", "hello.txt")); err != nil {
		t.Fatalf("the image v1 still names is gone: %v", err)
	}
	if _, err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	// What an import killed mid-way leaves (a partial tree) goes too.
	partial := filepath.Join(filepath.Dir(importDir), ".tmp-import-00000000deadbeef-1")
	if err := os.MkdirAll(filepath.Join(partial, "rootfs", "etc"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTemplate(ctx, tname+":v1"); err != nil {
		t.Fatalf("delete v1 after its sandbox ended: %v", err)
	}
	for _, dir := range []string{importDir, partial} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("%s is still on disk: %v", dir, err)
		}
	}
}
