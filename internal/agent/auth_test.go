package agent

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/corralhq/corral/proto/process"
)

func TestSignatureVector(t *testing.T) {
	// Known vector from the e2b SDK tests (docs/e2b-protocol.md §4.4).
	got := signature("hello.txt", "read", "user", "0tQG31xiMp0IOQfaz9dcwi72L1CPo8e0", nil)
	if want := "v1_gUtH/s9YCJWgCizjfUxuWfhFE4QSydOWEIIvfLwDr6E"; got != want {
		t.Fatalf("signature = %s, want %s", got, want)
	}
}

func TestAccessToken(t *testing.T) {
	const token = "s3cret-token"
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeFile(t, tokenFile, token+"\n")
	e := newTestEnv(t, func(c *Config) { c.TokenFile = tokenFile })
	writeFile(t, e.home+"/f.txt", "data")

	const unauthorized = `{"code":401,"message":"unauthorized access, please provide a valid access token or method signing if supported"}` + "\n"
	future := time.Now().Add(time.Hour).Unix()
	past := time.Now().Add(-time.Hour).Unix()
	sig := func(path, op, user string, exp *int64) string {
		return url.QueryEscape(signature(path, op, user, token, exp))
	}
	tests := []struct {
		name   string
		method string
		target string
		hdr    http.Header
		status int
		body   string
	}{
		{"health needs nothing", "GET", "/health", nil, 204, ""},
		{"rpc without token", "POST", "/process.Process/List", http.Header{"Content-Type": {"application/json"}}, 401, unauthorized},
		{"rpc with wrong token", "POST", "/process.Process/List", http.Header{"Content-Type": {"application/json"}, "X-Access-Token": {"nope"}}, 401, unauthorized},
		{"rpc with token", "POST", "/process.Process/List", http.Header{"Content-Type": {"application/json"}, "X-Access-Token": {token}}, 200, "{}"},
		{"files header token", "GET", "/files?path=f.txt", http.Header{"X-Access-Token": {token}}, 200, "data"},
		{"files wrong header token", "GET", "/files?path=f.txt&signature=" + sig("f.txt", "read", "", nil), http.Header{"X-Access-Token": {"bad"}}, 401, unauthorized},
		{"files missing signature", "GET", "/files?path=f.txt", nil, 401, `{"code":401,"message":"missing signature query parameter"}` + "\n"},
		{"files valid signature", "GET", "/files?path=f.txt&signature=" + sig("f.txt", "read", "", nil), nil, 200, "data"},
		{"files signature with user", "GET", "/files?path=f.txt&username=root&signature=" + sig("f.txt", "read", "root", nil), nil, 200, "data"},
		{"files signature wrong op", "GET", "/files?path=f.txt&signature=" + sig("f.txt", "write", "", nil), nil, 401, `{"code":401,"message":"invalid signature"}` + "\n"},
		{"files signature with expiration", "GET", "/files?path=f.txt&signature_expiration=" + strconv.FormatInt(future, 10) + "&signature=" + sig("f.txt", "read", "", &future), nil, 200, "data"},
		{"files expired signature", "GET", "/files?path=f.txt&signature_expiration=" + strconv.FormatInt(past, 10) + "&signature=" + sig("f.txt", "read", "", &past), nil, 401, `{"code":401,"message":"signature is already expired"}` + "\n"},
		{"files tampered expiration", "GET", "/files?path=f.txt&signature_expiration=" + strconv.FormatInt(future+1, 10) + "&signature=" + sig("f.txt", "read", "", &future), nil, 401, `{"code":401,"message":"invalid signature"}` + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var body *bytes.Reader
			if tc.method == "POST" {
				body = bytes.NewReader([]byte("{}"))
			} else {
				body = bytes.NewReader(nil)
			}
			resp, b := e.do(t, tc.method, tc.target, tc.hdr, body)
			if resp.StatusCode != tc.status || string(b) != tc.body {
				t.Fatalf("%d %q, want %d %q", resp.StatusCode, b, tc.status, tc.body)
			}
		})
	}

	// Upload with a write signature.
	resp, b := e.do(t, "POST", "/files?path=up.txt&signature="+sig("up.txt", "write", "", nil),
		http.Header{"Content-Type": {"application/octet-stream"}}, bytes.NewReader([]byte("up")))
	if resp.StatusCode != 200 {
		t.Fatalf("signed upload: %d %s", resp.StatusCode, b)
	}
	if got, _ := os.ReadFile(e.home + "/up.txt"); string(got) != "up" {
		t.Fatalf("uploaded %q", got)
	}

	// A Connect client without the token gets unauthenticated.
	_, err := e.proc.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
	wantCode(t, err, connect.CodeUnauthenticated, "")
}
