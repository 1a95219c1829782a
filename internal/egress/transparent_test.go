package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// notDialed is the original destination given to connections the proxy
// must handle by name: it is outside the test namespace, so the test dial
// guard records a violation if the proxy ever dials it.
var notDialed = netip.MustParseAddr("192.0.2.1")

// transparentConn connects a client to p.ServeTransparent over loopback
// TCP, with orig as the original destination, and returns the client side
// and a channel closed when ServeTransparent has returned.
func transparentConn(t *testing.T, p *Proxy, orig netip.AddrPort) (net.Conn, <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.ServeTransparent(context.Background(), s, orig)
	}()
	t.Cleanup(func() {
		c.Close()
		<-done
	})
	// A bound on a broken test, not an assertion on speed.
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return c, done
}

// expectReset reads from c until it fails and checks that the failure is
// a reset (ECONNRESET), not an orderly close or a timeout.
func expectReset(t *testing.T, c net.Conn) {
	t.Helper()
	buf := make([]byte, 4096)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("read: %v, want ECONNRESET", err)
		}
		return
	}
}

// onlyEvent waits for exactly one event and returns it.
func onlyEvent(t *testing.T, evs *proxyEvents) Event {
	t.Helper()
	got := waitEvents(t, evs.all, 1)
	if len(got) != 1 {
		t.Fatalf("got %d events, want 1: %+v", len(got), got)
	}
	return got[0]
}

// sendHTTP writes a GET with host and path on c and reads the response.
func sendHTTP(t *testing.T, c net.Conn, br *bufio.Reader, host, path string, hdr map[string]string) (int, string, http.Header) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "GET %s HTTP/1.1\r\nHost: %s\r\n", path, host)
	for k, v := range hdr {
		fmt.Fprintf(&b, "%s: %s\r\n", k, v)
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(c, b.String()); err != nil {
		t.Fatalf("write request: %v", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read response for %s%s: %v", host, path, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(body), resp.Header
}

// TestTransparentHTTP checks redirected plain HTTP (threat-model.md #9, #10):
// the proxy takes the name from the Host header, checks it and every
// resolved address, and dials the name itself, never the original
// destination; refusals are a 403 with "corral egress: refused: <reason>"
// after which the connection is closed.
func TestTransparentHTTP(t *testing.T) {
	e := newEgressEnv(t)
	port := strconv.Itoa(int(e.port))
	tests := []struct {
		name   string
		mode   string
		allow  []string
		host   string // Host header
		status int
		reason string
	}{
		{name: "allowed", mode: "allow", allow: []string{"allowed.test"}, host: "allowed.test:" + port, status: 200},
		{name: "allowed-port-from-orig", mode: "allow", allow: []string{"allowed.test"}, host: "allowed.test", status: 200},
		{name: "wildcard", mode: "allow", allow: []string{"*.wild.test"}, host: "API.wild.test:" + port, status: 200},
		{name: "unlisted", mode: "allow", allow: []string{"allowed.test"}, host: "public.test:" + port, status: 403, reason: "not in the allowlist"},
		{name: "private-name", mode: "allow", allow: []string{"private.test"}, host: "private.test:" + port, status: 403, reason: "private 10.0.0.0/8"},
		{name: "metadata-name", mode: "all-public", host: "meta.test", status: 403, reason: "cloud metadata 169.254.169.254"},
		{name: "loopback-literal", mode: "all-public", host: "127.0.0.1:" + port, status: 403, reason: "loopback"},
		{name: "rebind-first-public", mode: "allow", allow: []string{"rebind.test"}, host: "rebind.test:" + port, status: 200},
		{name: "all-public", mode: "all-public", host: "public.test:" + port, status: 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pol, err := ParsePolicy(tc.mode, tc.allow)
			if err != nil {
				t.Fatal(err)
			}
			p, evs := e.newProxy(t, Client{ID: "sb-t", Policy: pol}, ProxyConfig{})
			c, done := transparentConn(t, p, netip.AddrPortFrom(notDialed, e.port))
			br := bufio.NewReader(c)
			path := "/transparent-" + tc.name
			status, body, hdr := sendHTTP(t, c, br, tc.host, path, nil)
			if status != tc.status {
				t.Fatalf("status %d body %q, want %d", status, body, tc.status)
			}
			ev := onlyEvent(t, evs)
			if ev.Mode != EventTransparent || ev.Method != "GET" || ev.Sandbox != "sb-t" {
				t.Errorf("event %+v: want mode transparent, method GET, sandbox sb-t", ev)
			}
			if tc.status == 200 {
				if want := "hello from upstream " + path; body != want {
					t.Errorf("body %q, want %q", body, want)
				}
				if n := len(e.seenPath(path)); n != 1 {
					t.Errorf("upstream saw %d requests, want 1", n)
				}
				if ev.Verdict != VerdictAllowed || ev.Addr != e.upstream.String() || ev.BytesDown == 0 {
					t.Errorf("event %+v: want allowed via %s with bytes", ev, e.upstream)
				}
				return
			}
			want := "corral egress: refused: "
			if !strings.HasPrefix(body, want) || !strings.Contains(body, tc.reason) || !strings.HasSuffix(body, "\n") {
				t.Errorf("body %q, want %q<reason containing %q>\\n", body, want, tc.reason)
			}
			if ct := hdr.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
				t.Errorf("Content-Type %q", ct)
			}
			if ev.Verdict != VerdictRefused || !strings.Contains(ev.Reason, tc.reason) {
				t.Errorf("event %+v: want refused with %q", ev, tc.reason)
			}
			if len(e.seenPath(path)) != 0 {
				t.Errorf("upstream saw a refused request")
			}
			// The proxy closes the connection after a refusal.
			if _, err := br.ReadByte(); err != io.EOF {
				t.Errorf("after refusal: read %v, want EOF", err)
			}
			<-done
		})
	}
	e.checkNoViolations(t)
}

// TestTransparentHTTPKeepAlive checks that each request on one redirected
// connection is checked on its own: two allowed requests pass, a third to
// an unlisted name on the same connection is refused.
func TestTransparentHTTPKeepAlive(t *testing.T) {
	e := newEgressEnv(t)
	pol, _ := ParsePolicy("allow", []string{"allowed.test", "other.test"})
	p, evs := e.newProxy(t, Client{ID: "sb-k", Policy: pol}, ProxyConfig{})
	c, _ := transparentConn(t, p, netip.AddrPortFrom(notDialed, e.port))
	br := bufio.NewReader(c)
	for i, host := range []string{"allowed.test", "other.test"} {
		if st, body, _ := sendHTTP(t, c, br, host, "/ka"+strconv.Itoa(i), nil); st != 200 {
			t.Fatalf("request %d: %d %q", i, st, body)
		}
	}
	if st, body, _ := sendHTTP(t, c, br, "public.test", "/ka2", nil); st != 403 || !strings.Contains(body, "not in the allowlist") {
		t.Fatalf("third request: %d %q, want 403", st, body)
	}
	got := waitEvents(t, evs.all, 3)
	if len(got) != 3 || got[0].Verdict != VerdictAllowed || got[1].Verdict != VerdictAllowed || got[2].Verdict != VerdictRefused {
		t.Fatalf("events %+v", got)
	}
	if u := p.Usage("sb-k"); u.Requests != 3 {
		t.Errorf("usage %+v: want 3 requests (the connection counts for its first)", u)
	}
	e.checkNoViolations(t)
}

// TestTransparentTLS checks redirected TLS (threat-model.md #9, #10): the SNI
// is the name checked and dialed (at name:orig.Port, never orig's
// address), the ClientHello is replayed so that the client completes its
// handshake with the real upstream; an unlisted SNI or one resolving to a
// private address is reset; a ClientHello without SNI is raw TCP to orig.
func TestTransparentTLS(t *testing.T) {
	e := newEgressEnv(t)
	tlsPort := strconv.Itoa(int(e.tlsPort))
	tests := []struct {
		name    string
		mode    string
		allow   []string
		sni     string
		orig    netip.AddrPort
		ok      bool
		evMode  string
		reason  string
		evHost  string
		noCheck bool // client cannot verify the upstream (no SNI)
	}{
		{name: "allowed", mode: "allow", allow: []string{"allowed.test"}, sni: "allowed.test", orig: netip.AddrPortFrom(notDialed, e.tlsPort), ok: true, evMode: EventTransparent, reason: "allowed.test", evHost: "allowed.test"},
		{name: "wildcard", mode: "allow", allow: []string{"*.wild.test"}, sni: "api.wild.test", orig: netip.AddrPortFrom(notDialed, e.tlsPort), ok: true, evMode: EventTransparent, reason: "*.wild.test", evHost: "api.wild.test"},
		{name: "unlisted", mode: "allow", allow: []string{"allowed.test"}, sni: "public.test", orig: netip.AddrPortFrom(notDialed, e.tlsPort), evMode: EventTransparent, reason: "not in the allowlist", evHost: "public.test"},
		{name: "private", mode: "allow", allow: []string{"private.test"}, sni: "private.test", orig: netip.AddrPortFrom(notDialed, e.tlsPort), evMode: EventTransparent, reason: "private 10.0.0.0/8", evHost: "private.test"},
		{name: "loopback", mode: "all-public", sni: "loop.test", orig: netip.AddrPortFrom(notDialed, e.tlsPort), evMode: EventTransparent, reason: "loopback", evHost: "loop.test"},
		{name: "no-sni-refused", mode: "allow", allow: []string{"allowed.test"}, orig: e.tlsUpstream, evMode: EventRaw, reason: "address not in the allowlist", evHost: e.tlsUpstream.Addr().String(), noCheck: true},
		{name: "no-sni-rule", mode: "allow", allow: []string{"203.0.113.0/24:" + tlsPort}, orig: e.tlsUpstream, ok: true, evMode: EventRaw, reason: "rule 203.0.113.0/24:" + tlsPort, evHost: e.tlsUpstream.Addr().String(), noCheck: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pol, err := ParsePolicy(tc.mode, tc.allow)
			if err != nil {
				t.Fatal(err)
			}
			p, evs := e.newProxy(t, Client{ID: "sb-tls", Policy: pol}, ProxyConfig{})
			c, _ := transparentConn(t, p, tc.orig)
			cfg := &tls.Config{ServerName: tc.sni, RootCAs: e.upstreamRoots}
			if tc.noCheck {
				cfg.InsecureSkipVerify = true
			}
			tc2 := tls.Client(c, cfg)
			herr := tc2.Handshake()
			if !tc.ok {
				if herr == nil {
					t.Fatal("handshake succeeded, want a reset")
				}
				if !errors.Is(herr, syscall.ECONNRESET) {
					t.Fatalf("handshake: %v, want ECONNRESET", herr)
				}
			} else {
				if herr != nil {
					t.Fatalf("handshake: %v", herr)
				}
				path := "/tls-" + tc.name
				host := tc.sni
				if host == "" {
					host = "allowed.test"
				}
				st, body, _ := sendHTTP(t, tc2, bufio.NewReader(tc2), host, path, map[string]string{"Connection": "close"})
				if st != 200 || body != "hello from upstream "+path {
					t.Fatalf("got %d %q", st, body)
				}
				if s := e.seenPath(path); len(s) != 1 || !s[0].tls {
					t.Fatalf("upstream saw %+v, want one TLS request", s)
				}
				tc2.Close()
			}
			ev := onlyEvent(t, evs)
			wantVerdict := VerdictRefused
			if tc.ok {
				wantVerdict = VerdictAllowed
			}
			if ev.Verdict != wantVerdict || ev.Mode != tc.evMode || ev.Host != tc.evHost || !strings.Contains(ev.Reason, tc.reason) || ev.Port != int(e.tlsPort) {
				t.Errorf("event %+v: want %s, mode %s, host %s, reason with %q", ev, wantVerdict, tc.evMode, tc.evHost, tc.reason)
			}
			if tc.ok && (ev.Addr != e.tlsUpstream.String() || ev.BytesUp == 0 || ev.BytesDown == 0) {
				t.Errorf("event %+v: want addr %s and bytes", ev, e.tlsUpstream)
			}
		})
	}
	e.checkNoViolations(t)
}

// TestTransparentRaw checks redirected TCP that is neither HTTP nor TLS
// with a name (threat-model.md #9, #10): it reaches the original destination
// only when a CIDR rule (or all-public) allows that address; otherwise,
// and always for loopback and metadata addresses, the connection is reset
// at once.
func TestTransparentRaw(t *testing.T) {
	e := newEgressEnv(t)
	rawPort := strconv.Itoa(int(e.rawPort))
	tests := []struct {
		name   string
		mode   string
		allow  []string
		orig   netip.AddrPort
		send   string // "" sends nothing (server speaks first)
		ok     bool
		reason string
	}{
		{name: "rule", mode: "allow", allow: []string{"203.0.113.0/24:" + rawPort}, orig: e.rawUpstream, send: "\x00ping\n", ok: true, reason: "rule 203.0.113.0/24:" + rawPort},
		{name: "rule-any-port", mode: "allow", allow: []string{e.rawUpstream.Addr().String()}, orig: e.rawUpstream, send: "SSH-2.0-test\r\n", ok: true, reason: "rule "},
		{name: "silent-client", mode: "allow", allow: []string{"203.0.113.0/24"}, orig: e.rawUpstream, ok: true, reason: "rule 203.0.113.0/24"},
		{name: "all-public", mode: "all-public", orig: e.rawUpstream, send: "NICK x\r\n", ok: true, reason: "all-public"},
		{name: "wrong-port", mode: "allow", allow: []string{"203.0.113.0/24:1"}, orig: e.rawUpstream, send: "\x00ping\n", reason: "address not in the allowlist"},
		{name: "names-only", mode: "allow", allow: []string{"allowed.test"}, orig: e.rawUpstream, send: "\x00ping\n", reason: "address not in the allowlist"},
		{name: "loopback", mode: "all-public", orig: e.hostAddr, send: "\x00ping\n", reason: "loopback"},
		{name: "metadata", mode: "all-public", orig: netip.MustParseAddrPort("169.254.169.254:80"), send: "\x00ping\n", reason: "cloud metadata"},
		{name: "private", mode: "all-public", orig: netip.MustParseAddrPort("10.1.2.3:5432"), send: "\x00ping\n", reason: "private 10.0.0.0/8"},
		{name: "none", mode: "none", orig: e.rawUpstream, reason: "networking is off"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pol, err := ParsePolicy(tc.mode, tc.allow)
			if err != nil {
				t.Fatal(err)
			}
			p, evs := e.newProxy(t, Client{ID: "sb-raw", Policy: pol}, ProxyConfig{FirstByteTimeout: 20 * time.Millisecond})
			c, done := transparentConn(t, p, tc.orig)
			if tc.send != "" {
				io.WriteString(c, tc.send)
			}
			if !tc.ok {
				expectReset(t, c)
			} else {
				want := rawGreeting + tc.send
				got := make([]byte, len(want))
				if _, err := io.ReadFull(c, got); err != nil || string(got) != want {
					t.Fatalf("read %q, %v; want %q", got, err, want)
				}
				c.Close()
				<-done
			}
			ev := onlyEvent(t, evs)
			if ev.Mode != EventRaw || ev.Method != "TCP" || ev.Host != tc.orig.Addr().String() || ev.Port != int(tc.orig.Port()) || !strings.Contains(ev.Reason, tc.reason) {
				t.Errorf("event %+v: want raw TCP to %s with reason %q", ev, tc.orig, tc.reason)
			}
			if (ev.Verdict == VerdictAllowed) != tc.ok {
				t.Errorf("event verdict %s, want allowed=%v", ev.Verdict, tc.ok)
			}
		})
	}
	e.checkNoViolations(t)
}

// TestTransparentUnknownClient checks that a connection from an address
// the caller does not know is reset, with an event.
func TestTransparentUnknownClient(t *testing.T) {
	evs := &proxyEvents{}
	p := NewProxy(ProxyConfig{
		Client:  func(netip.Addr) (Client, bool) { return Client{}, false },
		OnEvent: evs.add,
	})
	c, _ := transparentConn(t, p, netip.MustParseAddrPort("192.0.2.1:80"))
	// Nothing is written: the reset comes before the proxy reads.
	expectReset(t, c)
	if ev := onlyEvent(t, evs); ev.Verdict != VerdictRefused || !strings.Contains(ev.Reason, "no known sandbox") {
		t.Fatalf("event %+v", ev)
	}
}

// TestClassifyStart checks protocol detection on the first bytes.
func TestClassifyStart(t *testing.T) {
	tests := []struct {
		in   string
		kind connKind
		ok   bool
	}{
		{"", kindRaw, false},
		{"\x16\x03\x01", kindTLS, true},
		{"G", kindRaw, false},
		{"GET", kindRaw, false},
		{"GET ", kindHTTP, true},
		{"GET /x HTTP/1.1", kindHTTP, true},
		{"PROPPATCH /", kindHTTP, true},
		{"GETX", kindRaw, true},
		{"get /", kindRaw, true},
		{"NICK x", kindRaw, true},
		{"SSH-2.0", kindRaw, true},
		{"\x00", kindRaw, true},
	}
	for _, tc := range tests {
		kind, ok := classifyStart([]byte(tc.in))
		if kind != tc.kind || ok != tc.ok {
			t.Errorf("classifyStart(%q) = %v, %v; want %v, %v", tc.in, kind, ok, tc.kind, tc.ok)
		}
	}
}

// TestOriginalDstNotRedirected checks that OriginalDst refuses a
// connection that was not redirected by nftables, so that a sandbox
// connecting to the proxy's port directly cannot make the proxy connect to
// itself. (Redirected connections are tested by the integration suite.)
func TestOriginalDstNotRedirected(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	orig, err := OriginalDst(s.(*net.TCPConn))
	if err == nil {
		t.Fatalf("OriginalDst = %v, want an error", orig)
	}
	if !errors.Is(err, ErrNotRedirected) {
		t.Fatalf("OriginalDst: %v, want ErrNotRedirected", err)
	}
}

// TestServeTransparentListener checks the accept loop: a connection made
// straight to the listener has no original destination and is reset with
// a refused event; closing the listener ends the loop with nil.
func TestServeTransparentListener(t *testing.T) {
	evs := &proxyEvents{}
	pol, _ := ParsePolicy("all-public", nil)
	p := NewProxy(ProxyConfig{
		Client:  func(netip.Addr) (Client, bool) { return Client{ID: "sb-l", Policy: pol}, true },
		OnEvent: evs.add,
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() { res <- p.ServeTransparentListener(context.Background(), l) }()
	c, err := net.Dial("tcp", l.Addr().String())
	switch {
	case errors.Is(err, syscall.ECONNRESET):
		// The reset came before connect(2) returned.
	case err != nil:
		t.Fatal(err)
	default:
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		expectReset(t, c)
	}
	ev := onlyEvent(t, evs)
	if ev.Verdict != VerdictRefused || ev.Sandbox != "sb-l" || !strings.Contains(ev.Reason, "no original destination") {
		t.Fatalf("event %+v", ev)
	}
	l.Close()
	if err := <-res; err != nil {
		t.Fatalf("ServeTransparentListener: %v", err)
	}
}
