package agentclient

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/corralhq/corral/proto/filesystem"
	"github.com/corralhq/corral/proto/process"
)

// bombBytes is what the gzip bomb of these tests inflates to.
const bombBytes = 4 << 30

var (
	bombOnce sync.Once
	bomb     []byte
)

// gzipBomb returns a gzip stream of bombBytes zero bytes, a few MiB long:
// one member of 64 MiB of zeros, repeated (gzip readers read every member).
func gzipBomb(t *testing.T) []byte {
	t.Helper()
	bombOnce.Do(func() {
		var member bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&member, gzip.BestCompression)
		zero := make([]byte, 1<<20)
		for range 64 {
			zw.Write(zero)
		}
		zw.Close()
		bomb = bytes.Repeat(member.Bytes(), bombBytes/(64<<20))
	})
	return bomb
}

// zeros writes n zero bytes to w (or until the client goes away).
func zeros(w io.Writer, n int64) {
	buf := make([]byte, 32<<10)
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := w.Write(buf[:k]); err != nil {
			return
		}
		n -= k
	}
}

func envelopePrefix(flags byte, size uint32) []byte {
	p := []byte{flags, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(p[1:], size)
	return p
}

// allocated returns the bytes the process allocated while fn ran.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestAgentClientRefusesBombs: a fake agent (sandbox root can replace the
// agent's socket with its own server) answers the control plane's
// process client with a gzip bomb that inflates to 4 GiB, a 1 GiB
// message, or a stream envelope that claims 4 GiB; each call fails with
// ErrReply having read no more than one bound's worth, and the
// control plane allocates a small fraction of the bomb.
func TestAgentClientRefusesBombs(t *testing.T) {
	bomb := gzipBomb(t)
	cases := []struct {
		name   string
		stream bool
		serve  func(w http.ResponseWriter)
	}{
		{"unary gzip bomb", false, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/proto")
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(bomb)
		}},
		{"unary 1 GiB message", false, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/proto")
			zeros(w, 1<<30)
		}},
		{"stream gzip bomb envelope", true, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/connect+proto")
			w.Header().Set("Connect-Content-Encoding", "gzip")
			w.Write(envelopePrefix(1, uint32(len(bomb))))
			w.Write(bomb)
		}},
		{"stream envelope claiming 4 GiB", true, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/connect+proto")
			w.Write(envelopePrefix(0, 1<<32-1))
			zeros(w, 1<<30)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				tc.serve(w)
			}))
			defer srv.Close()
			pc := NewProcessClient(srv.Client(), srv.URL, 30*time.Second)
			var err error
			n := allocated(func() {
				if tc.stream {
					var st *connect.ServerStreamForClient[process.StartResponse]
					st, err = pc.Start(context.Background(), connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "true"}}))
					if err == nil {
						for st.Receive() {
						}
						err = st.Err()
						st.Close()
					}
				} else {
					_, err = pc.List(context.Background(), connect.NewRequest(&process.ListRequest{}))
				}
			})
			if !errors.Is(err, ErrReply) {
				t.Fatalf("call answered by a bomb: err %v, want ErrReply", err)
			}
			if n > 8*MaxMessage && !raceEnabled {
				t.Fatalf("the call allocated %d MiB (bound %d MiB)", n>>20, MaxMessage>>20)
			}
			t.Logf("%v; allocated %d KiB", err, n>>10)
		})
	}
}

// TestFilesystemClientRefusesBombs: the filesystem client (list_files of
// the tools) refuses a fake agent's gzip bomb and oversized message as
// the process client does, without inflating or reading them whole.
func TestFilesystemClientRefusesBombs(t *testing.T) {
	bomb := gzipBomb(t)
	for name, serve := range map[string]func(w http.ResponseWriter){
		"gzip bomb": func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/proto")
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(bomb)
		},
		"1 GiB message": func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/proto")
			zeros(w, 1<<30)
		},
	} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				serve(w)
			}))
			defer srv.Close()
			fc := NewFilesystemClient(srv.Client(), srv.URL, 30*time.Second)
			var err error
			n := allocated(func() {
				_, err = fc.ListDir(context.Background(), connect.NewRequest(&filesystem.ListDirRequest{Path: "/"}))
			})
			if !errors.Is(err, ErrReply) {
				t.Fatalf("ListDir answered by a bomb: err %v, want ErrReply", err)
			}
			if n > 8*MaxMessage && !raceEnabled {
				t.Fatalf("the call allocated %d MiB (bound %d MiB)", n>>20, MaxMessage>>20)
			}
		})
	}
}

// TestAgentClientUnaryDeadline: a fake agent that never answers a unary
// call holds it only until CallTimeout (here shortened), not forever.
func TestAgentClientUnaryDeadline(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Silent for far longer than the deadline; then an empty answer
		// (so that a client without a deadline fails the test, not hangs).
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}))
	defer srv.Close()
	pc := NewProcessClient(srv.Client(), srv.URL, 100*time.Millisecond)
	_, err := pc.List(context.Background(), connect.NewRequest(&process.ListRequest{}))
	if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("List of a silent agent: %v, want deadline_exceeded", err)
	}
}

// TestPortHandshakeBoundsHeaders: a fake agent answering the port tunnel
// handshake with an endless header block is refused after
// maxHeaderBytes, not buffered without bound.
func TestPortHandshakeBoundsHeaders(t *testing.T) {
	c, fake := net.Pipe()
	defer c.Close()
	go func() {
		defer fake.Close()
		go io.Copy(io.Discard, fake)
		io.WriteString(fake, "HTTP/1.1 101 Switching Protocols\r\n")
		line := "X-Pad: " + strings.Repeat("a", 1000) + "\r\n"
		for i := 0; i < 100000; i++ {
			if _, err := io.WriteString(fake, line); err != nil {
				return
			}
		}
	}()
	var err error
	n := allocated(func() { _, err = PortHandshake(c, 8080, "tok") })
	if !errors.Is(err, ErrReply) {
		t.Fatalf("handshake with endless headers: %v, want ErrReply", err)
	}
	if n > 16*maxHeaderBytes {
		t.Fatalf("the handshake allocated %d KiB", n>>10)
	}
}
