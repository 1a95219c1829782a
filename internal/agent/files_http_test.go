package agent

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	fspb "github.com/corralhq/corral/proto/filesystem"
)

func (e *testEnv) do(t *testing.T, method, path string, hdr http.Header, body io.Reader) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, e.url+path, body)
	must(t, err)
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	resp, err := e.http.Do(req)
	must(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(t, err)
	return resp, b
}

// multipartBody builds a multipart body whose parts carry the filenames
// verbatim (as the e2b SDK sends them: full paths).
func multipartBody(t *testing.T, files [][2]string) (string, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, f := range files {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="file"; filename="`+f[0]+`"`)
		h.Set("Content-Type", "application/octet-stream")
		pw, err := mw.CreatePart(h)
		must(t, err)
		_, _ = pw.Write([]byte(f[1]))
	}
	must(t, mw.Close())
	return mw.FormDataContentType(), &buf
}

func TestHealth(t *testing.T) {
	e := newTestEnv(t, nil)
	resp, _ := e.do(t, "GET", "/health", nil, nil)
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

func TestUploadMultipart(t *testing.T) {
	e := newTestEnv(t, nil)
	abs := e.home + "/abs/dir/b.bin"
	ct, body := multipartBody(t, [][2]string{{"rel/dir/a.txt", "alpha"}, {abs, "beta"}})
	resp, b := e.do(t, "POST", "/files", http.Header{"Content-Type": {ct}, "X-Metadata-Owner-Tag": {"agent 7"}}, body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	want := `[{"path":"` + e.home + `/rel/dir/a.txt","name":"a.txt","type":"file","metadata":{"owner-tag":"agent 7"}},` +
		`{"path":"` + abs + `","name":"b.bin","type":"file","metadata":{"owner-tag":"agent 7"}}]` + "\n"
	if string(b) != want {
		t.Fatalf("body %s\nwant %s", b, want)
	}
	for p, content := range map[string]string{e.home + "/rel/dir/a.txt": "alpha", abs: "beta"} {
		got, err := os.ReadFile(p)
		must(t, err)
		fi, err := os.Stat(p)
		must(t, err)
		if string(got) != content || fi.Mode().Perm() != 0o644 {
			t.Fatalf("%s: %q %v", p, got, fi.Mode())
		}
	}
	st, err := e.fs.Stat(context.Background(), connect.NewRequest(&fspb.StatRequest{Path: "rel/dir/a.txt"}))
	must(t, err)
	if st.Msg.GetEntry().GetMetadata()["owner-tag"] != "agent 7" {
		t.Fatalf("metadata %v", st.Msg.GetEntry().GetMetadata())
	}

	// With ?path= the query wins over the part filename, and the response
	// has no metadata key when none was given (the SDK deep-equals it).
	ct, body = multipartBody(t, [][2]string{{"ignored.txt", "gamma"}})
	resp, b = e.do(t, "POST", "/files?path=hello.txt", http.Header{"Content-Type": {ct}}, body)
	want = `[{"path":"` + e.home + `/hello.txt","name":"hello.txt","type":"file"}]` + "\n"
	if resp.StatusCode != 200 || string(b) != want {
		t.Fatalf("status %d body %s", resp.StatusCode, b)
	}
	if _, err := os.Stat(e.home + "/ignored.txt"); !os.IsNotExist(err) {
		t.Fatal("part filename used despite ?path=")
	}
	// Uploading replaces the metadata set.
	st, err = e.fs.Stat(context.Background(), connect.NewRequest(&fspb.StatRequest{Path: "hello.txt"}))
	must(t, err)
	if len(st.Msg.GetEntry().GetMetadata()) != 0 {
		t.Fatalf("metadata %v", st.Msg.GetEntry().GetMetadata())
	}
}

func TestUploadOctetStream(t *testing.T) {
	e := newTestEnv(t, nil)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte("compressed content"))
	must(t, zw.Close())
	tests := []struct {
		name   string
		hdr    http.Header
		body   []byte
		path   string
		status int
		want   string
	}{
		{"plain", http.Header{"Content-Type": {"application/octet-stream"}}, []byte("raw"), "o/plain.txt", 200, "raw"},
		{"gzip", http.Header{"Content-Type": {"application/octet-stream"}, "Content-Encoding": {"gzip"}}, gz.Bytes(), "o/gz.txt", 200, "compressed content"},
		{"no path", http.Header{"Content-Type": {"application/octet-stream"}}, []byte("raw"), "", 400, ""},
		{"bad type", http.Header{"Content-Type": {"text/plain"}}, []byte("raw"), "x.txt", 400, ""},
		{"target is dir", http.Header{"Content-Type": {"application/octet-stream"}}, []byte("raw"), "o", 400, ""},
		{"bad metadata", http.Header{"Content-Type": {"application/octet-stream"}, "X-Metadata-K": {"caf\u00e9"}}, []byte("raw"), "m.txt", 400, ""},
		{"unknown user", http.Header{"Content-Type": {"application/octet-stream"}}, []byte("raw"), "u.txt&username=ghost", 401, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := ""
			if tc.path != "" {
				q = "?path=" + tc.path
			}
			resp, b := e.do(t, "POST", "/files"+q, tc.hdr, bytes.NewReader(tc.body))
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			if tc.status != 200 {
				var eb struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
				}
				if err := json.Unmarshal(b, &eb); err != nil || eb.Code != tc.status || eb.Message == "" ||
					resp.Header.Get("Content-Type") != "application/json" {
					t.Fatalf("error body %s (%v)", b, err)
				}
				return
			}
			got, err := os.ReadFile(e.home + "/" + tc.path)
			must(t, err)
			if string(got) != tc.want {
				t.Fatalf("content %q", got)
			}
		})
	}
}

func TestUploadTooLarge(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.MaxUpload = 1024 })
	big := bytes.Repeat([]byte("z"), 4096)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(bytes.Repeat([]byte("z"), 1<<20))
	must(t, zw.Close())
	ct, mp := multipartBody(t, [][2]string{{"big.txt", string(big)}})
	tests := []struct {
		name string
		hdr  http.Header
		body io.Reader
	}{
		{"content-length", http.Header{"Content-Type": {"application/octet-stream"}}, bytes.NewReader(big)},
		{"chunked", http.Header{"Content-Type": {"application/octet-stream"}}, io.MultiReader(bytes.NewReader(big))},
		{"multipart chunked", http.Header{"Content-Type": {ct}}, io.MultiReader(mp)},
		{"gzip expanding past the limit", http.Header{"Content-Type": {"application/octet-stream"}, "Content-Encoding": {"gzip"}}, bytes.NewReader(gz.Bytes())},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := e.do(t, "POST", "/files?path=big.txt", tc.hdr, tc.body)
			if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), `"code":413`) {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
		})
	}
}

func TestDownload(t *testing.T) {
	e := newTestEnv(t, nil)
	content := strings.Repeat("downloadable ", 1000)
	writeFile(t, e.home+"/dl.txt", content)
	must(t, os.Mkdir(e.home+"/dir", 0o755))

	resp, b := e.do(t, "GET", "/files?path=dl.txt", nil, nil)
	if resp.StatusCode != 200 || string(b) != content || resp.Header.Get("Content-Disposition") != `inline; filename=dl.txt` {
		t.Fatalf("status %d, %d bytes, %v", resp.StatusCode, len(b), resp.Header)
	}
	resp, b = e.do(t, "GET", "/files?path="+url.QueryEscape(e.home+"/dl.txt"), http.Header{"Accept-Encoding": {"gzip"}}, nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("status %d headers %v", resp.StatusCode, resp.Header)
	}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	must(t, err)
	plain, err := io.ReadAll(zr)
	must(t, err)
	if string(plain) != content || len(b) >= len(content) {
		t.Fatalf("gzip body: %d bytes compressed, %q...", len(b), plain[:min(20, len(plain))])
	}
	resp, b = e.do(t, "GET", "/files?path=dl.txt", http.Header{"Range": {"bytes=0-11"}}, nil)
	if resp.StatusCode != http.StatusPartialContent || string(b) != "downloadable" {
		t.Fatalf("range: %d %q", resp.StatusCode, b)
	}
	for _, tc := range []struct {
		path   string
		status int
		msg    string
	}{
		{"missing.txt", 404, "path '" + e.home + "/missing.txt' does not exist"},
		{"dir", 400, "path '" + e.home + "/dir' is a directory"},
		{"dl.txt&username=ghost", 401, "error looking up user 'ghost'"},
	} {
		resp, b := e.do(t, "GET", "/files?path="+tc.path, nil, nil)
		if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.msg) {
			t.Errorf("%s: %d %s", tc.path, resp.StatusCode, b)
		}
	}
}

// TestOwnership: directories and files created for a user belong to it.
func TestOwnership(t *testing.T) {
	e := newTestEnv(t, nil)
	req := connect.NewRequest(&fspb.MakeDirRequest{Path: "~/made/sub"})
	req.Header().Set("Authorization", "Basic b3duZXI6") // "owner:"
	r, err := e.fs.MakeDir(context.Background(), req)
	must(t, err)
	if en := r.Msg.GetEntry(); en.GetOwner() != "owner" || en.GetGroup() != "owners" || en.GetPath() != e.home+"/owner/made/sub" {
		t.Fatalf("entry %v", en)
	}
	resp, b := e.do(t, "POST", "/files?username=owner&path=up/f.txt", http.Header{"Content-Type": {"application/octet-stream"}}, strings.NewReader("x"))
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	for _, p := range []string{"owner", "owner/made", "owner/made/sub", "owner/up", "owner/up/f.txt"} {
		fi, err := os.Stat(e.home + "/" + p)
		must(t, err)
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 4321 || st.Gid != 4321 {
			t.Errorf("%s owned by %d:%d", p, st.Uid, st.Gid)
		}
	}
	// Pre-existing parents are left alone.
	fi, err := os.Stat(e.home)
	must(t, err)
	if fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Error("existing home was chowned")
	}
}

// TestFileOpsAsUser: file operations run with the requesting user's
// file-system identity, so "owner" cannot read a root-only file or write
// into a root-owned directory, while root can.
func TestFileOpsAsUser(t *testing.T) {
	e := newTestEnv(t, nil)
	secret := e.home + "/secret"
	writeFile(t, secret, "top secret")
	must(t, os.Chmod(secret, 0o600))
	tests := []struct {
		name, method, target string
		body                 string
		wantOK               bool
	}{
		{"root reads root-only file", "GET", "/files?path=" + secret, "", true},
		{"owner cannot read root-only file", "GET", "/files?username=owner&path=" + secret, "", false},
		{"owner cannot write into a root dir", "POST", "/files?username=owner&path=" + e.home + "/planted", "x", false},
		{"owner writes its home", "POST", "/files?username=owner&path=" + e.home + "/owner/mine", "x", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader
			h := http.Header{}
			if tc.method == "POST" {
				body = strings.NewReader(tc.body)
				h.Set("Content-Type", "application/octet-stream")
			}
			resp, b := e.do(t, tc.method, tc.target, h, body)
			if (resp.StatusCode == 200) != tc.wantOK {
				t.Fatalf("status %d %s", resp.StatusCode, b)
			}
			if !tc.wantOK && strings.Contains(string(b), "top secret") {
				t.Fatal("secret leaked")
			}
		})
	}
	if _, err := os.Stat(e.home + "/planted"); err == nil {
		t.Fatal("owner planted a file in a root-owned directory")
	}
	req := connect.NewRequest(&fspb.RemoveRequest{Path: secret})
	req.Header().Set("Authorization", "Basic b3duZXI6") // "owner:"
	if _, err := e.fs.Remove(context.Background(), req); err == nil {
		if _, err := os.Stat(secret); err != nil {
			t.Fatal("owner removed a root file from a root-owned directory")
		}
	}
}
