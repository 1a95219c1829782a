package egress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/corralhq/corral/internal/ratelimit"
)

// Limits and defaults of the [DNSFilter].
const (
	// DefaultDNSTTL is the TTL of answers when [DNSFilterConfig.TTL] is 0.
	// It is short so that a policy change takes effect soon in the sandbox's
	// caches.
	DefaultDNSTTL = 30
	// DefaultDNSRate and DefaultDNSBurst configure the per-sandbox query
	// limiter when [DNSFilterConfig.Limiter] is nil.
	DefaultDNSRate  = 20
	DefaultDNSBurst = 40
	// DNSUDPSize is the largest UDP message the filter reads and the EDNS0
	// payload size it advertises (the DNS Flag Day 2020 value, which avoids
	// IP fragmentation). Larger UDP answers are truncated (TC bit) by
	// miekg/dns so that the client retries over TCP.
	DNSUDPSize = 1232
	// DNSMaxAnswers is the most address records in one answer.
	DNSMaxAnswers = 16
	// DNSResolveTimeout bounds one upstream lookup.
	DNSResolveTimeout = 5 * time.Second
	// DNSMaxTCPConns is the most TCP connections served at once.
	DNSMaxTCPConns = 256
	// DNSMaxTCPQueries is the most queries on one TCP connection.
	DNSMaxTCPQueries = 128
	// dnsIOTimeout is the read/write timeout of a connection, and
	// dnsIdleTimeout how long a TCP connection may sit idle between queries.
	dnsIOTimeout   = 2 * time.Second
	dnsIdleTimeout = 8 * time.Second
)

// DNSFilterConfig configures a [DNSFilter].
type DNSFilterConfig struct {
	// Policy says who is asking, from the query's source address: the
	// sandbox's egress policy and its id. It returns false for an address
	// that belongs to no known sandbox; such queries are REFUSED. Required.
	Policy func(client netip.Addr) (Policy, string, bool)
	// Resolver resolves allowed names upstream. When nil, allowed names get
	// SERVFAIL (the system resolver is never used implicitly).
	Resolver Resolver
	// Limiter limits queries per sandbox id. Nil means
	// ratelimit.New(DefaultDNSRate, DefaultDNSBurst).
	Limiter *ratelimit.Keyed
	// TTL is the TTL of address records in answers. Zero means
	// [DefaultDNSTTL].
	TTL uint32
	// Log receives one line per query. Nil discards. Wrap the handler with
	// [NewSlogHandler] to redact secrets.
	Log *slog.Logger
	// OnEvent, when set, is called once per query, answered or refused,
	// except for refusals Summary counts instead.
	OnEvent func(Event)
	// Summary, when set, counts a sandbox's refusals past its rate
	// instead of logging and emitting each (see [Summarizer]).
	Summary *Summarizer
}

// DNSFilter is the DNS server a sandbox is given (threat-model.md #8). It
// answers only names the sandbox's [Policy] allows and never forwards
// anything else upstream. For each query, in order:
//
//  1. More or fewer than one question: FORMERR. A class other than IN:
//     REFUSED.
//  2. The client is identified by its source address through
//     [DNSFilterConfig.Policy]; an unknown client is REFUSED.
//  3. The sandbox's [ratelimit.Keyed] must admit the query (every query counts,
//     refused ones too, so probing is bounded as well); over the limit:
//     REFUSED.
//  4. Networking off (mode none): REFUSED.
//  5. [ExfilSuspect] flags the name: REFUSED, even if a wildcard pattern
//     would allow it.
//  6. [Policy.AllowsName] refuses the name: NXDOMAIN ("not in the
//     allowlist").
//  7. The type is not A or AAAA: REFUSED, for allowed names too. TXT, MX,
//     NULL, ANY and the rest carry data both ways and are the usual DNS
//     tunnel channels; a sandbox needs only addresses.
//  8. A and AAAA are resolved through [DNSFilterConfig.Resolver]. Every
//     address [Policy.AllowsAddr] refuses (private, loopback, link-local,
//     metadata, ...) is dropped from the answer. If none remain, the answer
//     is NOERROR with no records (NODATA), not REFUSED: the client fails at
//     once with "no address" for this family, and a dual-stack client can
//     still use the other family's answer. The event then says refused,
//     with the reason of the first dropped address. A name the upstream
//     does not know also gets NODATA; other upstream failures get SERVFAIL.
//
// Steps 1 to 7 never consult the upstream resolver. Every query that
// reaches the handler emits one [Event] (Sandbox, Host = the query name,
// Method = "DNS " + type, Addr = the answered addresses, Verdict, Reason)
// before the reply is sent, unless [DNSFilterConfig.Summary] counts it in
// a summary instead.
// Answers carry at most [DNSMaxAnswers] records with [DNSFilterConfig.TTL].
//
// DNSFilter is a [dns.Handler]; serve it with [DNSFilter.ListenAndServe]
// or [DNSFilter.Serve], which bound message sizes, timeouts and TCP
// connections.
type DNSFilter struct {
	cfg     DNSFilterConfig
	log     *slog.Logger
	limiter *ratelimit.Keyed
	ttl     uint32
	now     func() time.Time
}

// NewDNSFilter returns a filter with cfg. It panics if cfg.Policy is nil.
func NewDNSFilter(cfg DNSFilterConfig) *DNSFilter {
	if cfg.Policy == nil {
		panic("egress: NewDNSFilter: Policy is required")
	}
	f := &DNSFilter{cfg: cfg, log: cfg.Log, limiter: cfg.Limiter, ttl: cfg.TTL, now: time.Now}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	if f.limiter == nil {
		f.limiter = ratelimit.New(DefaultDNSRate, DefaultDNSBurst)
	}
	if f.ttl == 0 {
		f.ttl = DefaultDNSTTL
	}
	return f
}

// ServeDNS answers one query; see [DNSFilter] for the rules.
func (f *DNSFilter) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	start := f.now()
	ev := Event{Method: "DNS", Verdict: VerdictRefused}
	m := new(dns.Msg)
	m.SetReply(r)
	m.RecursionAvailable = true
	m.Compress = true

	rcode, addrs := f.answer(r, w.RemoteAddr(), &ev)
	m.Rcode = rcode
	if rcode == dns.RcodeFormatError || rcode == dns.RcodeNotImplemented {
		// SetReply copies a question we did not accept; do not echo it.
		m.Question = nil
	}
	var shown []string
	for _, a := range addrs {
		hdr := dns.RR_Header{Name: r.Question[0].Name, Class: dns.ClassINET, Ttl: f.ttl}
		if a.Is4() {
			hdr.Rrtype = dns.TypeA
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
		} else {
			hdr.Rrtype = dns.TypeAAAA
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
		}
		shown = append(shown, a.String())
	}
	ev.Addr = strings.Join(shown, ",")

	// Size: UDP answers must fit the client's buffer (512 without EDNS0);
	// Truncate drops records and sets TC so that the client retries over
	// TCP.
	size := dns.MaxMsgSize
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		size = dns.MinMsgSize
	}
	if opt := r.IsEdns0(); opt != nil {
		if udp := int(opt.UDPSize()); size != dns.MaxMsgSize && udp > size {
			size = min(udp, DNSUDPSize)
		}
		m.SetEdns0(DNSUDPSize, false)
	}
	m.Truncate(size)

	// The event is recorded before the reply is sent, so that the audit
	// log never lags behind what the sandbox has seen.
	ev.Duration = f.now().Sub(start)
	f.emit(ev, rcode)
	if err := w.WriteMsg(m); err != nil {
		f.log.Warn("dns reply not sent", "sandbox", ev.Sandbox, "name", ev.Host, "err", oneLineDNS(err.Error()))
	}
}

// answer decides one query: it fills ev's Sandbox, Host, Method, Verdict
// and Reason and returns the response code and the addresses to answer.
func (f *DNSFilter) answer(r *dns.Msg, remote net.Addr, ev *Event) (int, []netip.Addr) {
	if r.Opcode != dns.OpcodeQuery {
		ev.Reason = "opcode " + dns.OpcodeToString[r.Opcode] + " is not supported"
		return dns.RcodeNotImplemented, nil
	}
	if len(r.Question) != 1 {
		ev.Reason = fmt.Sprintf("%d questions in one query (want exactly 1)", len(r.Question))
		return dns.RcodeFormatError, nil
	}
	q := r.Question[0]
	ev.Host = normalizeHost(q.Name)
	ev.Method = "DNS " + typeString(q.Qtype)
	if q.Qclass != dns.ClassINET {
		ev.Reason = "class " + dns.Class(q.Qclass).String() + " is not served (IN only)"
		return dns.RcodeRefused, nil
	}

	client, ok := addrOf(remote)
	if !ok {
		ev.Reason = "unknown client"
		return dns.RcodeRefused, nil
	}
	pol, sandbox, ok := f.cfg.Policy(client)
	if !ok {
		ev.Reason = "unknown client " + client.String()
		return dns.RcodeRefused, nil
	}
	ev.Sandbox = sandbox
	if !f.limiter.Allow(sandbox, f.now()) {
		ev.Reason = "query rate limit exceeded"
		return dns.RcodeRefused, nil
	}
	if pol.Mode == "" || pol.Mode == ModeNone {
		ev.Reason = "networking is off"
		return dns.RcodeRefused, nil
	}
	if bad, why := ExfilSuspect(ev.Host); bad {
		ev.Reason = "suspected DNS exfiltration: " + why
		return dns.RcodeRefused, nil
	}
	allowed, why := pol.AllowsName(ev.Host)
	if !allowed {
		ev.Reason = why
		return dns.RcodeNameError, nil
	}
	var network string
	switch q.Qtype {
	case dns.TypeA:
		network = "ip4"
	case dns.TypeAAAA:
		network = "ip6"
	default:
		ev.Reason = "query type " + typeString(q.Qtype) + " is not served (A and AAAA only)"
		return dns.RcodeRefused, nil
	}
	if f.cfg.Resolver == nil {
		ev.Reason = "no resolver configured"
		return dns.RcodeServerFailure, nil
	}

	ctx, cancel := context.WithTimeout(context.Background(), DNSResolveTimeout)
	defer cancel()
	got, err := f.cfg.Resolver.LookupNetIP(ctx, network, ev.Host)
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			ev.Verdict, ev.Reason = VerdictAllowed, why+"; no such name upstream"
			return dns.RcodeSuccess, nil
		}
		ev.Reason = "cannot resolve: " + oneLineDNS(err.Error())
		return dns.RcodeServerFailure, nil
	}
	var keep []netip.Addr
	seen := map[netip.Addr]bool{}
	firstDenied := ""
	for _, a := range got {
		a = a.Unmap().WithZone("")
		if (network == "ip4") != a.Is4() || seen[a] {
			continue
		}
		seen[a] = true
		if ok, aw := pol.AllowsAddr(a, 0, true); !ok {
			if firstDenied == "" {
				firstDenied = a.String() + ": " + aw
			}
			continue
		}
		if len(keep) < DNSMaxAnswers {
			keep = append(keep, a)
		}
	}
	switch {
	case len(keep) > 0 && firstDenied != "":
		ev.Verdict, ev.Reason = VerdictAllowed, why+"; dropped "+firstDenied
	case len(keep) > 0:
		ev.Verdict, ev.Reason = VerdictAllowed, why
	case firstDenied != "":
		ev.Reason = "every address refused: " + firstDenied
	default:
		ev.Verdict, ev.Reason = VerdictAllowed, why+"; no "+network+" address upstream"
	}
	return dns.RcodeSuccess, keep
}

func (f *DNSFilter) emit(ev Event, rcode int) {
	ev.Mode = EventDNS
	if !f.cfg.Summary.admit(ev) {
		return
	}
	f.log.Info("dns query",
		"sandbox", ev.Sandbox, "name", ev.Host, "method", ev.Method,
		"rcode", dns.RcodeToString[rcode], "addr", ev.Addr,
		"verdict", ev.Verdict, "reason", ev.Reason, "duration", ev.Duration)
	if f.cfg.OnEvent != nil {
		f.cfg.OnEvent(ev)
	}
}

func typeString(t uint16) string {
	if s, ok := dns.TypeToString[t]; ok {
		return s
	}
	return fmt.Sprintf("TYPE%d", t)
}

// oneLineDNS flattens an error message for a reason and bounds its length.
func oneLineDNS(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// acceptDNS is the server's first check, on the header alone: responses
// are ignored, opcodes other than QUERY get NOTIMP, and messages with more
// records than a query has are rejected (FORMERR) before they are unpacked.
// A question count of 0 to 4 is let through so that the handler answers
// FORMERR itself and records the event.
func acceptDNS(dh dns.Header) dns.MsgAcceptAction {
	const qr = 1 << 15
	if dh.Bits&qr != 0 {
		return dns.MsgIgnore
	}
	if int(dh.Bits>>11)&0xF != dns.OpcodeQuery {
		return dns.MsgRejectNotImplemented
	}
	if dh.Qdcount > 4 || dh.Ancount > 0 || dh.Nscount > 0 || dh.Arcount > 2 {
		return dns.MsgReject
	}
	return dns.MsgAccept
}

// ListenAndServe serves the filter on addr ("host:port") over UDP and TCP
// until ctx is done. With port 0 the TCP port chosen is reused for UDP.
func (f *DNSFilter) ListenAndServe(ctx context.Context, addr string) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("egress: dns filter: %w", err)
	}
	pc, err := lc.ListenPacket(ctx, "udp", ln.Addr().String())
	if err != nil {
		ln.Close()
		return fmt.Errorf("egress: dns filter: %w", err)
	}
	return f.Serve(ctx, pc, ln)
}

// Serve serves the filter on pc (UDP) and ln (TCP), either of which may be
// nil, until ctx is done or one of them fails. It closes both before
// returning and returns nil when ctx ended it.
func (f *DNSFilter) Serve(ctx context.Context, pc net.PacketConn, ln net.Listener) error {
	type running struct {
		srv     *dns.Server
		started chan struct{}
		done    chan struct{}
		err     error
	}
	var rs []*running
	add := func(pc net.PacketConn, ln net.Listener) {
		r := &running{started: make(chan struct{}), done: make(chan struct{})}
		var once sync.Once
		r.srv = &dns.Server{
			PacketConn:        pc,
			Listener:          ln,
			Handler:           f,
			UDPSize:           DNSUDPSize,
			ReadTimeout:       dnsIOTimeout,
			WriteTimeout:      dnsIOTimeout,
			IdleTimeout:       func() time.Duration { return dnsIdleTimeout },
			MaxTCPQueries:     DNSMaxTCPQueries,
			MsgAcceptFunc:     acceptDNS,
			NotifyStartedFunc: func() { once.Do(func() { close(r.started) }) },
		}
		rs = append(rs, r)
	}
	if pc != nil {
		add(pc, nil)
	}
	if ln != nil {
		add(nil, newLimitListener(ln, DNSMaxTCPConns))
	}
	if len(rs) == 0 {
		return errors.New("egress: dns filter: nothing to serve on")
	}
	failed := make(chan struct{}, len(rs))
	for _, r := range rs {
		go func() {
			r.err = r.srv.ActivateAndServe()
			close(r.done)
			failed <- struct{}{}
		}()
	}
	stopped := false
	select {
	case <-ctx.Done():
		stopped = true
	case <-failed:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, r := range rs {
		select {
		case <-r.started:
			_ = r.srv.ShutdownContext(sctx)
		case <-r.done:
		}
	}
	var firstErr error
	for _, r := range rs {
		<-r.done
		if r.err != nil && firstErr == nil {
			firstErr = r.err
		}
	}
	if pc != nil {
		pc.Close()
	}
	if ln != nil {
		ln.Close()
	}
	if stopped {
		return nil
	}
	if firstErr == nil {
		firstErr = errors.New("server stopped")
	}
	return fmt.Errorf("egress: dns filter: %w", firstErr)
}

// limitListener accepts at most cap(sem) connections at once; further
// connections wait in the kernel's backlog. Close unblocks a waiting Accept.
type limitListener struct {
	net.Listener
	sem    chan struct{}
	closed chan struct{}
	once   sync.Once
}

func newLimitListener(ln net.Listener, n int) *limitListener {
	return &limitListener{Listener: ln, sem: make(chan struct{}, n), closed: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
