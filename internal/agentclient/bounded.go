package agentclient

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/corralhq/corral/proto/filesystem/filesystemconnect"
	"github.com/corralhq/corral/proto/process/processconnect"
)

// What the control plane accepts from a sandbox's agent. Sandbox root can
// replace the agent's socket with a server of its own, so every reply is
// hostile input: these bound what one reply can cost the control plane.
const (
	// MaxMessage bounds one Connect message read from an agent
	// (the agent's largest, a process list, is far smaller).
	MaxMessage = 16 << 20
	// maxSend bounds one message sent to an agent: the agent reads
	// at most 1 MiB.
	maxSend = 1 << 20
	// maxHeaderBytes bounds the header block of an agent reply.
	maxHeaderBytes = 64 << 10
	// CallTimeout is the deadline of a unary call to an agent whose
	// context has none.
	CallTimeout = time.Minute
)

// ErrReply marks a reply from a sandbox's agent that the control
// plane refused to read: a message over MaxMessage, or a compressed
// one (the control plane asks for none).
var ErrReply = errors.New("the sandbox's agent sent a reply the control plane refuses")

func replyRefused(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrReply, fmt.Sprintf(format, args...))
}

// NewProcessClient returns a process.Process client over hc whose replies
// are bounded (see boundedReplies) and whose unary calls get timeout when
// their context has no deadline.
//
// It defends the control plane against a fake agent planted by sandbox
// root: connect-go reads messages of any size by default, decompresses
// gzip to any size, and on a message over ReadMaxBytes still reads (and
// inflates) the rest to discard it. TestAgentClientRefusesBombs and, with
// a fake agent in a real sandbox, TestFakeAgentBomb are the regression
// tests.
func NewProcessClient(hc *http.Client, baseURL string, timeout time.Duration) processconnect.ProcessClient {
	bounded, opts := boundedClient(hc, timeout)
	return processconnect.NewProcessClient(bounded, baseURL, opts...)
}

// boundedClient is hc with every reply bounded and the Connect options
// of every client of an agent: messages at most MaxMessage read and
// maxSend sent, no compression accepted (nothing is decompressed, and an
// agent on a unix socket gains nothing from it), unary calls given
// timeout.
func boundedClient(hc *http.Client, timeout time.Duration) (*http.Client, []connect.ClientOption) {
	return &http.Client{Transport: boundedReplies{next: hc.Transport}}, []connect.ClientOption{
		connect.WithReadMaxBytes(MaxMessage),
		connect.WithSendMaxBytes(maxSend),
		connect.WithAcceptCompression("gzip", nil, nil),
		connect.WithInterceptors(unaryDeadline(timeout)),
	}
}

// NewFilesystemClient returns a filesystem.Filesystem client over hc with
// the bounds of NewProcessClient (a fake agent's reply cannot cost more
// than MaxMessage, nothing is decompressed, unary calls get timeout).
func NewFilesystemClient(hc *http.Client, baseURL string, timeout time.Duration) filesystemconnect.FilesystemClient {
	bounded, opts := boundedClient(hc, timeout)
	return filesystemconnect.NewFilesystemClient(bounded, baseURL, opts...)
}

// unaryDeadline gives unary calls a deadline of d unless they have one, so
// that an agent that never answers cannot hold a caller forever. Streams
// are left alone: a command may run as long as its caller waits.
func unaryDeadline(d time.Duration) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if _, ok := ctx.Deadline(); !ok {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, d)
				defer cancel()
			}
			return next(ctx, req)
		}
	}
}

// boundedReplies is the transport of the control plane's Connect clients
// toward an agent. It refuses compressed replies and, while connect-go
// reads, fails a reply at the first byte past its bound: a unary body of
// more than MaxMessage bytes, or a stream envelope that declares
// more than MaxMessage bytes. It thus never reads more than one
// bound's worth of a bad reply. (The SDK traffic the API proxies to the
// agent as it is does not go through it: it streams through and is not
// buffered.)
type boundedReplies struct {
	next http.RoundTripper
}

func (b boundedReplies) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := b.next.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	for _, h := range []string{"Content-Encoding", "Connect-Content-Encoding"} {
		if enc := resp.Header.Get(h); enc != "" && enc != "identity" {
			resp.Body.Close()
			return nil, replyRefused("a %s reply (none was asked for)", clip(enc, 32))
		}
	}
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/connect+") {
		resp.Body = &envelopeGuard{r: resp.Body, max: MaxMessage}
	} else {
		resp.Body = &bodyCap{r: resp.Body, left: MaxMessage}
	}
	return resp, nil
}

// bodyCap fails a unary reply body longer than its bound.
type bodyCap struct {
	r    io.ReadCloser
	left int64
}

func (c *bodyCap) Read(p []byte) (int, error) {
	if c.left <= 0 {
		var one [1]byte
		if n, err := c.r.Read(one[:]); n == 0 {
			return 0, err // the body ends at the bound
		}
		return 0, replyRefused("a message over %d bytes", MaxMessage)
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

func (c *bodyCap) Close() error { return c.r.Close() }

// envelopeGuard follows the Connect streaming framing (a 5-byte prefix of
// flags and big-endian length, then the message) and fails at the first
// prefix that declares a compressed message or one over max bytes.
type envelopeGuard struct {
	r      io.ReadCloser
	max    uint32
	prefix [5]byte
	seen   int    // bytes of the current prefix read
	left   uint32 // message bytes left before the next prefix
	err    error  // sticky refusal
}

func (g *envelopeGuard) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.r.Read(p)
	for i := 0; i < n; {
		if g.left > 0 {
			k := min(uint32(n-i), g.left)
			g.left -= k
			i += int(k)
			continue
		}
		g.prefix[g.seen] = p[i]
		g.seen++
		i++
		if g.seen < len(g.prefix) {
			continue
		}
		g.seen = 0
		size := binary.BigEndian.Uint32(g.prefix[1:])
		switch {
		case g.prefix[0]&1 != 0:
			g.err = replyRefused("a compressed message (none was asked for)")
		case size > g.max:
			g.err = replyRefused("a message of %d bytes (the limit is %d)", size, g.max)
		}
		if g.err != nil {
			return 0, g.err
		}
		g.left = size
	}
	return n, err
}

func (g *envelopeGuard) Close() error { return g.r.Close() }

// headerGuard bounds the bytes read until a reply's header block is
// parsed (PortHandshake reads it by hand); then it reads without bound.
type headerGuard struct {
	r    io.Reader
	left int64
	done bool
}

func (h *headerGuard) Read(p []byte) (int, error) {
	if h.done {
		return h.r.Read(p)
	}
	if h.left <= 0 {
		return 0, replyRefused("a header block over %d bytes", maxHeaderBytes)
	}
	if int64(len(p)) > h.left {
		p = p[:h.left]
	}
	n, err := h.r.Read(p)
	h.left -= int64(n)
	return n, err
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
