package egress

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// ErrNotRedirected is returned (wrapped) by [OriginalDst] for a connection
// that reached the listener directly rather than through an nftables
// redirect.
var ErrNotRedirected = errors.New("not a redirected connection")

// Bounds of the protocol detection on a redirected connection.
const (
	// maxSniff is the most bytes read to tell HTTP from the rest: the
	// longest method we recognise plus its space.
	maxSniff = 16
	// maxClientHello bounds the bytes read while parsing a ClientHello (a
	// handshake message is at most 64 KiB, in records of at most 16 KiB
	// plus headers).
	maxClientHello = 70 << 10
	// clientHelloTimeout bounds reading the rest of a ClientHello.
	clientHelloTimeout = 10 * time.Second
	// interceptHandshakeTimeout bounds the client handshake of an
	// intercepted TLS connection.
	interceptHandshakeTimeout = 10 * time.Second
)

// httpMethods are the request-line starts that make a redirected
// connection plain HTTP. A short list of real methods, not any token, so
// that line-based protocols ("NICK x", "EHLO x") stay raw TCP.
var httpMethods = []string{
	"GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "OPTIONS ", "PATCH ",
	"TRACE ", "CONNECT ", "PROPFIND ", "PROPPATCH ", "MKCOL ", "COPY ",
	"MOVE ", "LOCK ", "UNLOCK ", "REPORT ", "SEARCH ",
}

type connKind int

const (
	kindRaw connKind = iota
	kindTLS
	kindHTTP
)

// classifyStart decides the protocol from the first bytes; ok is false while
// more bytes could change the answer.
func classifyStart(b []byte) (kind connKind, ok bool) {
	if len(b) == 0 {
		return kindRaw, false
	}
	if b[0] == 0x16 { // TLS handshake record
		return kindTLS, true
	}
	possible := false
	for _, m := range httpMethods {
		if len(b) >= len(m) {
			if string(b[:len(m)]) == m {
				return kindHTTP, true
			}
		} else if m[:len(b)] == string(b) {
			possible = true
		}
	}
	return kindRaw, !possible
}

// sniff reads the first bytes of c, waiting up to timeout for the first
// byte and as long again for the rest of an HTTP method, and returns the
// protocol and the bytes read. Silence, EOF or an error mean raw TCP.
func sniff(c net.Conn, timeout time.Duration) (connKind, []byte) {
	buf := make([]byte, 0, maxSniff)
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	for {
		n, err := c.Read(buf[len(buf):cap(buf)])
		first := len(buf) == 0 && n > 0
		buf = buf[:len(buf)+n]
		if k, ok := classifyStart(buf); ok {
			return k, buf
		}
		if err != nil || len(buf) == cap(buf) {
			return kindRaw, buf
		}
		if first {
			_ = c.SetReadDeadline(time.Now().Add(timeout))
		}
	}
}

// helloConn is a read-only view of a client connection that records every
// byte read, for parsing a ClientHello with crypto/tls without answering
// it: writes are discarded.
type helloConn struct {
	net.Conn
	r   io.Reader
	buf []byte
}

// Read reads from the client and records what it returns.
func (h *helloConn) Read(b []byte) (int, error) {
	if len(h.buf) >= maxClientHello {
		return 0, errors.New("egress: ClientHello too large")
	}
	if room := maxClientHello - len(h.buf); len(b) > room {
		b = b[:room]
	}
	n, err := h.r.Read(b)
	h.buf = append(h.buf, b[:n]...)
	return n, err
}

// Write discards: the client must see nothing of the parse.
func (h *helloConn) Write(b []byte) (int, error) { return len(b), nil }

// Close does nothing: the connection lives on.
func (h *helloConn) Close() error { return nil }

var errHelloRead = errors.New("egress: ClientHello read")

// readClientHello parses the client's ClientHello with crypto/tls (run as
// a server over a recording, write-discarding view of c, stopped from
// GetConfigForClient before it answers) and returns the SNI ("" when
// absent or unparsable) and every byte consumed, prefix first, for replay.
func readClientHello(c net.Conn, prefix []byte) (string, []byte) {
	h := &helloConn{Conn: c, r: io.MultiReader(bytes.NewReader(prefix), c), buf: make([]byte, 0, 2048)}
	_ = c.SetReadDeadline(time.Now().Add(clientHelloTimeout))
	defer c.SetReadDeadline(time.Time{})
	var sni string
	_ = tls.Server(h, &tls.Config{
		GetConfigForClient: func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
			sni = chi.ServerName
			return nil, errHelloRead
		},
	}).Handshake()
	return sni, h.buf
}

// prefixConn replays bytes already read from a connection before reading
// on from it.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func newPrefixConn(c net.Conn, prefix []byte) net.Conn {
	if len(prefix) == 0 {
		return c
	}
	return &prefixConn{Conn: c, r: io.MultiReader(bytes.NewReader(prefix), c)}
}

// Read reads the replayed bytes, then the connection.
func (c *prefixConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// ServeTransparent handles one redirected connection until it ends. It
// never returns before the connection is closed. orig is the connection's
// destination before the redirect ([OriginalDst]).
//
// The connection's source address identifies the sandbox
// ([ProxyConfig.Client]; unknown: reset). It takes a connection slot and
// counts as one request ([Limits]; over a cap: reset). Then, by its first
// bytes (waiting up to [ProxyConfig.FirstByteTimeout]):
//
//   - a TLS ClientHello with a server name: the name is checked like a
//     CONNECT's ([Policy.AllowsName], then every resolved address, and
//     again at dial time) and the proxy dials name:orig.Port itself, never
//     orig's address; the ClientHello is replayed and the bytes spliced
//     (event mode [EventTransparent], method "TLS"). If the sandbox has a
//     [Secret] for the name and the proxy has a [CA], the TLS is
//     intercepted instead and secrets are injected into its requests.
//   - plain HTTP: each request is checked and dialed on its own by its Host
//     header (port from Host, else orig's), with secrets injected; a
//     refused request gets "403 Forbidden" with the body
//     "corral egress: refused: <reason>" and the connection is closed.
//   - anything else (no server name, other protocols, silence): raw TCP to
//     orig, allowed only by [Policy.AllowsAddr] with named = false (CIDR
//     rules, or all-public); refused: reset (event mode [EventRaw]).
//
// A refusal resets the connection (RST, so the sandbox sees ECONNRESET at
// once) after emitting its event. Under mode none the connection is reset
// at once without waiting for data.
func (p *Proxy) ServeTransparent(ctx context.Context, c net.Conn, orig netip.AddrPort) {
	start := time.Now()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	defer c.Close()

	orig = netip.AddrPortFrom(canonical(orig.Addr()), orig.Port())
	ev := Event{Mode: EventRaw, Method: "TCP", Host: orig.Addr().String(), Port: int(orig.Port()), Verdict: VerdictRefused}
	emitted := false
	finish := func() {
		if !emitted {
			emitted = true
			ev.Duration = time.Since(start)
			p.emit(ev)
		}
	}
	defer finish()
	refuse := func(reason string) {
		ev.Verdict, ev.Reason = VerdictRefused, reason
		finish()
		resetConn(c)
	}

	addr, ok := addrOf(c.RemoteAddr())
	var cl Client
	if ok {
		cl, ok = p.cfg.Client(addr)
	}
	if !ok {
		refuse("connection from no known sandbox")
		return
	}
	ev.Sandbox = cl.ID
	if cl.Refused != "" {
		refuse(cl.Refused)
		return
	}
	slot := p.caps.acquireConn(cl.ID, cl.Limits)
	defer slot.release()
	if slot.over {
		refuse(ReasonCapConns)
		return
	}
	if why := p.caps.admit(cl.ID, cl.Limits, p.now(), true); why != "" {
		refuse(why)
		return
	}
	if cl.Policy.Mode == "" || cl.Policy.Mode == ModeNone {
		refuse("networking is off")
		return
	}

	kind, prefix := sniff(c, p.cfg.FirstByteTimeout)
	switch kind {
	case kindHTTP:
		// One event per request, from the handler.
		emitted = true
		h := &connHandler{p: p, client: addr, mode: EventTransparent, port: orig.Port()}
		h.first.Store(true)
		p.serveHTTPConn(ctx, newPrefixConn(c, prefix), h)
		return
	case kindTLS:
		sni, consumed := readClientHello(c, prefix)
		rc := newPrefixConn(c, consumed)
		name := normalizeHost(sni)
		if _, err := netip.ParseAddr(name); name != "" && err != nil {
			p.serveTLSByName(ctx, c, rc, addr, cl, name, orig.Port(), &ev, refuse)
			return
		}
		p.serveRaw(ctx, c, rc, cl, orig, &ev, refuse)
	default:
		p.serveRaw(ctx, c, newPrefixConn(c, prefix), cl, orig, &ev, refuse)
	}
}

// serveRaw splices a redirected connection to its original destination if
// the policy allows that address for an unnamed connection.
func (p *Proxy) serveRaw(ctx context.Context, c, rc net.Conn, cl Client, orig netip.AddrPort, ev *Event, refuse func(string)) {
	ev.Mode, ev.Method, ev.Host = EventRaw, "TCP", orig.Addr().String()
	ok, why := cl.Policy.AllowsAddr(orig.Addr(), orig.Port(), false)
	if !ok {
		refuse(why)
		return
	}
	plan := &dialPlan{pol: cl.Policy, named: false, addrs: []netip.AddrPort{orig}, m: p.caps.meter(cl.ID, cl.Limits)}
	p.spliceTo(ctx, c, rc, plan, why, ev, refuse)
}

// serveTLSByName handles a redirected TLS connection by its SNI name.
func (p *Proxy) serveTLSByName(ctx context.Context, c, rc net.Conn, client netip.Addr, cl Client, name string, port uint16, ev *Event, refuse func(string)) {
	ev.Mode, ev.Method, ev.Host = EventTransparent, "TLS", name
	dctx, cancel := context.WithTimeout(ctx, p.cfg.DialTimeout)
	plan, why, rerr := p.plan(dctx, cl, name, port)
	cancel()
	if rerr != nil {
		refuse(rerr.reason)
		return
	}
	if p.cfg.CA != nil && hasSecretFor(name, cl.Secrets) {
		ev.Reason = why
		p.intercept(ctx, rc, client, name, port, EventTransparent, ev)
		return
	}
	p.spliceTo(ctx, c, rc, plan, why, ev, refuse)
}

// spliceTo dials plan and splices the client (reading from rc, which
// replays what was peeked) to it.
func (p *Proxy) spliceTo(ctx context.Context, c, rc net.Conn, plan *dialPlan, why string, ev *Event, refuse func(string)) {
	defer func() {
		ev.Addr = plan.dialedAddr()
		ev.BytesUp, ev.BytesDown = plan.up.Load(), plan.down.Load()
		if plan.capped() {
			ev.Verdict, ev.Reason = VerdictRefused, ReasonCapBytes
		}
	}()
	dctx, cancel := context.WithTimeout(ctx, p.cfg.DialTimeout)
	up, err := p.dialPlan(dctx, plan)
	cancel()
	if err != nil {
		ev.Addr = plan.dialedAddr()
		refuse(dialError(err).reason)
		return
	}
	defer up.Close()
	ev.Verdict, ev.Reason = VerdictAllowed, why
	splice(c, rc, up)
}

// intercept terminates a client's TLS to name with a leaf from the CA and
// serves the HTTP/1.1 requests inside: each is checked like any other
// request, gets the sandbox's secrets for name injected, and is sent over
// TLS to name:port (verified against [ProxyConfig.UpstreamRoots]). A
// request whose Host header names another host is refused, so that a
// secret cannot be sent to a different virtual host of the same server
// (domain fronting). A client whose SNI differs from name is refused
// during the handshake. ev is the outer event: allowed once the handshake
// succeeded, with no bytes; each request emits its own.
func (p *Proxy) intercept(ctx context.Context, c net.Conn, client netip.Addr, name string, port uint16, mode string, ev *Event) {
	ev.Intercepted = true
	cert, err := p.cfg.CA.CertFor(name)
	if err != nil {
		ev.Verdict, ev.Reason = VerdictRefused, "tls interception: "+oneLine(err.Error())
		resetConn(c)
		return
	}
	tc := tls.Server(c, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(chi *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if chi.ServerName != "" && normalizeHost(chi.ServerName) != name {
				return nil, errors.New("server name " + strconv.Quote(oneLine(chi.ServerName)) + " does not match " + name)
			}
			return cert, nil
		},
	})
	_ = c.SetDeadline(time.Now().Add(interceptHandshakeTimeout))
	if err := tc.HandshakeContext(ctx); err != nil {
		ev.Verdict, ev.Reason = VerdictRefused, "tls interception: client handshake: "+oneLine(err.Error())
		resetConn(c)
		return
	}
	_ = c.SetDeadline(time.Time{})
	ev.Verdict = VerdictAllowed
	if ev.Reason != "" {
		ev.Reason += "; "
	}
	ev.Reason += "intercepted for secret injection"
	p.serveHTTPConn(ctx, tc, &connHandler{p: p, client: client, mode: mode, tls: true, name: name, port: port})
}

// connHandler serves the HTTP requests of one redirected plain-HTTP
// connection or one intercepted TLS connection.
type connHandler struct {
	p      *Proxy
	client netip.Addr
	mode   string
	tls    bool   // intercepted TLS: every request goes to name:port
	name   string // intercepted TLS: the checked name
	port   uint16 // the port to use (plain HTTP: when Host has none)
	// first is set until the first request of a redirected plain-HTTP
	// connection, which the connection itself was counted for.
	first atomic.Bool
}

// ServeHTTP handles one request read from the connection.
func (h *connHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := h.p
	start := time.Now()
	ev := Event{Mode: h.mode, Method: r.Method, Intercepted: h.tls, Verdict: VerdictRefused}
	defer func() {
		ev.Duration = time.Since(start)
		p.emit(ev)
	}()
	refuse := func(status int, reason string) {
		ev.Verdict, ev.Reason = VerdictRefused, reason
		reason = oneLine(reason)
		refusalHeaders(w, reason)
		w.WriteHeader(status)
		io.WriteString(w, "corral egress: refused: "+reason+"\n")
	}
	countIt := !h.first.Swap(false)

	var host string
	var port uint16
	if h.tls {
		host, port = h.name, h.port
		ev.Host, ev.Port = host, int(port)
		if !sameHost(r.Host, h.name, h.port) {
			refuse(http.StatusForbidden, "Host header "+strconv.Quote(oneLine(r.Host))+" does not match the TLS server name "+h.name)
			return
		}
	} else {
		if r.Host == "" {
			refuse(http.StatusBadRequest, "missing Host header")
			return
		}
		var err error
		host, port, err = splitHostPort(r.Host, h.port)
		ev.Host, ev.Port = host, int(port)
		if err != nil {
			refuse(http.StatusBadRequest, err.Error())
			return
		}
	}
	if r.Method == http.MethodConnect {
		refuse(http.StatusMethodNotAllowed, "CONNECT is only served by the explicit proxy")
		return
	}
	cl, ok := p.cfg.Client(h.client)
	if !ok {
		refuse(http.StatusForbidden, "connection from no known sandbox")
		return
	}
	ev.Sandbox = cl.ID
	if cl.Refused != "" {
		refuse(http.StatusForbidden, cl.Refused)
		return
	}
	if why := p.caps.admit(cl.ID, cl.Limits, p.now(), countIt); why != "" {
		refuse(http.StatusForbidden, why)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.DialTimeout)
	plan, why, rerr := p.plan(ctx, cl, host, port)
	cancel()
	if rerr != nil {
		refuse(rerr.status, rerr.reason)
		return
	}
	ev.Reason = why
	scheme := "http"
	if h.tls {
		scheme = "https"
	}
	p.forward(w, r, scheme, host, port, plan, cl.Secrets, &ev, refuse)
}

// sameHost reports whether a Host header names name (and port, if it has
// one).
func sameHost(hostHeader, name string, port uint16) bool {
	host, ps, err := net.SplitHostPort(hostHeader)
	if err != nil {
		host, ps = hostHeader, ""
	}
	if normalizeHost(host) != name {
		return false
	}
	return ps == "" || ps == strconv.Itoa(int(port))
}

// serveHTTPConn serves HTTP/1.1 on the single connection c with h, until
// the connection is closed. An http.Server does the framing (keep-alive,
// chunking, header limits, Expect: 100-continue).
func (p *Proxy) serveHTTPConn(ctx context.Context, c net.Conn, h http.Handler) {
	nc := &notifyConn{Conn: c, done: make(chan struct{})}
	ln := &oneConnListener{conn: nc, closed: make(chan struct{})}
	srv := &http.Server{
		Handler:           h,
		MaxHeaderBytes:    MaxHeaderBytes,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	_ = srv.Serve(ln)
	<-nc.done
}

// notifyConn closes done when the connection is closed.
type notifyConn struct {
	net.Conn
	once sync.Once
	done chan struct{}
}

// Close closes the connection and signals done.
func (c *notifyConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.done) })
	return err
}

// oneConnListener hands out one connection, then blocks until that
// connection or the listener is closed.
type oneConnListener struct {
	conn      *notifyConn
	taken     atomic.Bool
	closed    chan struct{}
	closeOnce sync.Once
}

// Accept returns the connection once, then waits for the end.
func (l *oneConnListener) Accept() (net.Conn, error) {
	if !l.taken.Swap(true) {
		return l.conn, nil
	}
	select {
	case <-l.conn.done:
	case <-l.closed:
	}
	return nil, net.ErrClosed
}

// Close wakes a waiting Accept.
func (l *oneConnListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return nil
}

// Addr is the connection's local address.
func (l *oneConnListener) Addr() net.Addr { return l.conn.LocalAddr() }

// ServeTransparentListener accepts on ln, finds each connection's original
// destination with [OriginalDst] and serves it with
// [Proxy.ServeTransparent]. A connection without one (it reached ln
// directly) is reset with a refused event. It returns nil when ln is
// closed or ctx is done (it then closes ln), and the error of a permanent
// Accept failure.
func (p *Proxy) ServeTransparentListener(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || ctx.Err() != nil {
				return nil
			}
			var te interface{ Temporary() bool }
			if errors.As(err, &te) && te.Temporary() {
				// EMFILE and the like: back off as net/http does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				p.log.Warn("egress: transparent accept", "err", oneLine(err.Error()), "retry_in", delay)
				select {
				case <-time.After(delay):
				case <-ctx.Done():
					return nil
				}
				continue
			}
			return err
		}
		delay = 0
		go func() {
			var orig netip.AddrPort
			var oerr error
			if tc, ok := c.(*net.TCPConn); ok {
				orig, oerr = OriginalDst(tc)
			} else {
				oerr = errors.New("egress: not a TCP connection")
			}
			if oerr != nil {
				p.refuseUnredirected(c, oerr)
				return
			}
			p.ServeTransparent(ctx, c, orig)
		}()
	}
}

// refuseUnredirected resets a connection that has no original destination.
func (p *Proxy) refuseUnredirected(c net.Conn, err error) {
	ev := Event{Mode: EventTransparent, Verdict: VerdictRefused, Reason: "no original destination: " + oneLine(err.Error())}
	if a, ok := addrOf(c.RemoteAddr()); ok {
		if cl, ok := p.cfg.Client(a); ok {
			ev.Sandbox = cl.ID
		}
	}
	p.emit(ev)
	resetConn(c)
}
