package api

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// Defaults of the HTTP bounds (docs/configuration.md).
const (
	// DefaultStallTimeout is how long a request body read or a response
	// write may make no progress before the connection is cut.
	DefaultStallTimeout = time.Minute
	// DefaultMaxStreamsPerKey is how many streams one credential may hold
	// open at once.
	DefaultMaxStreamsPerKey = 256
	// DefaultMaxOutput is how many trailing bytes of stdout and of stderr
	// an exec call returns (1 MiB each).
	DefaultMaxOutput = 1 << 20
)

// streamRetryAfter is the Retry-After of a too_many_streams refusal: when
// a stream ends cannot be known, so this is an estimate.
const streamRetryAfter = "1"

// streamLimit bounds the streams (long-lived requests: command streams
// and the agent's other calls, watches, file transfers, exec, template
// builds and imports) one credential holds open at once. It defends
// against one API key, or one sandbox's envd token, pinning an unbounded
// number of connections, goroutines and agent tunnels on the server.
type streamLimit struct {
	max  int
	mu   sync.Mutex
	open map[string]int // open streams by credential; guarded by mu
}

func newStreamLimit(max int) *streamLimit {
	if max <= 0 {
		max = DefaultMaxStreamsPerKey
	}
	return &streamLimit{max: max, open: map[string]int{}}
}

// acquire counts one more stream of key, or reports false when key holds
// max already. The release function gives it back (once).
func (l *streamLimit) acquire(key string) (release func(), ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key] >= l.max {
		return nil, false
	}
	l.open[key]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.open[key]--; l.open[key] <= 0 {
				delete(l.open, key)
			}
		})
	}, true
}

// refusal is the message of a too_many_streams answer.
func (l *streamLimit) refusal(whose string) string {
	return fmt.Sprintf("%s holds %d streams open, the most the server allows; close one or retry later", whose, l.max)
}

// streamed makes h (an authenticated route) count as a stream of the
// request's API key, refused with 429 too_many_streams and a Retry-After
// over the limit.
func (s *Server) streamed(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, _ := identityFrom(r.Context())
		release, ok := s.streams.acquire(id.principal())
		if !ok {
			w.Header().Set("Retry-After", streamRetryAfter)
			writeJSON(w, http.StatusTooManyRequests, apiError{Code: CodeTooManyStreams, Message: s.streams.refusal("this API key")})
			return
		}
		defer release()
		h(w, r)
	}
}

// sandboxStream counts an envd request as a stream of sandbox id (whose
// access token or URL signature is its credential); over the limit it
// answers E2B's 429 (the SDK's RateLimitError) and returns false.
func (s *Server) sandboxStream(w http.ResponseWriter, id string) (release func(), ok bool) {
	release, ok = s.streams.acquire(Identity{Kind: CredSandbox, SandboxID: id}.principal())
	if !ok {
		w.Header().Set("Retry-After", streamRetryAfter)
		e2bError(w, http.StatusTooManyRequests, CodeTooManyStreams+": "+s.streams.refusal("sandbox "+id))
	}
	return release, ok
}

// progressDeadlines bounds how long reading a request's body or writing
// its response may stall: each Read of the body and each Write or Flush
// of the response must complete within d, else the connection is cut
// (nginx's client_body_timeout and send_timeout). It defends against
// clients that hold a connection and its goroutine by trickling a body or
// by never reading a response, without cutting what streams: a command
// stream, a watch or a download that keeps moving is never cut however
// long it lasts, nor a handler that works long without I/O (exec waiting
// for its command). net/http's ReadTimeout and WriteTimeout cannot do
// this: they run from the start of the request, and an expired read
// deadline cancels the context of a handler still at work.
func progressDeadlines(d time.Duration, h http.Handler) http.Handler {
	if d <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		// No write deadline left from an earlier request on the connection.
		_ = rc.SetWriteDeadline(time.Time{})
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = &progressBody{body: r.Body, rc: rc, d: d}
		}
		h.ServeHTTP(&progressWriter{ResponseWriter: w, rc: rc, d: d}, r)
		// What net/http still writes (a buffered answer) and reads (the
		// rest of an unread body) after the handler gets d as well.
		now := time.Now()
		_ = rc.SetWriteDeadline(now.Add(d))
		_ = rc.SetReadDeadline(now.Add(d))
	})
}

// progressBody gives each Read of a request body d to complete and leaves
// no read deadline between reads (net/http's background read, which
// watches for the client going away while the handler works, must not
// time out).
type progressBody struct {
	body interface {
		Read([]byte) (int, error)
		Close() error
	}
	rc *http.ResponseController
	d  time.Duration
}

func (b *progressBody) Read(p []byte) (int, error) {
	_ = b.rc.SetReadDeadline(time.Now().Add(b.d))
	n, err := b.body.Read(p)
	_ = b.rc.SetReadDeadline(time.Time{})
	return n, err
}

func (b *progressBody) Close() error { return b.body.Close() }

// progressWriter gives each Write and Flush of a response d to complete.
type progressWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (w *progressWriter) extend() { _ = w.rc.SetWriteDeadline(time.Now().Add(w.d)) }

func (w *progressWriter) WriteHeader(code int) {
	w.extend()
	w.ResponseWriter.WriteHeader(code)
}

func (w *progressWriter) Write(p []byte) (int, error) {
	w.extend()
	return w.ResponseWriter.Write(p)
}

// FlushError flushes with a fresh deadline (http.ResponseController).
func (w *progressWriter) FlushError() error {
	w.extend()
	return w.rc.Flush()
}

// Flush implements http.Flusher for callers that assert it.
func (w *progressWriter) Flush() { _ = w.FlushError() }

// Hijack hands over the connection without deadlines: what the caller
// does with it (a WebSocket through the port tunnel) keeps its own time.
func (w *progressWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := w.rc.Hijack()
	if err == nil {
		_ = c.SetDeadline(time.Time{})
	}
	return c, brw, err
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *progressWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
