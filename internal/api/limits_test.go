package api

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/proto/agentproto"
)

// stall is the progress deadline of these tests; the waits for an
// outcome are much longer and bound nothing.
const stall = 200 * time.Millisecond

// serveWithDeadlines serves h behind progressDeadlines(stall) on a real
// listener.
func serveWithDeadlines(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(progressDeadlines(stall, h))
	t.Cleanup(srv.Close)
	return srv
}

// waitErr waits (generously) for the handler to report.
func waitErr(t *testing.T, errc <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: the handler is still blocked after 30 s", what)
		return nil
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestProgressDeadlinesCutStalledPeers defends against slow clients that
// hold a connection and its goroutine forever (the server had no read or
// write timeout): a body that stops arriving and a response nobody reads
// both end in a timeout error in the handler.
func TestProgressDeadlinesCutStalledPeers(t *testing.T) {
	t.Run("body stops arriving", func(t *testing.T) {
		errc := make(chan error, 1)
		srv := serveWithDeadlines(t, func(w http.ResponseWriter, r *http.Request) {
			_, err := io.ReadAll(r.Body)
			errc <- err
		})
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nonly a little")
		if err := waitErr(t, errc, "stalled body"); !isTimeout(err) {
			t.Fatalf("reading a stalled body: %v; want a timeout", err)
		}
	})
	t.Run("response never read", func(t *testing.T) {
		errc := make(chan error, 1)
		srv := serveWithDeadlines(t, func(w http.ResponseWriter, r *http.Request) {
			chunk := make([]byte, 1<<20)
			for range 1024 {
				if _, err := w.Write(chunk); err != nil {
					errc <- err
					return
				}
			}
			errc <- errors.New("1 GiB written to a client that reads nothing")
		})
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		if err := waitErr(t, errc, "unread response"); !isTimeout(err) {
			t.Fatalf("writing to a client that does not read: %v; want a timeout", err)
		}
	})
}

// TestProgressDeadlinesKeepStreams guards the other side of the bound: it
// must not cut what is alive. A stream that pauses longer than the stall
// timeout between writes, a handler that works longer than it without
// I/O after reading its body (its context stays live), a keep-alive
// connection reused after a pause, and a hijacked connection used after a
// pause all work.
func TestProgressDeadlinesKeepStreams(t *testing.T) {
	srv := serveWithDeadlines(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/stream":
			body, _ := io.ReadAll(r.Body)
			for _, part := range []string{string(body), "-a", "-b", "-c"} {
				time.Sleep(3 * stall)
				if err := r.Context().Err(); err != nil {
					io.WriteString(w, " context ended: "+err.Error())
					return
				}
				io.WriteString(w, part)
				_ = http.NewResponseController(w).Flush()
			}
		case "/hijack":
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			defer c.Close()
			time.Sleep(3 * stall)
			brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nlate")
			brw.Flush()
		case "/empty":
		}
	})
	resp, err := http.Post(srv.URL+"/stream", "text/plain", strings.NewReader("body"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(b) != "body-a-b-c" {
		t.Fatalf("a slow stream: %q %v; want body-a-b-c", b, err)
	}
	// The same keep-alive connection, after a pause, for an answer the
	// handler leaves to net/http.
	time.Sleep(3 * stall)
	resp, err = http.Get(srv.URL + "/empty")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("a reused connection after a pause: %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Get(srv.URL + "/hijack")
	if err != nil {
		t.Fatalf("a hijacked connection used after a pause: %v", err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "late" {
		t.Fatalf("hijacked answer %q", b)
	}
}

// TestStreamLimit defends against one credential holding an unbounded
// number of streams open (there was no bound): with a limit of two, a
// third stream of the same API key is refused with 429 too_many_streams
// and a Retry-After, another key is unaffected, and a closed stream frees
// its place.
func TestStreamLimit(t *testing.T) {
	s, st := authServer(t)
	s.streams = newStreamLimit(2)
	for _, k := range []string{"key-a", "key-b"} {
		if err := st.AddAPIKey(context.Background(), k, k, "", "admin"); err != nil {
			t.Fatal(err)
		}
	}
	hold := make(chan struct{})
	started := make(chan struct{}, 8)
	srv := httptest.NewServer(s.auth(s.streamed(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			started <- struct{}{}
			<-hold
		}
		io.WriteString(w, "ok")
	})))
	defer srv.Close()
	defer close(hold)
	do := func(key, path string) (*http.Response, string) {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	held := make(chan string, 2)
	for range 2 {
		go func() { _, b := do("key-a", "/hold"); held <- b }()
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("a held stream never started")
		}
	}
	resp, body := do("key-a", "/now")
	var e apiError
	if json.Unmarshal([]byte(body), &e) != nil || resp.StatusCode != 429 || e.Code != CodeTooManyStreams || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("a third stream of one key: %d %q (Retry-After %q); want 429 too_many_streams", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	if resp, body := do("key-b", "/now"); resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("another key: %d %q", resp.StatusCode, body)
	}
	hold <- struct{}{} // one held stream ends
	if b := <-held; b != "ok" {
		t.Fatalf("held stream answered %q", b)
	}
	if resp, body := do("key-a", "/now"); resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("the key after one stream closed: %d %q", resp.StatusCode, body)
	}
}

// TestSignTail: the signature finished from a hashed prefix is envd's v1
// signature of the whole message, with and without an expiry, and the
// prefix can be reused for the next token.
func TestSignTail(t *testing.T) {
	want := func(msg string) string {
		sum := sha256.Sum256([]byte(msg))
		return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	}
	prefix := sha256.New()
	io.WriteString(prefix, "/home/user/a.txt:write:user:")
	for _, tc := range []struct{ token, exp string }{{"tok1", ""}, {"tok2", "1767225600"}, {"tok1", ""}} {
		got := signTail(prefix, tc.token, tc.exp)
		w := agentproto.Signature("/home/user/a.txt", "write", "user", tc.token, tc.exp)
		if got != w || len(got) != signatureLen || !wellFormedSignature(got, tc.exp) {
			t.Fatalf("signTail(%q, %q) = %q; want %q", tc.token, tc.exp, got, w)
		}
	}
	for _, bad := range []struct{ sig, exp string }{{"v1_short", ""}, {"v2_" + strings.Repeat("A", 43), ""}, {want("x"), "12a"}, {want("x"), strings.Repeat("9", 21)}} {
		if wellFormedSignature(bad.sig, bad.exp) {
			t.Errorf("wellFormedSignature(%q, %q) = true", bad.sig, bad.exp)
		}
	}
}

// BenchmarkSignedMatch is the cost of testing one live sandbox's token
// against a signed URL, by path length: with the prefix hashed once per
// request, it does not grow with the caller-sized path.
func BenchmarkSignedMatch(b *testing.B) {
	for _, n := range []int{16, 60 << 10} {
		b.Run(fmt.Sprintf("path=%dB", n), func(b *testing.B) {
			prefix := sha256.New()
			io.WriteString(prefix, "/"+strings.Repeat("p", n)+":read:user:")
			for b.Loop() {
				_ = signTail(prefix, "0123456789abcdef0123456789abcdef0123456789abcdef", "1767225600")
			}
		})
	}
}
