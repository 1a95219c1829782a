package server

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

// TestHTTPServerTimeouts defends against connections held open for free:
// a keep-alive connection left idle after a request (the listener had no
// idle timeout, so it stayed open forever) and a client that never
// finishes its headers are both closed by the server.
func TestHTTPServerTimeouts(t *testing.T) {
	s := &Server{cfg: Config{HTTPHeaderTimeout: 300 * time.Millisecond, HTTPIdleTimeout: 300 * time.Millisecond},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })}
	hs := s.HTTPServer()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })

	// closed waits (generously) for the server to close c.
	closed := func(t *testing.T, c net.Conn, br *bufio.Reader) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err := br.ReadByte()
		if !errors.Is(err, io.EOF) {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("the server kept the connection open for 30 s")
			}
			t.Fatalf("read from a connection the server should close: %v", err)
		}
	}
	t.Run("idle keep-alive", func(t *testing.T) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := io.ReadAll(resp.Body); string(b) != "ok" || resp.Close {
			t.Fatalf("first answer %q (close %v); want a kept-alive ok", b, resp.Close)
		}
		closed(t, c, br)
	})
	t.Run("unfinished headers", func(t *testing.T) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
		br := bufio.NewReader(c)
		// net/http may answer 408 before it closes; the close is the point.
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if resp, err := http.ReadResponse(br, nil); err == nil {
			resp.Body.Close()
		}
		closed(t, c, br)
	})
}
