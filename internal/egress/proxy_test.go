package egress

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeResolver answers from a map; a name with several answer sets returns
// them in turn (the last one repeating), which models DNS rebinding.
type fakeResolver struct {
	mu    sync.Mutex
	names map[string][][]netip.Addr
	calls map[string]int
}

func (f *fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sets, ok := f.names[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	i := f.calls[host]
	f.calls[host]++
	if i >= len(sets) {
		i = len(sets) - 1
	}
	return sets[i], nil
}

func (f *fakeResolver) count(host string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[host]
}

// seen is one request the upstream received.
type seen struct {
	method, host, path, query string
	header                    http.Header
	body                      string
	tls                       bool
}

// egressEnv is the shared test world: upstream servers inside a test
// network namespace on 203.0.113.x (plain HTTP on port, HTTPS with its own
// test certificate on tlsPort, a raw TCP server that greets and echoes on
// rawPort), a listener on the host's 127.0.0.1 with each of those port
// numbers that must never be reached, and a fake resolver.
type egressEnv struct {
	ns       *testNetns
	port     uint16
	upstream netip.AddrPort
	res      *fakeResolver

	tlsPort     uint16
	tlsUpstream netip.AddrPort
	// upstreamRoots trusts the HTTPS upstream's certificate.
	upstreamRoots *x509.CertPool
	rawPort       uint16
	rawUpstream   netip.AddrPort

	mu   sync.Mutex
	reqs []seen

	hostAccepts atomic.Int64
	hostAddr    netip.AddrPort

	violations sync.Map // addresses the proxy tried to dial other than upstream
}

// rawGreeting is what the raw upstream sends on accept, before echoing.
const rawGreeting = "hello raw\n"

// bigSize is the size of the upstream's /big response.
const bigSize = 1 << 20

// upstreamNames are the names the HTTPS upstream's certificate covers.
var upstreamNames = []string{"allowed.test", "public.test", "secret.test", "other.test", "api.wild.test", "mixed.test", "rebind.test"}

// hostTrap listens on 127.0.0.1 on a free port, counting every connection
// (the proxy must never reach the host's loopback), and returns the port.
func (e *egressEnv) hostTrap(t *testing.T) netip.AddrPort {
	t.Helper()
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hl.Close() })
	go func() {
		for {
			c, err := hl.Accept()
			if err != nil {
				return
			}
			e.hostAccepts.Add(1)
			c.Close()
		}
	}()
	return netip.MustParseAddrPort(hl.Addr().String())
}

func newEgressEnv(t *testing.T) *egressEnv {
	ns := newTestNetns(t)
	e := &egressEnv{ns: ns}

	e.hostAddr = e.hostTrap(t)
	e.port = e.hostAddr.Port()
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		e.mu.Lock()
		e.reqs = append(e.reqs, seen{r.Method, r.Host, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), string(body), r.TLS != nil})
		e.mu.Unlock()
		if r.URL.Path == "/big" {
			w.Header().Set("Content-Length", strconv.Itoa(bigSize))
			chunk := make([]byte, 32<<10)
			for i := 0; i < bigSize/len(chunk); i++ {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
			return
		}
		fmt.Fprintf(w, "hello from upstream %s", r.URL.Path)
	})

	e.upstream = netip.AddrPortFrom(ns.upstream, e.port)
	ul := ns.listen(t, e.upstream.String())
	srv := &http.Server{Handler: handler}
	go srv.Serve(ul)
	t.Cleanup(func() { srv.Close() })

	// HTTPS upstream with its own test CA.
	e.tlsPort = e.hostTrap(t).Port()
	e.tlsUpstream = netip.AddrPortFrom(ns.upstream, e.tlsPort)
	cert, roots := testServerCert(t, upstreamNames)
	e.upstreamRoots = roots
	tl := tls.NewListener(ns.listen(t, e.tlsUpstream.String()), &tls.Config{Certificates: []tls.Certificate{cert}})
	tsrv := &http.Server{Handler: handler}
	go tsrv.Serve(tl)
	t.Cleanup(func() { tsrv.Close() })

	// Raw TCP upstream: greets, then echoes.
	e.rawPort = e.hostTrap(t).Port()
	e.rawUpstream = netip.AddrPortFrom(ns.upstream, e.rawPort)
	rl := ns.listen(t, e.rawUpstream.String())
	go func() {
		for {
			c, err := rl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.WriteString(c, rawGreeting)
				io.Copy(c, c)
			}()
		}
	}()

	up := ns.upstream
	e.res = &fakeResolver{
		names: map[string][][]netip.Addr{
			"allowed.test":  {{up}},
			"public.test":   {{up}},
			"secret.test":   {{up}},
			"other.test":    {{up}},
			"api.wild.test": {{up}},
			"rebind.test":   {{up}, {netip.MustParseAddr("127.0.0.1")}},
			"private.test":  {{netip.MustParseAddr("10.0.0.5")}},
			"meta.test":     {{netip.MustParseAddr("169.254.169.254")}},
			"loop.test":     {{netip.MustParseAddr("127.0.0.1")}},
			"mixed.test":    {{netip.MustParseAddr("10.0.0.5"), up}},
		},
		calls: map[string]int{},
	}
	return e
}

// testServerCert returns a certificate for names signed by a fresh test CA,
// and a pool trusting that CA.
func testServerCert(t *testing.T, names []string) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "egress test upstream CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

func (e *egressEnv) seenPath(path string) []seen {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []seen
	for _, s := range e.reqs {
		if s.path == path {
			out = append(out, s)
		}
	}
	return out
}

// proxyEvents collects a proxy's events.
type proxyEvents struct {
	mu     sync.Mutex
	events []Event
}

func (l *proxyEvents) add(ev Event) {
	l.mu.Lock()
	l.events = append(l.events, ev)
	l.mu.Unlock()
}

func (l *proxyEvents) all() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.events...)
}

// newProxy returns a proxy for sandbox client cl (whatever the source
// address), with the env's resolver and upstream roots, events collected,
// and the test dial guard. Fields of cfg other than Client, Resolver,
// OnEvent and UpstreamRoots are kept.
func (e *egressEnv) newProxy(t *testing.T, cl Client, cfg ProxyConfig) (*Proxy, *proxyEvents) {
	t.Helper()
	evs := &proxyEvents{}
	cfg.Client = func(netip.Addr) (Client, bool) { return cl, true }
	cfg.Resolver = e.res
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 3 * time.Second
	}
	cfg.UpstreamRoots = e.upstreamRoots
	cfg.OnEvent = evs.add
	p := NewProxy(cfg)
	// Test guard, after the policy check at dial time: nothing but the
	// namespace upstream may ever be connected to (never an address off
	// this machine, even if the policy check had a bug).
	p.dialGuard = func(ap netip.AddrPort) error {
		if ap.Addr() != e.upstream.Addr() {
			e.violations.Store(ap.String(), true)
			return errors.New("test guard: refusing to dial " + ap.String())
		}
		return nil
	}
	return p, evs
}

// serveExplicit serves p's explicit mode on 127.0.0.1 and returns the
// address.
func serveExplicit(t *testing.T, p *Proxy) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := p.Server("")
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// startProxy serves a proxy enforcing pol for sandbox "sb-1" on 127.0.0.1
// and returns its address and a function returning the events so far.
func (e *egressEnv) startProxy(t *testing.T, pol Policy) (*Proxy, string, func() []Event) {
	t.Helper()
	p, evs := e.newProxy(t, Client{ID: "sb-1", Policy: pol}, ProxyConfig{})
	return p, serveExplicit(t, p), evs.all
}

func (e *egressEnv) checkNoViolations(t *testing.T) {
	t.Helper()
	e.violations.Range(func(k, _ any) bool {
		t.Errorf("proxy tried to dial %v", k)
		return true
	})
	if n := e.hostAccepts.Load(); n != 0 {
		t.Errorf("host loopback listener accepted %d connections", n)
	}
}

// result is what a client saw.
type result struct {
	status  int
	refused string // X-Corral-Egress-Refused
	body    string
}

// viaHTTP sends an absolute-form GET through the proxy with proxy
// credentials and a hop-by-hop header that must not reach the upstream.
func viaHTTP(t *testing.T, proxyAddr, target string) result {
	t.Helper()
	pu := &url.URL{Scheme: "http", User: url.UserPassword("agent", "proxy-secret"), Host: proxyAddr}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(pu), DisableKeepAlives: true}}
	req, err := http.NewRequest("GET", target, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Hop", "1")
	req.Header.Set("Connection", "X-Hop")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s via proxy: %v", target, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{resp.StatusCode, resp.Header.Get("X-Corral-Egress-Refused"), string(b)}
}

// viaConnect opens a CONNECT tunnel to hostport and, when established, sends
// an HTTP GET for path through it.
func viaConnect(t *testing.T, proxyAddr, hostport, path string) result {
	t.Helper()
	c, err := net.DialTimeout("tcp", proxyAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic YWdlbnQ6cHJveHktc2VjcmV0\r\n\r\n", hostport, hostport)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil {
		t.Fatalf("CONNECT %s: %v", hostport, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return result{resp.StatusCode, resp.Header.Get("X-Corral-Egress-Refused"), string(b)}
	}
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, hostport)
	inner, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("GET over tunnel to %s: %v", hostport, err)
	}
	b, _ := io.ReadAll(inner.Body)
	inner.Body.Close()
	return result{inner.StatusCode, "", string(b)}
}

// waitEvents waits until n events were emitted.
func waitEvents(t *testing.T, events func() []Event, n int) []Event {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		evs := events()
		if len(evs) >= n || time.Now().After(deadline) {
			return evs
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestProxyEgress checks the explicit-mode proxy end to end (threat-model.md #9,
// #10): allowed names reach a real upstream over plain HTTP and CONNECT,
// while unlisted names, names resolving to private, loopback or metadata
// addresses, IP literals of the host, and every request under mode none are
// refused fast with a reason, without any connection being made.
func TestProxyEgress(t *testing.T) {
	e := newEgressEnv(t)
	port := strconv.Itoa(int(e.port))
	up := e.upstream.Addr().String()

	tests := []struct {
		name    string
		mode    string
		allow   []string
		connect bool   // CONNECT instead of plain HTTP
		host    string // host[:port]; "" port means the test port
		status  int
		reason  string // substring of the refusal reason / event reason
		reached bool   // the upstream must have seen the request
	}{
		{name: "allowed-http", mode: "allow", allow: []string{"allowed.test"}, host: "allowed.test", status: 200, reason: "allowed.test", reached: true},
		{name: "allowed-connect", mode: "allow", allow: []string{"allowed.test"}, connect: true, host: "allowed.test", status: 200, reason: "allowed.test", reached: true},
		{name: "wildcard-connect", mode: "allow", allow: []string{"*.wild.test"}, connect: true, host: "api.wild.test", status: 200, reason: "*.wild.test", reached: true},
		{name: "unlisted-http", mode: "allow", allow: []string{"allowed.test"}, host: "public.test", status: 403, reason: "not in the allowlist"},
		{name: "unlisted-connect", mode: "allow", allow: []string{"allowed.test"}, connect: true, host: "public.test", status: 403, reason: "not in the allowlist"},
		{name: "private-http", mode: "allow", allow: []string{"private.test"}, host: "private.test", status: 403, reason: "private 10.0.0.0/8"},
		{name: "private-connect", mode: "allow", allow: []string{"private.test"}, connect: true, host: "private.test", status: 403, reason: "private 10.0.0.0/8"},
		{name: "loopback-name", mode: "allow", allow: []string{"loop.test"}, connect: true, host: "loop.test", status: 403, reason: "loopback"},
		{name: "metadata-name", mode: "all-public", host: "meta.test", status: 403, reason: "cloud metadata 169.254.169.254"},
		{name: "mixed-dials-only-public", mode: "allow", allow: []string{"mixed.test"}, host: "mixed.test", status: 200, reason: "mixed.test", reached: true},
		{name: "ip-literal-loopback-connect", mode: "all-public", connect: true, host: "127.0.0.1:" + port, status: 403, reason: "loopback"},
		{name: "ip-literal-loopback-http", mode: "allow", allow: []string{"allowed.test"}, host: "127.0.0.1:" + port, status: 403, reason: "loopback"},
		{name: "ip-literal-unlisted", mode: "allow", allow: []string{"allowed.test"}, connect: true, host: up + ":" + port, status: 403, reason: "address not in the allowlist"},
		{name: "ip-literal-rule", mode: "allow", allow: []string{"203.0.113.0/24:" + port}, connect: true, host: up + ":" + port, status: 200, reason: "rule 203.0.113.0/24:" + port, reached: true},
		{name: "none-http", mode: "none", host: "allowed.test", status: 403, reason: "networking is off"},
		{name: "none-connect", mode: "none", connect: true, host: "allowed.test", status: 403, reason: "networking is off"},
		{name: "none-ip", mode: "none", connect: true, host: up + ":" + port, status: 403, reason: "networking is off"},
		{name: "exfil-name-http", mode: "allow", allow: []string{"*.wild.test"}, host: "6a6f686e3a68756e7465723240657861.wild.test", status: 403, reason: "exfiltration-shaped name"},
		{name: "exfil-name-connect", mode: "all-public", connect: true, host: "aGVsbG8gd29ybGQgdGhpcyBpcyBzZWNyZXQ.wild.test", status: 403, reason: "exfiltration-shaped name"},
		{name: "all-public-http", mode: "all-public", host: "allowed.test", status: 200, reason: "all-public", reached: true},
		{name: "all-public-connect", mode: "all-public", connect: true, host: "public.test", status: 200, reason: "all-public", reached: true},
		{name: "unresolvable", mode: "all-public", host: "nx.test", status: 502, reason: "cannot resolve"},
		{name: "upstream-closed-port", mode: "all-public", connect: true, host: "allowed.test:" + strconv.Itoa(int(e.closedPort())), status: 502, reason: "upstream"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pol, err := ParsePolicy(tc.mode, tc.allow)
			if err != nil {
				t.Fatal(err)
			}
			_, proxyAddr, events := e.startProxy(t, pol)
			hostport := tc.host
			if !strings.Contains(hostport, ":") {
				hostport += ":" + port
			}
			host, _, _ := net.SplitHostPort(hostport)
			path := "/" + tc.name
			var got result
			if tc.connect {
				got = viaConnect(t, proxyAddr, hostport, path)
			} else {
				got = viaHTTP(t, proxyAddr, "http://"+hostport+path)
			}

			if got.status != tc.status {
				t.Fatalf("status %d (refused %q, body %q), want %d", got.status, got.refused, got.body, tc.status)
			}
			if tc.status == 200 {
				if want := "hello from upstream " + path; got.body != want {
					t.Errorf("body %q, want %q", got.body, want)
				}
			} else {
				if !strings.Contains(got.refused, tc.reason) {
					t.Errorf("X-Corral-Egress-Refused %q, want it to contain %q", got.refused, tc.reason)
				}
				if want := "corral egress: refused " + host + ": "; !strings.HasPrefix(got.body, want) || !strings.HasSuffix(got.body, "\n") {
					t.Errorf("body %q, want prefix %q", got.body, want)
				}
			}

			seen := e.seenPath(path)
			if tc.reached {
				if len(seen) != 1 {
					t.Fatalf("upstream saw %d requests for %s, want 1", len(seen), path)
				}
				for _, h := range []string{"Proxy-Authorization", "X-Hop", "X-Forwarded-For", "Proxy-Connection"} {
					if v := seen[0].header.Get(h); v != "" {
						t.Errorf("upstream saw %s: %q", h, v)
					}
				}
			} else if len(seen) != 0 {
				t.Errorf("upstream saw %d requests for %s, want none", len(seen), path)
			}

			evs := waitEvents(t, events, 1)
			if len(evs) != 1 {
				t.Fatalf("got %d events, want 1: %+v", len(evs), evs)
			}
			ev := evs[0]
			wantVerdict := VerdictRefused
			if tc.status == 200 {
				wantVerdict = VerdictAllowed
			}
			if ev.Verdict != wantVerdict || !strings.Contains(ev.Reason, tc.reason) || ev.Sandbox != "sb-1" || ev.Host != host {
				t.Errorf("event %+v: want verdict %s, reason containing %q, sandbox sb-1, host %s", ev, wantVerdict, tc.reason, host)
			}
			wantMethod := "GET"
			if tc.connect {
				wantMethod = "CONNECT"
			}
			if ev.Method != wantMethod || ev.Port == 0 {
				t.Errorf("event %+v: want method %s and a port", ev, wantMethod)
			}
			if tc.reached {
				if ev.BytesUp == 0 || ev.BytesDown == 0 || ev.Addr != e.upstream.String() {
					t.Errorf("event %+v: want bytes both ways and addr %s", ev, e.upstream)
				}
			} else if tc.status == 403 && (ev.BytesUp != 0 || ev.BytesDown != 0) {
				t.Errorf("refused event %+v has bytes", ev)
			}
		})
	}
	e.checkNoViolations(t)
}

// TestProxyDNSRebinding checks threat-model.md #10: a name that resolves to a
// public address and then to 127.0.0.1. The proxy resolves once per attempt
// and dials exactly the addresses it checked, so the first request reaches
// the public upstream and the second, rebound, is refused before any dial;
// the host's loopback listener on the same port is never reached.
func TestProxyDNSRebinding(t *testing.T) {
	e := newEgressEnv(t)
	pol, err := ParsePolicy("allow", []string{"rebind.test"})
	if err != nil {
		t.Fatal(err)
	}
	_, proxyAddr, events := e.startProxy(t, pol)
	target := "http://rebind.test:" + strconv.Itoa(int(e.port)) + "/rebind"

	if got := viaHTTP(t, proxyAddr, target); got.status != 200 {
		t.Fatalf("first request: %+v, want 200 from the public upstream", got)
	}
	if n := e.res.count("rebind.test"); n != 1 {
		t.Fatalf("resolver called %d times for one request; the dial must not re-resolve", n)
	}
	got := viaHTTP(t, proxyAddr, target)
	if got.status != 403 || !strings.Contains(got.refused, "loopback") {
		t.Fatalf("rebound request: %+v, want 403 loopback", got)
	}
	// One event per request, each written when its request ends: the
	// allowed one (its connection closed) may come after the refusal.
	evs := waitEvents(t, events, 2)
	verdicts := map[string]int{}
	for _, ev := range evs {
		verdicts[ev.Verdict]++
	}
	if len(evs) != 2 || verdicts[VerdictAllowed] != 1 || verdicts[VerdictRefused] != 1 {
		t.Fatalf("events %+v, want one allowed and one refused", evs)
	}
	if len(e.seenPath("/rebind")) != 1 {
		t.Errorf("upstream saw %d requests, want 1", len(e.seenPath("/rebind")))
	}
	e.checkNoViolations(t)
}

// TestProxyDialTimeCheck checks the dial-time control hook on its own
// (threat-model.md #10): even when a loopback or metadata address reaches the
// dialer, as it would if a name were re-resolved between the check and the
// dial, the connect is refused before a packet is sent, and the host's
// loopback listener accepts nothing.
func TestProxyDialTimeCheck(t *testing.T) {
	e := newEgressEnv(t)
	pol, err := ParsePolicy("all-public", nil)
	if err != nil {
		t.Fatal(err)
	}
	p, _, _ := e.startProxy(t, pol)
	for _, a := range []netip.AddrPort{
		e.hostAddr,
		netip.MustParseAddrPort("[::ffff:127.0.0.1]:" + strconv.Itoa(int(e.port))),
		netip.MustParseAddrPort("169.254.169.254:80"),
	} {
		plan := &dialPlan{pol: pol, named: true, addrs: []netip.AddrPort{a}}
		c, err := p.dialPlan(context.Background(), plan)
		if err == nil {
			c.Close()
			t.Fatalf("dial %s succeeded", a)
		}
		var dr *dialRefused
		if !errors.As(err, &dr) {
			t.Fatalf("dial %s: %v, want a dial-time policy refusal", a, err)
		}
		if rf := dialError(err); rf.status != http.StatusForbidden {
			t.Errorf("dial %s maps to status %d, want 403", a, rf.status)
		}
	}
	// The public upstream passes the same hook.
	c, err := p.dialPlan(context.Background(), &dialPlan{pol: pol, named: true, addrs: []netip.AddrPort{e.upstream}})
	if err != nil {
		t.Fatalf("dial upstream: %v", err)
	}
	c.Close()
	e.checkNoViolations(t)
}

// TestProxyUnknownClient checks that a request the policy source does not
// recognise is refused, with an event.
func TestProxyUnknownClient(t *testing.T) {
	var got []Event
	p := NewProxy(ProxyConfig{
		Client:  func(netip.Addr) (Client, bool) { return Client{}, false },
		OnEvent: func(ev Event) { got = append(got, ev) },
	})
	w := &recorder{h: http.Header{}}
	r, _ := http.NewRequest("GET", "http://allowed.test/", nil)
	r.RemoteAddr = "198.51.100.9:4000"
	p.ServeHTTP(w, r)
	if w.status != 403 || w.h.Get("X-Corral-Egress-Refused") == "" {
		t.Fatalf("status %d header %v", w.status, w.h)
	}
	if len(got) != 1 || got[0].Verdict != VerdictRefused {
		t.Fatalf("events %+v", got)
	}
}

type recorder struct {
	h      http.Header
	status int
	body   strings.Builder
}

func (r *recorder) Header() http.Header         { return r.h }
func (r *recorder) WriteHeader(s int)           { r.status = s }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }

// TestProxyHeaderLimit checks that the server from Proxy.Server bounds
// request headers: an oversized header is answered 431 without reaching the
// proxy handler (no event).
func TestProxyHeaderLimit(t *testing.T) {
	var events atomic.Int64
	p := NewProxy(ProxyConfig{
		Client:  func(netip.Addr) (Client, bool) { return Client{}, false },
		OnEvent: func(Event) { events.Add(1) },
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := p.Server("")
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	go fmt.Fprintf(c, "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 2*MaxHeaderBytes))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("status %d, want 431", resp.StatusCode)
	}
	if events.Load() != 0 {
		t.Fatalf("oversized request reached the handler")
	}
}
