package egress

import (
	"context"
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

// MaxHeaderBytes is the request header limit of the server returned by
// [Proxy.Server], and the response header limit applied to upstreams.
const MaxHeaderBytes = 64 << 10

// Event verdicts.
const (
	// VerdictAllowed marks an attempt the proxy let through.
	VerdictAllowed = "allowed"
	// VerdictRefused marks an attempt the proxy refused or could not serve.
	VerdictRefused = "refused"
)

// ProxyConfig configures a [Proxy].
type ProxyConfig struct {
	// Policy says who is asking: the sandbox's egress policy and its id. It
	// returns false when the request comes from no known sandbox; the
	// proxy then refuses it. Required.
	Policy func(r *http.Request) (Policy, string, bool)
	// Resolver resolves host names. Required for requests by name; when it
	// is nil every request by name is refused (the system resolver is never
	// used implicitly).
	Resolver Resolver
	// DialTimeout bounds resolution plus connecting upstream. Zero means
	// [DefaultDialTimeout].
	DialTimeout time.Duration
	// Log receives one line per attempt. Nil discards. Wrap the handler
	// with [NewSlogHandler] to redact secrets.
	Log *slog.Logger
	// OnEvent, when set, is called once per request or tunnel, allowed or
	// refused, after it has finished.
	OnEvent func(Event)
}

// Event records one egress attempt (one plain HTTP request or one CONNECT
// tunnel) for the audit log.
type Event struct {
	// Sandbox is the id of the sandbox that asked ("" when unknown).
	Sandbox string
	// Host is the requested host name or IP literal.
	Host string
	// Addr is the address dialed (or refused); "" when none was reached.
	Addr string
	// Port is the requested port.
	Port int
	// Method is the HTTP method ("CONNECT" for tunnels).
	Method string
	// BytesUp counts bytes sent upstream (including HTTP framing for
	// plain requests, the raw tunnel payload for CONNECT).
	BytesUp int64
	// BytesDown counts bytes received from upstream.
	BytesDown int64
	// Duration is the time from receiving the request to the end of the
	// response or tunnel.
	Duration time.Duration
	// Verdict is [VerdictAllowed] or [VerdictRefused].
	Verdict string
	// Reason is the policy rule that allowed the attempt, or why it was
	// refused or failed.
	Reason string
}

// Proxy is the explicit-mode HTTP egress proxy (ATTACKS.md #9, #10): it
// serves absolute-form "http://" requests and CONNECT tunnels, checks the
// sandbox's [Policy] on the requested name and on every address it dials,
// resolves names itself through the configured [Resolver], and emits one
// [Event] per attempt. Serve it with [Proxy.Server].
type Proxy struct {
	cfg       ProxyConfig
	log       *slog.Logger
	transport *http.Transport

	// dialGuard, when set (tests only), is called in the dial-time
	// control hook after the policy check passed, before connect(2).
	// Returning an error aborts the dial.
	dialGuard func(netip.AddrPort) error
}

// NewProxy returns a proxy with cfg.
func NewProxy(cfg ProxyConfig) *Proxy {
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	p := &Proxy{cfg: cfg, log: cfg.Log}
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
		ResponseHeaderTimeout:  60 * time.Second,
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

// Server returns an http.Server for p with bounded request headers
// ([MaxHeaderBytes]) and a 10 s limit on reading them. Bodies are streamed,
// never buffered whole.
func (p *Proxy) Server(addr string) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           p,
		MaxHeaderBytes:    MaxHeaderBytes,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelWarn),
	}
}

// refusal is a policy refusal (answered 403) or an upstream failure.
type refusal struct {
	status int
	reason string
}

func (e *refusal) Error() string { return e.reason }

// dialRefused is returned by the dial-time control hook.
type dialRefused struct {
	addr   netip.AddrPort
	reason string
}

func (e *dialRefused) Error() string {
	return "egress: dial " + e.addr.String() + " refused: " + e.reason
}

type dialKey struct{}

// dialPlan is what to dial for one attempt: the addresses that passed the
// policy check, pinned, with the policy to re-check them against.
type dialPlan struct {
	pol    Policy
	named  bool
	addrs  []netip.AddrPort
	dialed atomic.Value // string: the address connected, or last tried
	up     atomic.Int64
	down   atomic.Int64
}

func (d *dialPlan) dialedAddr() string {
	s, _ := d.dialed.Load().(string)
	return s
}

// ServeHTTP handles one proxy request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ev := Event{Method: r.Method, Verdict: VerdictRefused}
	defer func() {
		ev.Duration = time.Since(start)
		p.emit(ev)
	}()

	var host string
	var port uint16
	var err error
	if r.Method == http.MethodConnect {
		host, port, err = splitHostPort(r.Host, 0)
	} else {
		if !r.URL.IsAbs() || r.URL.Scheme != "http" || r.URL.Host == "" {
			ev.Reason = "not an absolute http:// proxy request (use CONNECT for https)"
			p.refuse(w, http.StatusBadRequest, r.URL.Host, ev.Reason)
			return
		}
		host, port, err = splitHostPort(r.URL.Host, 80)
	}
	ev.Host, ev.Port = host, int(port)
	if err != nil {
		ev.Reason = err.Error()
		p.refuse(w, http.StatusBadRequest, host, ev.Reason)
		return
	}

	if p.cfg.Policy == nil {
		ev.Reason = "no policy source configured"
		p.refuse(w, http.StatusForbidden, host, ev.Reason)
		return
	}
	pol, sandbox, ok := p.cfg.Policy(r)
	ev.Sandbox = sandbox
	if !ok {
		ev.Reason = "request from no known sandbox"
		p.refuse(w, http.StatusForbidden, host, ev.Reason)
		return
	}

	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.DialTimeout)
	plan, reason, rerr := p.plan(ctx, pol, host, port)
	cancel()
	if rerr != nil {
		ev.Reason = rerr.reason
		p.refuse(w, rerr.status, host, rerr.reason)
		return
	}
	ev.Reason = reason

	if r.Method == http.MethodConnect {
		p.tunnel(w, r, plan, &ev)
	} else {
		p.forward(w, r, plan, &ev)
	}
}

// plan checks host:port against pol and resolves it, returning the
// addresses that may be dialed.
func (p *Proxy) plan(ctx context.Context, pol Policy, host string, port uint16) (*dialPlan, string, *refusal) {
	if a, err := netip.ParseAddr(host); err == nil {
		// An IP literal is not a name: it must pass as a raw address.
		if a.Zone() != "" {
			return nil, "", &refusal{http.StatusForbidden, "zoned IPv6 addresses are not accepted"}
		}
		ok, why := pol.AllowsAddr(a, port, false)
		if !ok {
			return nil, "", &refusal{http.StatusForbidden, why}
		}
		return &dialPlan{pol: pol, named: false, addrs: []netip.AddrPort{netip.AddrPortFrom(a, port)}}, why, nil
	}
	ok, why := pol.AllowsName(host)
	if !ok {
		return nil, "", &refusal{http.StatusForbidden, why}
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
	plan := &dialPlan{pol: pol, named: true}
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
// the last line against DNS rebinding (ATTACKS.md #10): an attacker's name
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
			return &countConn{Conn: c, up: &d.up, down: &d.down}, nil
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

// forward serves a plain http:// request.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, plan *dialPlan, ev *Event) {
	defer func() {
		ev.Addr = plan.dialedAddr()
		ev.BytesUp, ev.BytesDown = plan.up.Load(), plan.down.Load()
	}()
	ctx := context.WithValue(r.Context(), dialKey{}, plan)
	out := r.Clone(ctx)
	out.RequestURI = ""
	out.Host = r.URL.Host
	out.Close = false
	stripHopByHop(out.Header)
	if _, ok := out.Header["User-Agent"]; !ok {
		// Keep Go's default User-Agent out of the upstream request.
		out.Header["User-Agent"] = []string{""}
	}
	if r.ContentLength == 0 {
		out.Body = nil
	}
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		rf := dialError(err)
		ev.Verdict, ev.Reason = VerdictRefused, rf.reason
		p.refuse(w, rf.status, ev.Host, rf.reason)
		return
	}
	defer resp.Body.Close()
	ev.Verdict = VerdictAllowed
	stripHopByHop(resp.Header)
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	buf := make([]byte, 32<<10)
	if _, err := io.CopyBuffer(w, resp.Body, buf); err != nil {
		ev.Reason += "; response copy: " + oneLine(err.Error())
	}
}

// tunnel serves a CONNECT request.
func (p *Proxy) tunnel(w http.ResponseWriter, r *http.Request, plan *dialPlan, ev *Event) {
	defer func() {
		ev.Addr = plan.dialedAddr()
		ev.BytesUp, ev.BytesDown = plan.up.Load(), plan.down.Load()
	}()
	hj, ok := w.(http.Hijacker)
	if !ok {
		ev.Reason = "connection cannot be hijacked (HTTP/2?)"
		p.refuse(w, http.StatusBadRequest, ev.Host, ev.Reason)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.DialTimeout)
	up, err := p.dialPlan(ctx, plan)
	cancel()
	if err != nil {
		rf := dialError(err)
		ev.Reason = rf.reason
		p.refuse(w, rf.status, ev.Host, rf.reason)
		return
	}
	defer up.Close()
	client, brw, err := hj.Hijack()
	if err != nil {
		ev.Reason = "hijack: " + oneLine(err.Error())
		return
	}
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

// splice copies both ways between the client and upstream. A clean EOF on
// one side is passed on as a half-close; an error on either side, or both
// sides finished, closes the tunnel.
func splice(client net.Conn, clientR io.Reader, up net.Conn) {
	var once sync.Once
	closeBoth := func() { once.Do(func() { client.Close(); up.Close() }) }
	done := make(chan struct{}, 2)
	pipe := func(dst net.Conn, src io.Reader) {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 32<<10)
		_, err := io.CopyBuffer(dst, src, buf)
		if err != nil {
			closeBoth()
			return
		}
		if cw, ok := unwrap(dst).(interface{ CloseWrite() error }); ok {
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

func unwrap(c net.Conn) net.Conn {
	if cc, ok := c.(*countConn); ok {
		return cc.Conn
	}
	return c
}

// countConn counts bytes written (up) and read (down).
type countConn struct {
	net.Conn
	up, down *atomic.Int64
}

func (c *countConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.down.Add(int64(n))
	return n, err
}

// Write counts before writing: the upstream may answer, and the proxy read
// that answer, before this goroutine runs again after the write.
func (c *countConn) Write(b []byte) (int, error) {
	c.up.Add(int64(len(b)))
	n, err := c.Conn.Write(b)
	if n < len(b) {
		c.up.Add(int64(n - len(b)))
	}
	return n, err
}

// refuse answers a refusal: status, a one-line text body and the reason in
// the X-Corral-Egress-Refused header.
func (p *Proxy) refuse(w http.ResponseWriter, status int, host, reason string) {
	reason = oneLine(reason)
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Corral-Egress-Refused", reason)
	h.Set("Connection", "close")
	w.WriteHeader(status)
	fmt.Fprintf(w, "corral egress: refused %s: %s\n", oneLine(host), reason)
}

func (p *Proxy) emit(ev Event) {
	level := slog.LevelInfo
	if ev.Verdict != VerdictAllowed {
		level = slog.LevelWarn
	}
	p.log.Log(context.Background(), level, "egress",
		"sandbox", ev.Sandbox, "host", ev.Host, "addr", ev.Addr, "port", ev.Port,
		"method", ev.Method, "bytes_up", ev.BytesUp, "bytes_down", ev.BytesDown,
		"duration", ev.Duration, "verdict", ev.Verdict, "reason", ev.Reason)
	if p.cfg.OnEvent != nil {
		p.cfg.OnEvent(ev)
	}
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
