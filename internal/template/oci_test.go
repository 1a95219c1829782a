//go:build linux

package template

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/idrange"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// requireRoot skips a test that needs root (chown).
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: importing an image needs root (chown)")
	}
}

// testMTime is the modification time of every test tar entry.
var testMTime = time.Unix(1700000000, 0)

// entry is one entry of a test layer.
type entry struct {
	hdr  tar.Header
	body string
}

func regE(name, body string, mode int64) entry {
	return entry{hdr: tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode}, body: body}
}

func dirE(name string, mode int64) entry {
	return entry{hdr: tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: mode}}
}

func symE(name, target string) entry {
	return entry{hdr: tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}}
}

func hardE(name, target string) entry {
	return entry{hdr: tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: target, Mode: 0o644}}
}

func whE(name string) entry { return regE(name, "", 0) }

func (e entry) owner(uid, gid int) entry {
	e.hdr.Uid, e.hdr.Gid = uid, gid
	return e
}

// isWhiteout reports whether e is a whiteout file.
func (e entry) isWhiteout() bool {
	return strings.HasPrefix(filepath.Base(e.hdr.Name), ".wh.")
}

// tarOf returns the tar stream of entries, written as given (no checks).
func tarOf(t *testing.T, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := e.hdr
		hdr.Size = int64(len(e.body))
		hdr.ModTime = testMTime
		hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(&hdr); err != nil {
			t.Fatalf("tar header %q: %v", hdr.Name, err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatalf("tar body %q: %v", hdr.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// layerOf returns a layer made of entries.
func layerOf(t *testing.T, entries ...entry) v1.Layer {
	t.Helper()
	b := tarOf(t, entries)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	})
	if err != nil {
		t.Fatalf("layer: %v", err)
	}
	return l
}

// testConfig is the runtime config of the test images.
var testConfig = v1.Config{
	Env:        []string{"PATH=/usr/bin:/bin", "GREETING=hello"},
	WorkingDir: "/home/user",
	User:       "1000:1000",
	Entrypoint: []string{"/bin/tool"},
	Cmd:        []string{"--flag"},
}

// imageOf returns a linux image for the host's architecture made of layers.
func imageOf(t *testing.T, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = runtime.GOARCH
	cf.Config = testConfig
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

var (
	toolBody = "#!/bin/sh\necho tool\n"
	big1     = strings.Repeat("a", 4096)
	big2     = strings.Repeat("b", 10000)
)

// flattenLayers are the two layers of the main test image: the second
// deletes a file, makes a directory opaque and replaces a file.
func flattenLayers() [][]entry {
	return [][]entry{
		{
			dirE("./", 0o755),
			dirE("etc/", 0o755),
			regE("etc/hostname", "box\n", 0o644),
			regE("etc/gone", "bye", 0o644),
			dirE("opq/", 0o755),
			regE("opq/old1", "1", 0o644),
			dirE("opq/sub/", 0o755),
			regE("opq/sub/old2", "2", 0o644),
			dirE("bin/", 0o755),
			regE("bin/tool", toolBody, 0o4755),
			symE("bin/tool-sym", "tool"),
			hardE("bin/tool-hl", "bin/tool"),
			dirE("home/user/", 0o700).owner(1000, 1000),
			regE("home/user/notes", "notes\n", 0o600).owner(1000, 1000),
			{hdr: tar.Header{Name: "dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}},
			{hdr: tar.Header{Name: "run/ctl", Typeflag: tar.TypeFifo, Mode: 0o620}},
			regE("big1", big1, 0o644),
		},
		{
			regE("etc/samelayer", "stay", 0o644),
			whE("etc/.wh.samelayer"),
			whE("etc/.wh.gone"),
			whE("opq/.wh..wh..opq"),
			regE("opq/new", "n", 0o644),
			regE("opq/sub/new2", "n2", 0o644),
			regE("etc/hostname", "box2\n", 0o640).owner(0, 42),
			regE("home/user/big2", big2, 0o644).owner(1000, 1000),
			dirE("var/log/", 0o750),
		},
	}
}

// buildImage returns the image made of layers and its v1 layers.
func buildImage(t *testing.T, layers [][]entry) (v1.Image, []v1.Layer) {
	t.Helper()
	var ls []v1.Layer
	for _, l := range layers {
		ls = append(ls, layerOf(t, l...))
	}
	return imageOf(t, ls...), ls
}

// wantLayerInfos returns the LayerInfo ImportImage should report.
func wantLayerInfos(t *testing.T, layers [][]entry, ls []v1.Layer) []LayerInfo {
	t.Helper()
	var out []LayerInfo
	for i, l := range layers {
		d, err := ls[i].Digest()
		if err != nil {
			t.Fatal(err)
		}
		size, err := ls[i].Size()
		if err != nil {
			t.Fatal(err)
		}
		info := LayerInfo{Digest: d.String(), Size: size}
		for _, e := range l {
			if e.hdr.Typeflag == tar.TypeReg && !e.isWhiteout() {
				info.Files++
				info.Bytes += int64(len(e.body))
			}
		}
		out = append(out, info)
	}
	return out
}

func lstatT(t *testing.T, path string) syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatalf("lstat: %v", err)
	}
	return st
}

func readT(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkFlattened checks the rootfs of an import of the flattenLayers image.
func checkFlattened(t *testing.T, res ImportResult) {
	t.Helper()
	root := filepath.Join(res.Dir, RootFSDir)
	const off = testBase

	files := []struct {
		path     string
		body     string
		mode     uint32 // permission and setuid bits
		uid, gid uint32
	}{
		{"etc/hostname", "box2\n", 0o640, off, off + 42},
		{"etc/samelayer", "stay", 0o644, off, off},
		{"opq/new", "n", 0o644, off, off},
		{"opq/sub/new2", "n2", 0o644, off, off},
		{"bin/tool", toolBody, 0o4755, off, off},
		{"home/user/notes", "notes\n", 0o600, off + 1000, off + 1000},
		{"home/user/big2", big2, 0o644, off + 1000, off + 1000},
		{"big1", big1, 0o644, off, off},
	}
	for _, f := range files {
		p := filepath.Join(root, f.path)
		st := lstatT(t, p)
		if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
			t.Errorf("%s: not a regular file (mode %o)", f.path, st.Mode)
			continue
		}
		if got := readT(t, p); got != f.body {
			t.Errorf("%s: content %q, want %q", f.path, got, f.body)
		}
		if st.Mode&0o7777 != f.mode {
			t.Errorf("%s: mode %o, want %o", f.path, st.Mode&0o7777, f.mode)
		}
		if st.Uid != f.uid || st.Gid != f.gid {
			t.Errorf("%s: owner %d:%d, want %d:%d", f.path, st.Uid, st.Gid, f.uid, f.gid)
		}
		if got := time.Unix(st.Mtim.Unix()); !got.Equal(testMTime) {
			t.Errorf("%s: mtime %s, want %s", f.path, got, testMTime)
		}
	}

	for _, gone := range []string{"etc/gone", "opq/old1", "opq/sub/old2", "dev/null", "etc/.wh.gone", "opq/.wh..wh..opq"} {
		if _, err := os.Lstat(filepath.Join(root, gone)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: exists (err %v), want it gone", gone, err)
		}
	}

	dirs := []struct {
		path     string
		mode     uint32
		uid, gid uint32
	}{
		{"", 0o755, off, off},
		{"etc", 0o755, off, off},
		{"opq/sub", 0o755, off, off},
		{"home/user", 0o700, off + 1000, off + 1000},
		{"var", 0o755, off, off}, // created implicitly
		{"var/log", 0o750, off, off},
	}
	for _, d := range dirs {
		st := lstatT(t, filepath.Join(root, d.path))
		if st.Mode&syscall.S_IFMT != syscall.S_IFDIR || st.Mode&0o7777 != d.mode || st.Uid != d.uid || st.Gid != d.gid {
			t.Errorf("dir %q: mode %o owner %d:%d, want dir %o %d:%d", d.path, st.Mode, st.Uid, st.Gid, d.mode, d.uid, d.gid)
		}
	}
	// Directory times are set after every layer changed the directory.
	if st := lstatT(t, filepath.Join(root, "etc")); !time.Unix(st.Mtim.Unix()).Equal(testMTime) {
		t.Errorf("etc: mtime %s, want %s", time.Unix(st.Mtim.Unix()), testMTime)
	}

	sym := filepath.Join(root, "bin/tool-sym")
	if target, err := os.Readlink(sym); err != nil || target != "tool" {
		t.Errorf("bin/tool-sym: readlink %q, %v; want \"tool\"", target, err)
	}
	if st := lstatT(t, sym); st.Uid != off || st.Gid != off {
		t.Errorf("bin/tool-sym: owner %d:%d, want %d:%d", st.Uid, st.Gid, off, off)
	}
	tool, hl := lstatT(t, filepath.Join(root, "bin/tool")), lstatT(t, filepath.Join(root, "bin/tool-hl"))
	if tool.Ino != hl.Ino || tool.Nlink != 2 {
		t.Errorf("bin/tool-hl: inode %d (nlink %d), want a hardlink of bin/tool (inode %d)", hl.Ino, tool.Nlink, tool.Ino)
	}
	if st := lstatT(t, filepath.Join(root, "run/ctl")); st.Mode&syscall.S_IFMT != syscall.S_IFIFO || st.Mode&0o7777 != 0o620 {
		t.Errorf("run/ctl: mode %o, want a fifo with mode 620", st.Mode)
	}

	// Everything is shifted into the container id range.
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		st := lstatT(t, p)
		if st.Uid < off || st.Gid < off || st.Uid >= off+idrange.Count || st.Gid >= off+idrange.Count {
			t.Errorf("%s: owner %d:%d outside the shifted range", p, st.Uid, st.Gid)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	wantSize := int64(len("box2\n") + len("stay") + len("n") + len("n2") + len(toolBody) + len("notes\n") + len(big2) + len(big1))
	if res.Size != wantSize {
		t.Errorf("Size %d, want %d", res.Size, wantSize)
	}
	wantCfg := ImageConfig{Env: testConfig.Env, WorkingDir: testConfig.WorkingDir, User: testConfig.User, Entrypoint: testConfig.Entrypoint, Cmd: testConfig.Cmd}
	if !reflect.DeepEqual(res.Config, wantCfg) {
		t.Errorf("Config %+v, want %+v", res.Config, wantCfg)
	}
	if !strings.HasPrefix(res.Digest, "sha256:") || filepath.Base(res.Dir) != "import-"+res.Digest[7:23] {
		t.Errorf("Dir %s, Digest %s: want dir import-<first 16 hex of the digest>", res.Dir, res.Digest)
	}
	m, err := ReadManifest(res.Dir)
	if err != nil {
		t.Fatalf("ReadManifest: %v", err)
	}
	if m.Name != ImportName || m.Digest != res.Digest[7:] || m.Size <= 0 {
		t.Errorf("manifest %+v: want name %q, digest %s and a size", m, ImportName, res.Digest[7:])
	}
	if tpl, err := Open(res.Dir); err != nil || tpl.RootFS != root {
		t.Errorf("Open: %+v, %v", tpl, err)
	}
	if _, err := os.Stat(filepath.Join(res.Dir, LayersFile)); err != nil {
		t.Errorf("layers.json: %v", err)
	}
	if st := lstatT(t, res.Dir); st.Mode&0o777 != 0o755 {
		t.Errorf("build dir mode %o, want 755", st.Mode&0o777)
	}
}

// cacheEntries lists the names in cacheDir.
func cacheEntries(t *testing.T, cacheDir string) []string {
	t.Helper()
	ents, err := os.ReadDir(cacheDir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// startRegistry starts an in-process registry on 127.0.0.1 and returns its
// host:port.
func startRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// pushImage pushes img to the in-process registry at host as test/img:v1.
func pushImage(t *testing.T, host string, img v1.Image) string {
	t.Helper()
	ref := host + "/test/img:v1"
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref
}

// writeLayout writes img as the only image of a new OCI layout.
func writeLayout(t *testing.T, img v1.Image) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tarDir packs the files of dir into the tar file dst.
func tarDir(t *testing.T, dir, dst string) {
	t.Helper()
	f, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: rel, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b))}); err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestImportImage imports the same two-layer image from each kind of
// source and checks the flattened rootfs.
func TestImportImage(t *testing.T) {
	requireRoot(t)
	layers := flattenLayers()
	img, ls := buildImage(t, layers)
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	wantLayers := wantLayerInfos(t, layers, ls)

	tests := []struct {
		name string
		src  func(t *testing.T) ImportSource
		// sameDigest: the source keeps the image's manifest as is (a
		// docker save tarball has no manifest; one is synthesized).
		sameDigest bool
	}{
		{
			name: "docker-save tarball",
			src: func(t *testing.T) ImportSource {
				p := filepath.Join(t.TempDir(), "img.tar")
				if err := tarball.WriteToFile(p, name.MustParseReference("test/img:v1"), img); err != nil {
					t.Fatal(err)
				}
				return ImportSource{Tarball: p}
			},
		},
		{
			name:       "OCI layout",
			src:        func(t *testing.T) ImportSource { return ImportSource{Layout: writeLayout(t, img)} },
			sameDigest: true,
		},
		{
			name: "OCI archive tarball",
			src: func(t *testing.T) ImportSource {
				p := filepath.Join(t.TempDir(), "oci.tar")
				tarDir(t, writeLayout(t, img), p)
				return ImportSource{Tarball: p}
			},
			sameDigest: true,
		},
		{
			name: "registry",
			src: func(t *testing.T) ImportSource {
				return ImportSource{Ref: pushImage(t, startRegistry(t), img), Insecure: true}
			},
			sameDigest: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cacheDir := t.TempDir()
			var out bytes.Buffer
			res, err := ImportImage(context.Background(), cacheDir, tt.src(t), testBase, &out)
			if err != nil {
				t.Fatalf("ImportImage: %v\nprogress:\n%s", err, out.String())
			}
			if tt.sameDigest && res.Digest != digest.String() {
				t.Errorf("Digest %s, want %s", res.Digest, digest)
			}
			if !reflect.DeepEqual(res.Layers, wantLayers) {
				t.Errorf("Layers\n%+v\nwant\n%+v", res.Layers, wantLayers)
			}
			checkFlattened(t, res)
			if !strings.Contains(out.String(), "[import] layer 2/2") {
				t.Errorf("progress does not show the layers:\n%s", out.String())
			}
			if got := readT(t, filepath.Join(res.Dir, BuildLogFile)); !strings.Contains(got, "shifting ownership") {
				t.Errorf("build.log does not log the import:\n%s", got)
			}
			// Only the build dir and its lock file are left.
			want := []string{"." + filepath.Base(res.Dir) + ".lock", filepath.Base(res.Dir)}
			if got := cacheEntries(t, cacheDir); !reflect.DeepEqual(got, want) {
				t.Errorf("cache dir holds %q, want %q", got, want)
			}
		})
	}
}

// TestImportPicksHostPlatform imports a multi-platform index and checks
// that the image for the host's architecture is the one imported.
func TestImportPicksHostPlatform(t *testing.T) {
	requireRoot(t)
	other := "arm64"
	if runtime.GOARCH == "arm64" {
		other = "amd64"
	}
	hostImg := imageOf(t, layerOf(t, regE("which", "host", 0o644)))
	otherImg := imageOf(t, layerOf(t, regE("which", "other", 0o644)))
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: otherImg, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: other}}},
		mutate.IndexAddendum{Add: hostImg, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}},
	)
	hostDigest, err := hostImg.Digest()
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		src  func(t *testing.T) ImportSource
	}{
		{
			name: "OCI layout",
			src: func(t *testing.T) ImportSource {
				dir := filepath.Join(t.TempDir(), "layout")
				p, err := layout.Write(dir, empty.Index)
				if err != nil {
					t.Fatal(err)
				}
				if err := p.AppendIndex(idx); err != nil {
					t.Fatal(err)
				}
				return ImportSource{Layout: dir}
			},
		},
		{
			name: "registry",
			src: func(t *testing.T) ImportSource {
				ref := startRegistry(t) + "/test/multi:v1"
				r, err := name.ParseReference(ref, name.Insecure)
				if err != nil {
					t.Fatal(err)
				}
				if err := remote.WriteIndex(r, idx); err != nil {
					t.Fatal(err)
				}
				return ImportSource{Ref: ref, Insecure: true}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := ImportImage(context.Background(), t.TempDir(), tt.src(t), testBase, nil)
			if err != nil {
				t.Fatalf("ImportImage: %v", err)
			}
			if res.Digest != hostDigest.String() {
				t.Errorf("Digest %s, want the host image's %s", res.Digest, hostDigest)
			}
			if got := readT(t, filepath.Join(res.Dir, RootFSDir, "which")); got != "host" {
				t.Errorf("imported the %q image, want the host one", got)
			}
		})
	}
}

// TestImportRefusesHostileLayers checks that layers that try to reach
// outside the rootfs are refused, that nothing is left in the cache and
// that nothing outside it changed. The links point at a "victim" directory
// of the test rather than at /etc, so that a regression cannot damage the
// host.
func TestImportRefusesHostileLayers(t *testing.T) {
	requireRoot(t)
	tests := []struct {
		name    string
		layers  func(victim string) [][]entry
		wantErr string
	}{
		{
			name:    "dot-dot name",
			layers:  func(string) [][]entry { return [][]entry{{regE("../escape", "x", 0o644)}} },
			wantErr: `has a ".." component`,
		},
		{
			name:    "deep dot-dot name",
			layers:  func(string) [][]entry { return [][]entry{{regE("a/../../../../escape", "x", 0o644)}} },
			wantErr: `has a ".." component`,
		},
		{
			name:    "absolute name",
			layers:  func(victim string) [][]entry { return [][]entry{{regE(victim+"/abs", "x", 0o644)}} },
			wantErr: "is absolute",
		},
		{
			name: "write through a symlink in the same layer",
			layers: func(victim string) [][]entry {
				return [][]entry{{symE("evil", victim), regE("evil/passwd", "pwned", 0o644)}}
			},
			wantErr: `"evil" is a symbolic link`,
		},
		{
			name: "write through a symlink of an earlier layer",
			layers: func(victim string) [][]entry {
				return [][]entry{{symE("evil", victim)}, {regE("evil/passwd", "pwned", 0o644)}}
			},
			wantErr: `"evil" is a symbolic link`,
		},
		{
			name: "mkdir through a relative symlink",
			layers: func(string) [][]entry {
				return [][]entry{{dirE("a/", 0o755), symE("a/up", "../../../../..")}, {dirE("a/up/made/", 0o755)}}
			},
			wantErr: `"a/up" is a symbolic link`,
		},
		{
			name:    "hardlink to ../../etc/shadow",
			layers:  func(string) [][]entry { return [][]entry{{hardE("shadow", "../../etc/shadow")}} },
			wantErr: `has a ".." component`,
		},
		{
			name:    "hardlink to an absolute path",
			layers:  func(victim string) [][]entry { return [][]entry{{hardE("stolen", victim+"/secret")}} },
			wantErr: "is absolute",
		},
		{
			name: "hardlink through a symlink",
			layers: func(victim string) [][]entry {
				return [][]entry{{symE("evil", victim)}, {hardE("stolen", "evil/secret")}}
			},
			wantErr: `"evil" is a symbolic link`,
		},
		{
			name: "whiteout through a symlink",
			layers: func(victim string) [][]entry {
				return [][]entry{{symE("evil", victim)}, {whE("evil/.wh.secret")}}
			},
			wantErr: "symbolic link",
		},
		{
			name: "opaque directory through a symlink",
			layers: func(victim string) [][]entry {
				return [][]entry{{symE("evil", victim)}, {whE("evil/.wh..wh..opq")}}
			},
			wantErr: "symbolic link",
		},
		{
			name:    "whiteout of ..",
			layers:  func(string) [][]entry { return [][]entry{{dirE("d/", 0o755)}, {whE("d/.wh...")}} },
			wantErr: "names no entry",
		},
		{
			name:    "owner outside the container range",
			layers:  func(string) [][]entry { return [][]entry{{regE("f", "x", 0o644).owner(70000, 0)}} },
			wantErr: "outside the container id range",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			victim := filepath.Join(base, "victim")
			if err := os.Mkdir(victim, 0o755); err != nil {
				t.Fatal(err)
			}
			secret := filepath.Join(victim, "secret")
			if err := os.WriteFile(secret, []byte("secret"), 0o600); err != nil {
				t.Fatal(err)
			}
			// Deep, so that an escape from the rootfs lands inside base.
			cacheDir := filepath.Join(base, "c1", "c2", "cache")
			before := treeOf(t, base)

			img, _ := buildImage(t, tt.layers(victim))
			src := ImportSource{Layout: writeLayout(t, img)}
			res, err := ImportImage(context.Background(), cacheDir, src, testBase, nil)
			if err == nil {
				t.Fatalf("ImportImage succeeded (%s), want an error containing %q", res.Dir, tt.wantErr)
			}
			if !errors.Is(err, ErrUnsafeLayer) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %q: want ErrUnsafeLayer and %q", err, tt.wantErr)
			}
			// Only the lock file may be new, and nothing else changed.
			after := treeOf(t, base)
			for p := range after {
				if strings.HasPrefix(p, "c1/c2/cache/") && strings.HasSuffix(p, ".lock") {
					delete(after, p)
				}
			}
			delete(after, "c1")
			delete(after, "c1/c2")
			delete(after, "c1/c2/cache")
			if !reflect.DeepEqual(after, before) {
				t.Errorf("files changed:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

// treeOf describes every file under base: its type, mode, owner, link
// count and content.
func treeOf(t *testing.T, base string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(base, p)
		if err != nil || rel == "." {
			return err
		}
		st := lstatT(t, p)
		desc := fmt.Sprintf("%o %d %d:%d %d", st.Mode, st.Nlink, st.Uid, st.Gid, st.Mtim.Nano())
		if d.Type().IsRegular() {
			desc += " " + readT(t, p)
		}
		out[filepath.ToSlash(rel)] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestImportKeepsSymlinksInsteadOfFollowing checks that entries replacing a
// symbolic link planted by an earlier layer replace the link and do not
// write through it.
func TestImportKeepsSymlinksInsteadOfFollowing(t *testing.T) {
	requireRoot(t)
	base := t.TempDir()
	victim := filepath.Join(base, "victim")
	if err := os.Mkdir(victim, 0o755); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(victim, "secret")
	if err := os.WriteFile(secret, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	before := treeOf(t, victim)
	img, _ := buildImage(t, [][]entry{
		{symE("file", secret), symE("dir", victim), symE("fifo", secret), symE("link", secret), regE("target", "t", 0o644)},
		{regE("file", "mine", 0o666), dirE("dir/", 0o777), {hdr: tar.Header{Name: "fifo", Typeflag: tar.TypeFifo, Mode: 0o666}}, hardE("link", "target")},
	})
	res, err := ImportImage(context.Background(), filepath.Join(base, "cache"), ImportSource{Layout: writeLayout(t, img)}, testBase, nil)
	if err != nil {
		t.Fatalf("ImportImage: %v", err)
	}
	root := filepath.Join(res.Dir, RootFSDir)
	tests := []struct {
		path string
		kind uint32
	}{
		{"file", syscall.S_IFREG},
		{"dir", syscall.S_IFDIR},
		{"fifo", syscall.S_IFIFO},
		{"link", syscall.S_IFREG},
	}
	for _, tt := range tests {
		if st := lstatT(t, filepath.Join(root, tt.path)); st.Mode&syscall.S_IFMT != tt.kind {
			t.Errorf("%s: mode %o, want type %o", tt.path, st.Mode, tt.kind)
		}
	}
	if got := readT(t, filepath.Join(root, "link")); got != "t" {
		t.Errorf("link: content %q, want %q", got, "t")
	}
	if after := treeOf(t, victim); !reflect.DeepEqual(after, before) {
		t.Errorf("victim changed:\nbefore %v\nafter  %v", before, after)
	}
}

// TestImportReuses imports the same image twice (from two kinds of source
// with the same manifest) and checks the second import reuses the first
// build dir.
func TestImportReuses(t *testing.T) {
	requireRoot(t)
	img, _ := buildImage(t, flattenLayers())
	cacheDir := t.TempDir()
	first, err := ImportImage(context.Background(), cacheDir, ImportSource{Layout: writeLayout(t, img)}, testBase, nil)
	if err != nil {
		t.Fatalf("first import: %v", err)
	}
	sentinel := filepath.Join(first.Dir, "sentinel")
	if err := os.WriteFile(sentinel, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		src  ImportSource
	}{
		{"same layout again", ImportSource{Layout: writeLayout(t, img)}},
		{"registry", ImportSource{Ref: pushImage(t, startRegistry(t), img), Insecure: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			res, err := ImportImage(context.Background(), cacheDir, tt.src, testBase, &out)
			if err != nil {
				t.Fatalf("ImportImage: %v", err)
			}
			if !reflect.DeepEqual(res, first) {
				t.Errorf("second import\n%+v\nwant the first\n%+v", res, first)
			}
			if _, err := os.Stat(sentinel); err != nil {
				t.Errorf("build dir was replaced: %v", err)
			}
			if !strings.Contains(out.String(), "reusing") {
				t.Errorf("progress does not say the import is reused:\n%s", out.String())
			}
		})
	}
	// An import shifted to another uid range is not reused: its files
	// would be owned by ids outside the sandbox's map.
	if _, err := ImportImage(context.Background(), cacheDir, ImportSource{Layout: writeLayout(t, img)}, 300000, nil); err == nil || !strings.Contains(err.Error(), "uid range base") {
		t.Errorf("import for base 300000 over one for %d: %v, want a refusal naming the uid range base", testBase, err)
	}
}

// TestInspect checks the largest paths and layer infos of an imported build
// dir, and that a build dir without layers.json has no layers.
func TestInspect(t *testing.T) {
	requireRoot(t)
	layers := flattenLayers()
	img, ls := buildImage(t, layers)
	res, err := ImportImage(context.Background(), t.TempDir(), ImportSource{Layout: writeLayout(t, img)}, testBase, nil)
	if err != nil {
		t.Fatalf("ImportImage: %v", err)
	}
	wantLayers := wantLayerInfos(t, layers, ls)

	plain := t.TempDir()
	if err := os.MkdirAll(filepath.Join(plain, RootFSDir, "usr"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, size := range map[string]int{"usr/a": 10, "usr/b": 30, "c": 20} {
		if err := os.WriteFile(filepath.Join(plain, RootFSDir, name), bytes.Repeat([]byte{'x'}, size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeManifest(plain, Manifest{Name: "base", Version: "v", Digest: "d", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name        string
		dir         string
		n           int
		wantLargest []PathSize
		wantSize    int64
		wantFiles   int
		wantLayers  []LayerInfo
	}{
		{
			name:        "import, top 3",
			dir:         res.Dir,
			n:           3,
			wantLargest: []PathSize{{"home/user/big2", 10000}, {"big1", 4096}, {"bin/tool", int64(len(toolBody))}},
			wantSize:    res.Size,
			wantFiles:   8, // bin/tool-hl is bin/tool
			wantLayers:  wantLayers,
		},
		{
			name:       "import, none",
			dir:        res.Dir,
			n:          0,
			wantSize:   res.Size,
			wantFiles:  8,
			wantLayers: wantLayers,
		},
		{
			name:        "plain build dir, more than it has",
			dir:         plain,
			n:           10,
			wantLargest: []PathSize{{"usr/b", 30}, {"c", 20}, {"usr/a", 10}},
			wantSize:    60,
			wantFiles:   3,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ins, err := Inspect(tt.dir, tt.n)
			if err != nil {
				t.Fatalf("Inspect: %v", err)
			}
			if !reflect.DeepEqual(ins.Largest, tt.wantLargest) {
				t.Errorf("Largest %v, want %v", ins.Largest, tt.wantLargest)
			}
			if ins.Size != tt.wantSize || ins.Files != tt.wantFiles {
				t.Errorf("Size %d, Files %d; want %d, %d", ins.Size, ins.Files, tt.wantSize, tt.wantFiles)
			}
			if !reflect.DeepEqual(ins.Layers, tt.wantLayers) {
				t.Errorf("Layers %+v, want %+v", ins.Layers, tt.wantLayers)
			}
		})
	}
	if _, err := Inspect(t.TempDir(), 1); err == nil {
		t.Error("Inspect of a dir without a manifest succeeded")
	}
}

// TestImportSourceErrors checks bad sources fail clearly and leave nothing
// in the cache.
func TestImportSourceErrors(t *testing.T) {
	dir := t.TempDir()
	gz := filepath.Join(dir, "img.tar.gz")
	if err := os.WriteFile(gz, []byte{0x1f, 0x8b, 8, 0, 0, 0}, 0o644); err != nil {
		t.Fatal(err)
	}
	notImage := filepath.Join(dir, "other.tar")
	if err := os.WriteFile(notImage, tarOf(t, []entry{regE("hello", "x", 0o644)}), 0o644); err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	img, _ := buildImage(t, flattenLayers())
	layoutDir := writeLayout(t, img)

	tests := []struct {
		name    string
		ctx     context.Context
		src     ImportSource
		wantErr string
	}{
		{"no source", context.Background(), ImportSource{}, "set exactly one"},
		{"two sources", context.Background(), ImportSource{Tarball: notImage, Layout: dir}, "set exactly one"},
		{"gzip tarball", context.Background(), ImportSource{Tarball: gz}, "gzip-compressed"},
		{"not an image", context.Background(), ImportSource{Tarball: notImage}, "neither a docker save tarball"},
		{"missing layout", context.Background(), ImportSource{Layout: filepath.Join(dir, "nope")}, "open OCI layout"},
		{"bad reference", context.Background(), ImportSource{Ref: "UPPER/Case::x"}, "image reference"},
		{"cancelled", cancelled, ImportSource{Layout: layoutDir}, "context canceled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cacheDir := t.TempDir()
			_, err := ImportImage(tt.ctx, cacheDir, tt.src, testBase, nil)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
			for _, n := range cacheEntries(t, cacheDir) {
				if !strings.HasSuffix(n, ".lock") {
					t.Errorf("cache dir holds %s after a failed import", n)
				}
			}
		})
	}
}

// TestCleanEntryName checks tar entry name validation.
func TestCleanEntryName(t *testing.T) {
	tests := []struct {
		in, want string
		unsafe   bool
	}{
		{"etc/passwd", "etc/passwd", false},
		{"./etc/passwd", "etc/passwd", false},
		{"etc//x/./y/", "etc/x/y", false},
		{"./", "", false},
		{"a..b/..c", "a..b/..c", false},
		{"/etc/passwd", "", true},
		{"../x", "", true},
		{"a/../b", "", true},
		{"a/..", "", true},
		{"a\x00b", "", true},
	}
	for _, tt := range tests {
		got, err := cleanEntryName(tt.in)
		if tt.unsafe {
			if !errors.Is(err, ErrUnsafeLayer) {
				t.Errorf("cleanEntryName(%q) = %q, %v; want ErrUnsafeLayer", tt.in, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("cleanEntryName(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

// TestImportFileCapabilities checks that a file capability of an image
// survives the import as a namespaced (v3) capability of the sandbox's root.
func TestImportFileCapabilities(t *testing.T) {
	requireRoot(t)
	v2 := make([]byte, vfsCapV2Size)
	binary.LittleEndian.PutUint32(v2, vfsCapRevision2|1) // effective
	binary.LittleEndian.PutUint32(v2[4:], 1<<13)         // CAP_NET_RAW permitted
	ping := regE("bin/ping", "elf", 0o755)
	ping.hdr.PAXRecords = map[string]string{"SCHILY.xattr." + capXattrName: string(v2)}
	img, _ := buildImage(t, [][]entry{{ping}})
	res, err := ImportImage(context.Background(), t.TempDir(), ImportSource{Layout: writeLayout(t, img)}, testBase, nil)
	if err != nil {
		t.Fatalf("ImportImage: %v", err)
	}
	got, err := getCapXattr(filepath.Join(res.Dir, RootFSDir, "bin/ping"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := namespacedCaps(v2, testBase)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("security.capability %x, want %x (v3, root %d)", got, want, testBase)
	}
}
