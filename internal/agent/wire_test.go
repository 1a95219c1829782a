package agent

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"reflect"
	"testing"
)

// jsonEqual compares JSON documents semantically (protojson randomizes
// whitespace on purpose).
func jsonEqual(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// envelope frames a Connect streaming message.
func envelope(flags byte, msg string) []byte {
	b := make([]byte, 5+len(msg))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	copy(b[5:], msg)
	return b
}

// frames splits a Connect streaming body into (flags, JSON) pairs.
func frames(t *testing.T, b []byte) (out [][2]string) {
	t.Helper()
	for len(b) > 0 {
		if len(b) < 5 {
			t.Fatalf("truncated frame header")
		}
		n := binary.BigEndian.Uint32(b[1:5])
		if uint32(len(b)-5) < n {
			t.Fatalf("truncated frame")
		}
		out = append(out, [2]string{string(rune('0' + b[0])), string(b[5 : 5+n])})
		b = b[5+n:]
	}
	return out
}

// TestWireJSON speaks the protocol as the e2b JS SDK does (Connect, JSON,
// HTTP/1.1) and checks the exact JSON frames it depends on.
func TestWireJSON(t *testing.T) {
	e := newTestEnv(t, nil)
	tests := []struct {
		name string
		req  string
		want [][2]string // flags digit, JSON; pid-bearing start frames are checked by prefix
	}{
		{"exit 0", `{"process":{"cmd":"/bin/echo","args":["hi"]},"stdin":false}`, [][2]string{
			{"0", `{"event":{"data":{"stdout":"aGkK"}}}`},
			{"0", `{"event":{"end":{"exited":true,"status":"exit status 0"}}}`},
			{"2", `{}`},
		}},
		{"exit 1", `{"process":{"cmd":"/bin/sh","args":["-c","exit 1"]}}`, [][2]string{
			{"0", `{"event":{"end":{"exitCode":1,"exited":true,"status":"exit status 1","error":"exit status 1"}}}`},
			{"2", `{}`},
		}},
		{"bad cwd", `{"process":{"cmd":"/bin/echo","cwd":"/nonexistent-dir"}}`, [][2]string{
			{"2", `{"error":{"code":"invalid_argument","message":"cwd '/nonexistent-dir' does not exist"}}`},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hdr := http.Header{"Content-Type": {"application/connect+json"}, "Connect-Protocol-Version": {"1"}, "Connect-Timeout-Ms": {"10000"}}
			resp, b := e.do(t, "POST", "/process.Process/Start", hdr, bytes.NewReader(envelope(0, tc.req)))
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/connect+json" {
				t.Fatalf("status %d %v", resp.StatusCode, resp.Header)
			}
			got := frames(t, b)
			if len(tc.want) > 1 || tc.want[0][0] != "2" {
				if len(got) == 0 || !bytes.HasPrefix([]byte(got[0][1]), []byte(`{"event":{"start":{"pid":`)) {
					t.Fatalf("first frame %v", got)
				}
				got = got[1:]
			}
			if len(got) != len(tc.want) {
				t.Fatalf("frames %q, want %q", got, tc.want)
			}
			for i := range got {
				if got[i][0] != tc.want[i][0] || !jsonEqual(got[i][1], tc.want[i][1]) {
					t.Errorf("frame %d = %q, want %q", i, got[i], tc.want[i])
				}
			}
		})
	}

	// Unary errors: non-200, JSON body with a string code.
	resp, b := e.do(t, "POST", "/process.Process/SendSignal", http.Header{"Content-Type": {"application/json"}},
		bytes.NewReader([]byte(`{"process":{"pid":4242424},"signal":"SIGNAL_SIGKILL"}`)))
	if resp.StatusCode != 404 || !jsonEqual(string(b), `{"code":"not_found","message":"process with pid 4242424 not found"}`) {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	// WatchDir's first frame is {"start":{}}, with no "event" wrapper.
	hdr := http.Header{"Content-Type": {"application/connect+json"}, "Connect-Protocol-Version": {"1"}, "Connect-Timeout-Ms": {"300"}}
	resp, b = e.do(t, "POST", "/filesystem.Filesystem/WatchDir", hdr, bytes.NewReader(envelope(0, `{"path":""}`)))
	got := frames(t, b)
	if resp.StatusCode != 200 || len(got) < 2 || got[0][0] != "0" || !jsonEqual(got[0][1], `{"start":{}}`) || got[len(got)-1][0] != "2" {
		t.Fatalf("watch frames %q", got)
	}
}
