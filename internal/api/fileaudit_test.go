package api

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/corralhq/corral/proto/filesystem"
)

func TestFileOp(t *testing.T) {
	pb, _ := proto.Marshal(&filesystem.RemoveRequest{Path: "/tmp/p"})
	tests := []struct {
		name, method, target, ct, body string
		kind                           string
		want                           map[string]any
	}{
		{"upload", "POST", "/files?path=/home/user/a.txt", "application/octet-stream", "data", "file.write", map[string]any{"path": "/home/user/a.txt"}},
		{"download", "GET", "/files?path=/x", "", "", "", nil},
		{"remove json", "POST", "/filesystem.Filesystem/Remove", "application/json", `{"path":"/tmp/x"}`, "file.delete", map[string]any{"path": "/tmp/x"}},
		{"remove proto", "POST", "/filesystem.Filesystem/Remove", "application/proto", string(pb), "file.delete", map[string]any{"path": "/tmp/p"}},
		{"move", "POST", "/filesystem.Filesystem/Move", "application/json", `{"source":"/a","destination":"/b"}`, "file.move", map[string]any{"source": "/a", "destination": "/b"}},
		{"mkdir", "POST", "/filesystem.Filesystem/MakeDir", "application/json", `{"path":"/d"}`, "file.mkdir", map[string]any{"path": "/d"}},
		{"stat", "POST", "/filesystem.Filesystem/Stat", "application/json", `{"path":"/d"}`, "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, tc.target, strings.NewReader(tc.body))
			if tc.ct != "" {
				r.Header.Set("Content-Type", tc.ct)
			}
			kind, data := fileOp(r)
			if kind != tc.kind {
				t.Fatalf("kind %q, want %q", kind, tc.kind)
			}
			for k, v := range tc.want {
				if data[k] != v {
					t.Fatalf("%s = %v, want %v (%v)", k, data[k], v, data)
				}
			}
			// The body is still there for the agent.
			if b, _ := io.ReadAll(r.Body); string(b) != tc.body {
				t.Fatalf("body after fileOp: %q", b)
			}
		})
	}
}
