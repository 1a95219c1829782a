package egress

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Resolver resolves host names for the proxy. *net.Resolver satisfies it.
// The proxy never falls back to the system resolver: every name it dials is
// resolved through the configured Resolver.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// DefaultDialTimeout bounds name resolution plus connecting upstream when
// [ProxyConfig.DialTimeout] is zero.
const DefaultDialTimeout = 10 * time.Second

// DefaultFirstByteTimeout is how long a redirected connection may stay
// silent before the proxy stops waiting for a TLS ClientHello or an HTTP
// request line and treats it as raw TCP, when
// [ProxyConfig.FirstByteTimeout] is zero.
const DefaultFirstByteTimeout = 5 * time.Second

// UpstreamResponseTimeout bounds the wait for an upstream's response
// headers after the request was sent. It is long because model APIs answer
// non-streaming requests only when the whole completion is done.
const UpstreamResponseTimeout = 5 * time.Minute

// MaxHeaderBytes is the request header limit of the server returned by
// [Proxy.Server] (and of the servers reading redirected and intercepted
// HTTP), and the response header limit applied to upstreams.
const MaxHeaderBytes = 64 << 10

// Event verdicts.
const (
	// VerdictAllowed marks an attempt the proxy let through.
	VerdictAllowed = "allowed"
	// VerdictRefused marks an attempt the proxy refused or could not serve.
	VerdictRefused = "refused"
)

// Event modes: how the traffic reached the proxy.
const (
	// EventExplicit marks traffic the sandbox sent to the proxy as a proxy
	// (absolute-form http:// requests and CONNECT).
	EventExplicit = "explicit"
	// EventTransparent marks a redirected connection the proxy handled by
	// name: plain HTTP by its Host header, TLS by its SNI.
	EventTransparent = "transparent"
	// EventRaw marks a redirected connection the proxy handled by address
	// only (neither HTTP nor TLS with a name).
	EventRaw = "raw"
	// EventDNS marks a DNS query; it is for the DNS filter's events.
	EventDNS = "dns"
)

// Client is what the proxy knows about the sandbox behind a source address.
type Client struct {
	// ID is the sandbox id; caps are tracked per ID.
	ID string
	// Policy is the sandbox's egress policy.
	Policy Policy
	// Limits are the sandbox's caps; zero fields mean the defaults.
	Limits Limits
	// Secrets are the secrets this sandbox may use (already resolved by
	// the caller).
	Secrets []Secret
	// Refused, when set, is why nothing from this address may pass even
	// though the lookup knows something of it (a Pod that is not Running,
	// a policy store that cannot be read): every attempt is refused with
	// this reason and audited (with ID when it is known). It lets a
	// lookup fail closed with a reason instead of a bare "unknown".
	Refused string
}

// ProxyConfig configures a [Proxy].
type ProxyConfig struct {
	// Client identifies the sandbox behind a client source address
	// (unmapped, no zone). It is called on every request and every
	// redirected connection, so a policy, limit or secret change takes
	// effect on the next one. It returns false for an address that belongs
	// to no known sandbox; the proxy then refuses. Required.
	Client func(addr netip.Addr) (Client, bool)
	// Resolver resolves host names. Required for requests by name; when it
	// is nil every request by name is refused (the system resolver is never
	// used implicitly).
	Resolver Resolver
	// DialTimeout bounds resolution plus connecting upstream. Zero means
	// [DefaultDialTimeout].
	DialTimeout time.Duration
	// FirstByteTimeout bounds the wait for a redirected connection's first
	// bytes. Zero means [DefaultFirstByteTimeout].
	FirstByteTimeout time.Duration
	// UpstreamRoots verifies upstream servers when the proxy itself speaks
	// TLS to them (intercepted connections). Nil means the system roots.
	UpstreamRoots *x509.CertPool
	// CA, when set, lets the proxy intercept TLS to hosts for which the
	// sandbox has a [Secret], to inject it (the sandbox must trust
	// [CA.CertPEM]). When nil, TLS is never intercepted: HTTPS to a
	// secret's host is tunnelled as-is and no secret is injected into it.
	CA *CA
	// Log receives one line per attempt. Nil discards. Wrap the handler
	// with [NewSlogHandler] to redact secrets (the proxy never logs a
	// secret value itself).
	Log *slog.Logger
	// OnEvent, when set, is called once per attempt, allowed or refused,
	// after it has finished (for a refusal, before the client sees it),
	// except for refusals Summary counts instead.
	OnEvent func(Event)
	// Summary, when set, counts a sandbox's refusals past its rate
	// instead of logging and emitting each (see [Summarizer]).
	Summary *Summarizer
}

// Event records one egress attempt for the audit log: one plain HTTP
// request, one CONNECT tunnel, one redirected TLS or raw connection, or one
// request read from an intercepted TLS connection. It never contains a
// secret value.
type Event struct {
	// Sandbox is the id of the sandbox that asked ("" when unknown).
	Sandbox string
	// Mode is how the traffic reached the proxy: [EventExplicit],
	// [EventTransparent], [EventRaw] or [EventDNS].
	Mode string
	// Host is the requested host name or IP literal (the SNI for TLS, the
	// original destination address for raw TCP).
	Host string
	// Addr is the address dialed (or refused); "" when none was reached.
	Addr string
	// Port is the requested port.
	Port int
	// Method is the HTTP method ("CONNECT" for tunnels, "TLS" for a
	// redirected TLS connection, "TCP" for raw TCP).
	Method string
	// BytesUp counts bytes sent upstream (including HTTP framing for
	// plain requests, the raw payload for tunnels). For an intercepted
	// connection the outer event carries no bytes: each request read from
	// it has its own event.
	BytesUp int64
	// BytesDown counts bytes received from upstream.
	BytesDown int64
	// Duration is the time from receiving the request (or connection) to
	// the end of the response or tunnel.
	Duration time.Duration
	// Verdict is [VerdictAllowed] or [VerdictRefused].
	Verdict string
	// Reason is the policy rule that allowed the attempt, or why it was
	// refused or failed (a cap: [ReasonCapConns], [ReasonCapBytes],
	// [ReasonCapRate]).
	Reason string
	// Secrets names the secrets injected into the request (names only).
	Secrets []string
	// Intercepted is set for TLS the proxy terminated with its [CA] and
	// for the requests read from it.
	Intercepted bool
}

// Proxy is corral's per-host egress proxy, shared by all sandboxes, which
// it tells apart by the client's source address ([ProxyConfig.Client]).
// It defends against threat-model.md #9, #10, #20 and #21:
//
//   - explicit mode ([Proxy.Server], [Proxy.ServeHTTP]): absolute-form
//     "http://" requests and CONNECT tunnels;
//   - transparent mode ([Proxy.ServeTransparent],
//     [Proxy.ServeTransparentListener]): connections the host's nftables
//     redirected, handled by TLS SNI, HTTP Host or, failing both, by
//     address.
//
// In both it checks the sandbox's [Policy] on the requested name, resolves
// names itself through the configured [Resolver] and checks every address
// it dials at dial time; it enforces the sandbox's [Limits]; it injects the
// sandbox's [Secret]s into requests to their hosts; and it emits one
// [Event] per attempt.
type Proxy struct {
	cfg       ProxyConfig
	log       *slog.Logger
	transport *http.Transport
	caps      caps
	now       func() time.Time // for the request-rate window

	// conns maps an explicit-mode client connection (net.Conn) to its
	// *connSlot, from ConnContext until it is closed or its tunnel ends.
	conns sync.Map

	// dialGuard, when set (tests only), is called in the dial-time
	// control hook after the policy check passed, before connect(2).
	// Returning an error aborts the dial.
	dialGuard func(netip.AddrPort) error
}

// NewProxy returns a proxy with cfg. It panics if cfg.Client is nil.
func NewProxy(cfg ProxyConfig) *Proxy {
	if cfg.Client == nil {
		panic("egress: NewProxy: Client is required")
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.FirstByteTimeout <= 0 {
		cfg.FirstByteTimeout = DefaultFirstByteTimeout
	}
	p := &Proxy{cfg: cfg, log: cfg.Log, now: time.Now}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.transport = &http.Transport{
		// Never consult HTTP_PROXY of the host process.
		Proxy: nil,
		// Each request is checked and dialed on its own: no pooled
		// connection outlives the policy decision that opened it.
		DisableKeepAlives:      true,
		DisableCompression:     true,
		MaxResponseHeaderBytes: MaxHeaderBytes,
		ResponseHeaderTimeout:  UpstreamResponseTimeout,
		TLSHandshakeTimeout:    10 * time.Second,
		// HTTP/1.1 only (a custom dialer and TLS config disable HTTP/2);
		// the server name is the checked name from the request URL.
		TLSClientConfig: &tls.Config{RootCAs: cfg.UpstreamRoots, MinVersion: tls.VersionTLS12},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			d, ok := ctx.Value(dialKey{}).(*dialPlan)
			if !ok {
				return nil, errors.New("egress: no dial plan")
			}
			return p.dialPlan(ctx, d)
		},
	}
	return p
}

// Server returns an http.Server for explicit mode with bounded request
// headers ([MaxHeaderBytes]) and a 10 s limit on reading them. Bodies are
// streamed, never buffered whole. Its connection hooks count every client
// connection against the sandbox's [Limits.MaxConns]; requests on a
// connection opened over the cap are answered 403 "cap: connections".
func (p *Proxy) Server(addr string) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           p,
		MaxHeaderBytes:    MaxHeaderBytes,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelWarn),
		ConnContext:       p.connContext,
		ConnState:         p.connState,
	}
}

type connSlotKey struct{}

// connContext charges a new explicit-mode connection to its sandbox.
func (p *Proxy) connContext(ctx context.Context, c net.Conn) context.Context {
	slot := &connSlot{}
	if a, ok := addrOf(c.RemoteAddr()); ok {
		if cl, ok := p.cfg.Client(a); ok && cl.Refused == "" {
			slot = p.caps.acquireConn(cl.ID, cl.Limits)
		}
	}
	p.conns.Store(c, slot)
	return context.WithValue(ctx, connSlotKey{}, slot)
}

func (p *Proxy) connState(c net.Conn, s http.ConnState) {
	if s == http.StateClosed {
		p.releaseConn(c)
	}
}

// releaseConn gives back the slot of an explicit-mode connection (closed,
// or hijacked and its tunnel finished).
func (p *Proxy) releaseConn(c net.Conn) {
	if v, ok := p.conns.LoadAndDelete(c); ok {
		v.(*connSlot).release()
	}
}

// refusal is a policy refusal (answered 403) or an upstream failure.
type refusal struct {
	status int
	reason string
}

// Error returns the reason.
func (e *refusal) Error() string { return e.reason }

// dialRefused is returned by the dial-time control hook.
type dialRefused struct {
	addr   netip.AddrPort
	reason string
}

// Error names the address and the reason.
func (e *dialRefused) Error() string {
	return "egress: dial " + e.addr.String() + " refused: " + e.reason
}

type dialKey struct{}

// dialPlan is what to dial for one attempt: the addresses that passed the
// policy check, pinned, with the policy to re-check them against and the
// meter charging the bytes to the sandbox.
type dialPlan struct {
	pol    Policy
	named  bool
	addrs  []netip.AddrPort
	m      *meter       // nil: no byte cap
	dialed atomic.Value // string: the address connected, or last tried
	up     atomic.Int64
	down   atomic.Int64
}

func (d *dialPlan) dialedAddr() string {
	s, _ := d.dialed.Load().(string)
	return s
}

// capped reports whether the sandbox's byte cap cut this attempt.
func (d *dialPlan) capped() bool { return d.m != nil && d.m.cut.Load() }

// ServeHTTP handles one explicit-mode proxy request. The order of checks
// is: the request form, the client (unknown: 403), the connection cap, the
// byte and request-rate caps, then the policy on the name and on every
// resolved address ([Proxy.plan]), and at dial time once more on the
// address connected to.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ev := Event{Mode: EventExplicit, Method: r.Method, Verdict: VerdictRefused}
	defer func() {
		ev.Duration = time.Since(start)
		p.emit(ev)
	}()
	refuse := func(status int, reason string) {
		ev.Verdict, ev.Reason = VerdictRefused, reason
		p.refuse(w, status, ev.Host, reason)
	}

	var host string
	var port uint16
	var err error
	if r.Method == http.MethodConnect {
		host, port, err = splitHostPort(r.Host, 0)
	} else {
		if !r.URL.IsAbs() || r.URL.Scheme != "http" || r.URL.Host == "" {
			ev.Host = r.URL.Host
			refuse(http.StatusBadRequest, "not an absolute http:// proxy request (use CONNECT for https)")
			return
		}
		host, port, err = splitHostPort(r.URL.Host, 80)
	}
	ev.Host, ev.Port = host, int(port)
	if err != nil {
		refuse(http.StatusBadRequest, err.Error())
		return
	}

	addr, ok := addrOf(remoteAddr(r.RemoteAddr))
	var cl Client
	if ok {
		cl, ok = p.cfg.Client(addr)
	}
	if !ok {
		refuse(http.StatusForbidden, "request from no known sandbox")
		return
	}
	ev.Sandbox = cl.ID
	if cl.Refused != "" {
		refuse(http.StatusForbidden, cl.Refused)
		return
	}

	slot, _ := r.Context().Value(connSlotKey{}).(*connSlot)
	if slot == nil {
		// Served by a server other than Proxy.Server: hold a slot for
		// the duration of this attempt.
		slot = p.caps.acquireConn(cl.ID, cl.Limits)
		defer slot.release()
	}
	if slot.over {
		refuse(http.StatusForbidden, ReasonCapConns)
		return
	}
	if why := p.caps.admit(cl.ID, cl.Limits, p.now(), true); why != "" {
		refuse(http.StatusForbidden, why)
		return
	}

	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.DialTimeout)
	plan, reason, rerr := p.plan(ctx, cl, host, port)
	cancel()
	if rerr != nil {
		refuse(rerr.status, rerr.reason)
		return
	}
	ev.Reason = reason

	switch {
	case r.Method != http.MethodConnect:
		p.forward(w, r, "http", host, port, plan, cl.Secrets, &ev, refuse)
	case p.cfg.CA != nil && hasSecretFor(host, cl.Secrets):
		p.interceptConnect(w, r, addr, host, port, &ev, refuse)
	default:
		p.tunnel(w, r, plan, &ev, refuse)
	}
}

// plan checks host:port against the client's policy and resolves it,
// returning the addresses that may be dialed.
func (p *Proxy) plan(ctx context.Context, cl Client, host string, port uint16) (*dialPlan, string, *refusal) {
	pol := cl.Policy
	m := p.caps.meter(cl.ID, cl.Limits)
	if a, err := netip.ParseAddr(host); err == nil {
		// An IP literal is not a name: it must pass as a raw address.
		if a.Zone() != "" {
			return nil, "", &refusal{http.StatusForbidden, "zoned IPv6 addresses are not accepted"}
		}
		ok, why := pol.AllowsAddr(a, port, false)
		if !ok {
			return nil, "", &refusal{http.StatusForbidden, why}
		}
		return &dialPlan{pol: pol, named: false, m: m, addrs: []netip.AddrPort{netip.AddrPortFrom(a.Unmap(), port)}}, why, nil
	}
	ok, why := pol.AllowsName(host)
	if !ok {
		return nil, "", &refusal{http.StatusForbidden, why}
	}
	// The name itself can carry data out through the upstream resolver
	// (threat-model.md #8): judge it as the DNS filter does, before resolving.
	if bad, reason := ExfilSuspect(normalizeHost(host)); bad {
		return nil, "", &refusal{http.StatusForbidden, "exfiltration-shaped name: " + reason}
	}
	if p.cfg.Resolver == nil {
		return nil, "", &refusal{http.StatusBadGateway, "no resolver configured"}
	}
	addrs, err := p.cfg.Resolver.LookupNetIP(ctx, "ip", normalizeHost(host))
	if err != nil {
		return nil, "", &refusal{http.StatusBadGateway, "cannot resolve: " + oneLine(err.Error())}
	}
	if len(addrs) == 0 {
		return nil, "", &refusal{http.StatusBadGateway, "cannot resolve: no addresses"}
	}
	plan := &dialPlan{pol: pol, named: true, m: m}
	var firstDenied string
	for _, a := range addrs {
		if ok, aw := pol.AllowsAddr(a, port, true); ok {
			plan.addrs = append(plan.addrs, netip.AddrPortFrom(a.Unmap(), port))
		} else if firstDenied == "" {
			firstDenied = a.String() + ": " + aw
		}
	}
	if len(plan.addrs) == 0 {
		return nil, "", &refusal{http.StatusForbidden, "resolves to " + firstDenied}
	}
	return plan, why, nil
}

// dialPlan connects to the first reachable pinned address of d. The name is
// never resolved again here: the addresses are the ones checked. In
// addition, the control hook below re-checks the policy on the address the
// socket is actually about to connect to, just before connect(2). That is
// the last line against DNS rebinding (threat-model.md #10): an attacker's name
// that resolves to a public address when checked and to 127.0.0.1 or
// 169.254.169.254 when dialed cannot pass, whatever path (a future caller
// that dials by name, a transport that re-resolves, a bug in the pinning)
// led to that dial.
func (p *Proxy) dialPlan(ctx context.Context, d *dialPlan) (net.Conn, error) {
	dialer := &net.Dialer{
		Timeout: p.cfg.DialTimeout,
		ControlContext: func(_ context.Context, network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return &dialRefused{reason: "unparsable dial address " + strconv.Quote(address)}
			}
			if ok, why := d.pol.AllowsAddr(ap.Addr(), ap.Port(), d.named); !ok {
				return &dialRefused{addr: ap, reason: why}
			}
			if p.dialGuard != nil {
				return p.dialGuard(ap)
			}
			return nil
		},
	}
	var lastErr error
	for _, ap := range d.addrs {
		d.dialed.Store(ap.String())
		c, err := dialer.DialContext(ctx, "tcp", ap.String())
		if err == nil {
			return &countConn{Conn: c, up: &d.up, down: &d.down, m: d.m}, nil
		}
		lastErr = err
		var dr *dialRefused
		if errors.As(err, &dr) || ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

// dialError maps a dial error to a refusal.
func dialError(err error) *refusal {
	var dr *dialRefused
	if errors.As(err, &dr) {
		return &refusal{http.StatusForbidden, "at dial time: " + dr.reason}
	}
	return &refusal{http.StatusBadGateway, "upstream: " + oneLine(err.Error())}
}

// forward sends one request to scheme://host:port through plan and
// streams the response back. It injects the client's secrets for host
// into the request's headers (never for TRACE, which echoes the request);
// a plain-HTTP request carrying the placeholder of a secret allowed over
// TLS only is refused before anything is dialed
// ([ReasonSecretOverPlainHTTP]).
// A response cut short (the byte cap, an upstream or client failure)
// aborts the client connection, so that a truncated body never looks
// complete.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, scheme, host string, port uint16, plan *dialPlan, secrets []Secret, ev *Event, refuse func(int, string)) {
	defer func() {
		ev.Addr = plan.dialedAddr()
		ev.BytesUp, ev.BytesDown = plan.up.Load(), plan.down.Load()
		if plan.capped() {
			ev.Verdict, ev.Reason = VerdictRefused, ReasonCapBytes
		}
	}()
	ctx := context.WithValue(r.Context(), dialKey{}, plan)
	out := r.Clone(ctx)
	out.RequestURI = ""
	out.URL.Scheme = scheme
	out.URL.Host = net.JoinHostPort(normalizeHost(host), strconv.Itoa(int(port)))
	out.Host = r.Host
	out.Close = false
	stripHopByHop(out.Header)
	if _, ok := out.Header["User-Agent"]; !ok {
		// Keep Go's default User-Agent out of the upstream request.
		out.Header["User-Agent"] = []string{""}
	}
	if r.ContentLength == 0 {
		out.Body = nil
	}
	if r.Method != http.MethodTrace {
		injected, refused := injectSecrets(out.Header, host, secrets, scheme == "https")
		if len(refused) > 0 {
			refuse(http.StatusForbidden, ReasonSecretOverPlainHTTP+": "+strings.Join(refused, ", ")+" may be injected over TLS only")
			return
		}
		ev.Secrets = injected
	}
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		rf := dialError(err)
		if plan.capped() {
			rf = &refusal{http.StatusForbidden, ReasonCapBytes}
		}
		refuse(rf.status, rf.reason)
		return
	}
	defer resp.Body.Close()
	ev.Verdict = VerdictAllowed
	stripHopByHop(resp.Header)
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	if err := copyFlush(w, resp.Body); err != nil {
		ev.Reason += "; response copy: " + oneLine(err.Error())
		panic(http.ErrAbortHandler)
	}
}

// copyFlush copies an upstream body to the client, flushing after every
// read so that streamed responses (server-sent events) are not held back.
func copyFlush(w http.ResponseWriter, body io.Reader) error {
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if ferr := rc.Flush(); ferr != nil && !errors.Is(ferr, http.ErrNotSupported) {
				return ferr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// tunnel serves a CONNECT request as a byte tunnel.
func (p *Proxy) tunnel(w http.ResponseWriter, r *http.Request, plan *dialPlan, ev *Event, refuse func(int, string)) {
	defer func() {
		ev.Addr = plan.dialedAddr()
		ev.BytesUp, ev.BytesDown = plan.up.Load(), plan.down.Load()
		if plan.capped() {
			ev.Verdict, ev.Reason = VerdictRefused, ReasonCapBytes
		}
	}()
	hj, ok := w.(http.Hijacker)
	if !ok {
		refuse(http.StatusBadRequest, "connection cannot be hijacked (HTTP/2?)")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.DialTimeout)
	up, err := p.dialPlan(ctx, plan)
	cancel()
	if err != nil {
		rf := dialError(err)
		refuse(rf.status, rf.reason)
		return
	}
	defer up.Close()
	client, brw, err := hj.Hijack()
	if err != nil {
		ev.Reason = "hijack: " + oneLine(err.Error())
		return
	}
	defer p.releaseConn(client)
	defer client.Close()
	ev.Verdict = VerdictAllowed
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// Bytes the client sent after the CONNECT header may already sit in
	// the server's buffer.
	var src io.Reader = client
	if n := brw.Reader.Buffered(); n > 0 {
		src = io.MultiReader(io.LimitReader(brw.Reader, int64(n)), client)
	}
	splice(client, src, up)
}

// interceptConnect answers a CONNECT to a host the client has a secret for
// by terminating TLS itself ([Proxy.intercept]).
func (p *Proxy) interceptConnect(w http.ResponseWriter, r *http.Request, client netip.Addr, host string, port uint16, ev *Event, refuse func(int, string)) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		refuse(http.StatusBadRequest, "connection cannot be hijacked (HTTP/2?)")
		return
	}
	c, brw, err := hj.Hijack()
	if err != nil {
		ev.Reason = "hijack: " + oneLine(err.Error())
		return
	}
	defer p.releaseConn(c)
	defer c.Close()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		ev.Reason = "client gone: " + oneLine(err.Error())
		return
	}
	var conn net.Conn = c
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		conn = newPrefixConn(c, bytes.Clone(b))
	}
	p.intercept(r.Context(), conn, client, normalizeHost(host), port, EventExplicit, ev)
}

// splice copies both ways between the client and upstream. A clean EOF on
// one side is passed on as a half-close; an error on either side, or both
// sides finished, closes the tunnel. When the byte cap cuts the stream the
// client's connection is reset, so that it cannot take the cut for a
// normal end.
func splice(client net.Conn, clientR io.Reader, up net.Conn) {
	var once sync.Once
	closeBoth := func() { once.Do(func() { client.Close(); up.Close() }) }
	done := make(chan struct{}, 2)
	pipe := func(dst net.Conn, src io.Reader) {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 32<<10)
		_, err := io.CopyBuffer(dst, src, buf)
		if err != nil {
			if errors.Is(err, errByteCap) {
				resetConn(client)
			}
			closeBoth()
			return
		}
		if cw, ok := baseConn(dst).(interface{ CloseWrite() error }); ok {
			if cw.CloseWrite() == nil {
				return
			}
		}
		closeBoth()
	}
	go pipe(up, clientR)
	go pipe(client, up)
	<-done
	<-done
	closeBoth()
}

// baseConn returns the connection under the proxy's own wrappers.
func baseConn(c net.Conn) net.Conn {
	for {
		switch v := c.(type) {
		case *countConn:
			c = v.Conn
		case *prefixConn:
			c = v.Conn
		case *notifyConn:
			c = v.Conn
		case *tls.Conn:
			c = v.NetConn()
		default:
			return c
		}
	}
}

// resetConn closes c with an RST (SO_LINGER 0) when it is TCP, so that
// the peer sees ECONNRESET at once instead of an orderly end.
func resetConn(c net.Conn) {
	if tc, ok := baseConn(c).(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// refuse answers an explicit-mode refusal: status, a one-line text body
// and the reason in the X-Corral-Egress-Refused header.
func (p *Proxy) refuse(w http.ResponseWriter, status int, host, reason string) {
	reason = oneLine(reason)
	refusalHeaders(w, reason)
	w.WriteHeader(status)
	fmt.Fprintf(w, "corral egress: refused %s: %s\n", oneLine(host), reason)
}

func refusalHeaders(w http.ResponseWriter, reason string) {
	h := w.Header()
	for k := range h {
		delete(h, k)
	}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Corral-Egress-Refused", reason)
	h.Set("Connection", "close")
}

func (p *Proxy) emit(ev Event) {
	if !p.cfg.Summary.admit(ev) {
		return
	}
	level := slog.LevelInfo
	if ev.Verdict != VerdictAllowed {
		level = slog.LevelWarn
	}
	p.log.Log(context.Background(), level, "egress",
		"sandbox", ev.Sandbox, "mode", ev.Mode, "host", ev.Host, "addr", ev.Addr, "port", ev.Port,
		"method", ev.Method, "bytes_up", ev.BytesUp, "bytes_down", ev.BytesDown,
		"duration", ev.Duration, "verdict", ev.Verdict, "reason", ev.Reason,
		"secrets", strings.Join(ev.Secrets, ","), "intercepted", ev.Intercepted)
	if p.cfg.OnEvent != nil {
		p.cfg.OnEvent(ev)
	}
}

// remoteAddr parses an http.Request's RemoteAddr.
func remoteAddr(s string) net.Addr {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return nil
	}
	return net.TCPAddrFromAddrPort(ap)
}

// addrOf returns the unmapped, zoneless IP of a TCP or UDP address.
func addrOf(a net.Addr) (netip.Addr, bool) {
	var ap netip.AddrPort
	switch v := a.(type) {
	case *net.TCPAddr:
		ap = v.AddrPort()
	case *net.UDPAddr:
		ap = v.AddrPort()
	default:
		return netip.Addr{}, false
	}
	if !ap.Addr().IsValid() {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap().WithZone(""), true
}

// splitHostPort splits "host:port" (IPv6 in brackets); defPort is used when
// the port is absent and defPort is not 0.
func splitHostPort(hp string, defPort uint16) (string, uint16, error) {
	host, ps, err := net.SplitHostPort(hp)
	if err != nil {
		if defPort == 0 {
			return hp, 0, fmt.Errorf("bad host:port %q", hp)
		}
		host, ps = strings.TrimSuffix(strings.TrimPrefix(hp, "["), "]"), ""
	}
	if host == "" {
		return "", 0, errors.New("empty host")
	}
	if ps == "" {
		if defPort == 0 {
			return host, 0, errors.New("missing port")
		}
		return host, defPort, nil
	}
	n, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || n == 0 {
		return host, 0, fmt.Errorf("bad port %q", ps)
	}
	return host, uint16(n), nil
}

// hopByHop are the connection-level headers a proxy must not forward
// (RFC 9110 §7.6.1), plus the proxy credentials.
var hopByHop = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func stripHopByHop(h http.Header) {
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopByHop {
		h.Del(name)
	}
}

// oneLine makes s safe for a header value and a one-line body.
func oneLine(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 || c == 0x7f {
			b[i] = ' '
		}
	}
	if len(b) > 300 {
		b = append(b[:297], "..."...)
	}
	return string(b)
}
