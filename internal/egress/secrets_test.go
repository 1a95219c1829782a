package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// testSecretValue is the real credential of the tests; it must reach the
// upstream and nothing else.
const testSecretValue = "sk-live-9f8e7d6c5b4a3928170654"

func testSecret() Secret {
	return Secret{Name: "API_KEY", Hosts: []string{"secret.test"}, Header: "Authorization", Value: testSecretValue}
}

// TestValidSecretName checks the secret name syntax.
func TestValidSecretName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"API_KEY", true},
		{"a", true},
		{"openai_2", true},
		{strings.Repeat("A", 64), true},
		{"", false},
		{strings.Repeat("A", 65), false},
		{"API-KEY", false},
		{"api.key", false},
		{"KEY ", false},
		{"ключ", false},
	} {
		if err := ValidSecretName(tc.name); (err == nil) != tc.ok {
			t.Errorf("ValidSecretName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// TestSecretValidate checks Validate, and that its errors never contain
// the value.
func TestSecretValidate(t *testing.T) {
	good := testSecret()
	tests := []struct {
		name string
		mod  func(*Secret)
		ok   bool
	}{
		{"good", func(*Secret) {}, true},
		{"wildcard-host", func(s *Secret) { s.Hosts = []string{"*.openai.test"} }, true},
		{"bad-name", func(s *Secret) { s.Name = "a-b" }, false},
		{"no-hosts", func(s *Secret) { s.Hosts = nil }, false},
		{"ip-host", func(s *Secret) { s.Hosts = []string{"203.0.113.7"} }, false},
		{"star-host", func(s *Secret) { s.Hosts = []string{"*"} }, false},
		{"bad-header", func(s *Secret) { s.Header = "Auth orization" }, false},
		{"host-header", func(s *Secret) { s.Header = "host" }, false},
		{"empty-value", func(s *Secret) { s.Value = "" }, false},
		{"crlf-value", func(s *Secret) { s.Value = testSecretValue + "\r\nX-Evil: 1" }, false},
	}
	for _, tc := range tests {
		s := good
		s.Hosts = append([]string(nil), good.Hosts...)
		tc.mod(&s)
		err := s.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if err != nil && strings.Contains(err.Error(), testSecretValue) {
			t.Errorf("%s: error %q contains the value", tc.name, err)
		}
	}
}

// TestSecretNotPrinted checks that formatting or logging a Secret, or a
// Client holding one, never shows the value (threat-model.md #20).
func TestSecretNotPrinted(t *testing.T) {
	s := testSecret()
	cl := Client{ID: "sb", Secrets: []Secret{s}}
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	log.Info("x", "secret", s, "client", cl)
	slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "secret", s)
	out := fmt.Sprintf("%v %+v %#v %s %v %+v %#v", s, s, s, s, cl, cl, cl) + buf.String()
	if strings.Contains(out, testSecretValue) {
		t.Fatalf("value printed: %s", out)
	}
	if s.Placeholder() != "CORRAL_SECRET_API_KEY" {
		t.Fatalf("placeholder %q", s.Placeholder())
	}
}

// TestInjectSecrets checks the injection rule on headers: only for a
// matching host, only in the secret's header, every occurrence, whole
// placeholder tokens only.
func TestInjectSecrets(t *testing.T) {
	a := Secret{Name: "A", Hosts: []string{"api.test"}, Header: "Authorization", Value: "value-of-a"}
	ab := Secret{Name: "AB", Hosts: []string{"api.test"}, Header: "Authorization", Value: "value-of-ab"}
	wild := Secret{Name: "W", Hosts: []string{"*.wild.test"}, Header: "x-api-key", Value: "value-of-w"}
	bad := Secret{Name: "BAD", Hosts: []string{"api.test"}, Header: "Authorization", Value: "x\r\ny"}
	all := []Secret{a, ab, wild, bad}
	tests := []struct {
		name  string
		host  string
		in    http.Header
		want  http.Header
		names []string
	}{
		{"match", "api.test",
			http.Header{"Authorization": {"Bearer CORRAL_SECRET_A"}},
			http.Header{"Authorization": {"Bearer value-of-a"}}, []string{"A"}},
		{"host-case-and-dot", "API.test.",
			http.Header{"Authorization": {"Bearer CORRAL_SECRET_A"}},
			http.Header{"Authorization": {"Bearer value-of-a"}}, []string{"A"}},
		{"longest-name", "api.test",
			http.Header{"Authorization": {"CORRAL_SECRET_AB:CORRAL_SECRET_A,CORRAL_SECRET_ABC"}},
			http.Header{"Authorization": {"value-of-ab:value-of-a,CORRAL_SECRET_ABC"}}, []string{"AB", "A"}},
		{"every-occurrence-and-value", "api.test",
			http.Header{"Authorization": {"CORRAL_SECRET_A CORRAL_SECRET_A", "x CORRAL_SECRET_A"}},
			http.Header{"Authorization": {"value-of-a value-of-a", "x value-of-a"}}, []string{"A"}},
		{"other-host", "evil.test",
			http.Header{"Authorization": {"Bearer CORRAL_SECRET_A"}},
			http.Header{"Authorization": {"Bearer CORRAL_SECRET_A"}}, nil},
		{"suffix-is-not-subdomain", "notapi.test",
			http.Header{"Authorization": {"Bearer CORRAL_SECRET_A"}},
			http.Header{"Authorization": {"Bearer CORRAL_SECRET_A"}}, nil},
		{"other-header", "api.test",
			http.Header{"X-Other": {"CORRAL_SECRET_A"}, "Cookie": {"k=CORRAL_SECRET_A"}},
			http.Header{"X-Other": {"CORRAL_SECRET_A"}, "Cookie": {"k=CORRAL_SECRET_A"}}, nil},
		{"wildcard", "eu.wild.test",
			http.Header{"X-Api-Key": {"CORRAL_SECRET_W"}},
			http.Header{"X-Api-Key": {"value-of-w"}}, []string{"W"}},
		{"wildcard-apex", "wild.test",
			http.Header{"X-Api-Key": {"CORRAL_SECRET_W"}},
			http.Header{"X-Api-Key": {"CORRAL_SECRET_W"}}, nil},
		{"ip-host", "203.0.113.7",
			http.Header{"Authorization": {"CORRAL_SECRET_A"}},
			http.Header{"Authorization": {"CORRAL_SECRET_A"}}, nil},
		{"invalid-value-skipped", "api.test",
			http.Header{"Authorization": {"CORRAL_SECRET_BAD"}},
			http.Header{"Authorization": {"CORRAL_SECRET_BAD"}}, nil},
		{"secret-of-another-header", "api.test",
			http.Header{"X-Api-Key": {"CORRAL_SECRET_A"}},
			http.Header{"X-Api-Key": {"CORRAL_SECRET_A"}}, nil},
	}
	for _, tc := range tests {
		h := tc.in.Clone()
		names, refused := injectSecrets(h, tc.host, all, true)
		if !reflect.DeepEqual(h, tc.want) {
			t.Errorf("%s: headers %v, want %v", tc.name, h, tc.want)
		}
		if !reflect.DeepEqual(names, tc.names) || refused != nil {
			t.Errorf("%s: names %v refused %v, want %v and none refused", tc.name, names, refused, tc.names)
		}
	}
}

// TestInjectSecretsPlainHTTP checks the rule for a request that goes
// upstream over plain HTTP, against a credential crossing the network in
// clear text: a placeholder that would be replaced, of a secret not
// allowed over plain HTTP, makes the whole request refused with the
// secret's name and nothing replaced (not even the placeholders of
// secrets that are allowed); a secret marked AllowHTTP is injected as over
// TLS; a placeholder that would not be replaced (other host, other
// header) refuses nothing.
func TestInjectSecretsPlainHTTP(t *testing.T) {
	tlsOnly := Secret{Name: "T", Hosts: []string{"api.test"}, Header: "Authorization", Value: "value-of-t"}
	plain := Secret{Name: "P", Hosts: []string{"api.test"}, Header: "X-Api-Key", Value: "value-of-p", AllowHTTP: true}
	all := []Secret{tlsOnly, plain}
	tests := []struct {
		name           string
		host           string
		in, want       http.Header
		names, refused []string
	}{
		{"tls-only-refused", "api.test",
			http.Header{"Authorization": {"Bearer CORRAL_SECRET_T"}},
			http.Header{"Authorization": {"Bearer CORRAL_SECRET_T"}}, nil, []string{"T"}},
		{"allowed-injected", "api.test",
			http.Header{"X-Api-Key": {"CORRAL_SECRET_P"}},
			http.Header{"X-Api-Key": {"value-of-p"}}, []string{"P"}, nil},
		{"mixed-refused-whole", "api.test",
			http.Header{"Authorization": {"Bearer CORRAL_SECRET_T"}, "X-Api-Key": {"CORRAL_SECRET_P"}},
			http.Header{"Authorization": {"Bearer CORRAL_SECRET_T"}, "X-Api-Key": {"CORRAL_SECRET_P"}}, nil, []string{"T"}},
		{"other-host", "evil.test",
			http.Header{"Authorization": {"Bearer CORRAL_SECRET_T"}},
			http.Header{"Authorization": {"Bearer CORRAL_SECRET_T"}}, nil, nil},
		{"other-header", "api.test",
			http.Header{"X-Other": {"CORRAL_SECRET_T"}},
			http.Header{"X-Other": {"CORRAL_SECRET_T"}}, nil, nil},
		{"no-placeholder", "api.test",
			http.Header{"Authorization": {"Bearer abc"}},
			http.Header{"Authorization": {"Bearer abc"}}, nil, nil},
	}
	for _, tc := range tests {
		h := tc.in.Clone()
		names, refused := injectSecrets(h, tc.host, all, false)
		if !reflect.DeepEqual(h, tc.want) {
			t.Errorf("%s: headers %v, want %v", tc.name, h, tc.want)
		}
		if !reflect.DeepEqual(names, tc.names) || !reflect.DeepEqual(refused, tc.refused) {
			t.Errorf("%s: names %v refused %v, want %v and %v", tc.name, names, refused, tc.names, tc.refused)
		}
	}
}

// lockedBuffer is a goroutine-safe log sink.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// closedPort returns a port on which nothing listens in the namespace.
func (e *egressEnv) closedPort() uint16 {
	p := e.port + 1
	for p == e.tlsPort || p == e.rawPort || p == 0 {
		p++
	}
	return p
}

// explicitDo sends req through the explicit proxy at proxyAddr; roots, if
// set, are the client's TLS roots.
func explicitDo(t *testing.T, proxyAddr string, req *http.Request, roots *x509.CertPool) (*http.Response, string) {
	t.Helper()
	tr := &http.Transport{
		Proxy:             http.ProxyURL(&url.URL{Scheme: "http", Host: proxyAddr}),
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{RootCAs: roots},
	}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// secretRequest builds a request carrying the placeholder in the secret's
// header, in another header, in the query and in the body.
func secretRequest(t *testing.T, method, target string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, target+"?k=CORRAL_SECRET_API_KEY", strings.NewReader("body CORRAL_SECRET_API_KEY"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer CORRAL_SECRET_API_KEY")
	req.Header.Set("X-Other", "CORRAL_SECRET_API_KEY")
	return req
}

// checkInjected checks what the upstream saw for path: the real value in
// Authorization when injected, else the placeholder; the placeholder
// untouched in the other header, the query and the body.
func (e *egressEnv) checkInjected(t *testing.T, path string, injected, wantTLS bool) {
	t.Helper()
	s := e.seenPath(path)
	if len(s) != 1 {
		t.Fatalf("upstream saw %d requests for %s, want 1", len(s), path)
	}
	want := "Bearer CORRAL_SECRET_API_KEY"
	if injected {
		want = "Bearer " + testSecretValue
	}
	if got := s[0].header.Get("Authorization"); got != want {
		t.Errorf("upstream Authorization %q, want %q", got, want)
	}
	if got := s[0].header.Get("X-Other"); got != "CORRAL_SECRET_API_KEY" {
		t.Errorf("upstream X-Other %q: the placeholder must not be replaced outside the secret's header", got)
	}
	if s[0].method == "POST" && (s[0].query != "k=CORRAL_SECRET_API_KEY" || s[0].body != "body CORRAL_SECRET_API_KEY") {
		t.Errorf("upstream query %q body %q: the placeholder must not be replaced there", s[0].query, s[0].body)
	}
	if s[0].tls != wantTLS {
		t.Errorf("upstream TLS %v, want %v", s[0].tls, wantTLS)
	}
}

// TestInjectPlainHTTP checks secret injection (threat-model.md #20) for plain
// HTTP, explicit and redirected, of a secret the operator allowed over
// plain HTTP: the value replaces the placeholder in the secret's header
// for a listed host only; other hosts, other headers, the query, the body
// and TRACE requests keep the placeholder.
func TestInjectPlainHTTP(t *testing.T) {
	e := newEgressEnv(t)
	pol, _ := ParsePolicy("allow", []string{"secret.test", "other.test"})
	sec := testSecret()
	sec.AllowHTTP = true
	cl := Client{ID: "sb-s", Policy: pol, Secrets: []Secret{sec}}
	port := strconv.Itoa(int(e.port))

	t.Run("explicit", func(t *testing.T) {
		p, evs := e.newProxy(t, cl, ProxyConfig{})
		addr := serveExplicit(t, p)
		for i, tc := range []struct {
			host, method string
			injected     bool
		}{
			{"secret.test", "POST", true},
			{"other.test", "POST", false},
			{"secret.test", "TRACE", false},
		} {
			path := "/inject-explicit-" + strconv.Itoa(i)
			resp, body := explicitDo(t, addr, secretRequest(t, tc.method, "http://"+tc.host+":"+port+path), nil)
			if resp.StatusCode != 200 || strings.Contains(body, testSecretValue) {
				t.Fatalf("%s: %d %q", path, resp.StatusCode, body)
			}
			e.checkInjected(t, path, tc.injected, false)
			ev := lastEvent(t, evs, i+1)
			if wantNames := tc.injected; (len(ev.Secrets) == 1 && ev.Secrets[0] == "API_KEY") != wantNames {
				t.Errorf("%s: event secrets %v, injected=%v", path, ev.Secrets, tc.injected)
			}
		}
	})

	t.Run("transparent", func(t *testing.T) {
		p, evs := e.newProxy(t, cl, ProxyConfig{})
		c, _ := transparentConn(t, p, netip.AddrPortFrom(notDialed, e.port))
		br := bufio.NewReader(c)
		hdr := map[string]string{"Authorization": "Bearer CORRAL_SECRET_API_KEY", "X-Other": "CORRAL_SECRET_API_KEY"}
		for i, tc := range []struct {
			host     string
			injected bool
		}{{"secret.test", true}, {"other.test", false}} {
			path := "/inject-transparent-" + strconv.Itoa(i)
			if st, body, _ := sendHTTP(t, c, br, tc.host, path, hdr); st != 200 {
				t.Fatalf("%s: %d %q", path, st, body)
			}
			e.checkInjected(t, path, tc.injected, false)
			ev := lastEvent(t, evs, i+1)
			if (len(ev.Secrets) == 1) != tc.injected || ev.Mode != EventTransparent {
				t.Errorf("%s: event %+v", path, ev)
			}
		}
	})
	e.checkNoViolations(t)
}

// TestSecretRefusedOverPlainHTTP checks the defence against a brokered
// credential crossing the network in clear text: a plain-HTTP request
// (explicit or redirected) to a secret's host that carries the
// placeholder in the secret's header, for a secret not allowed over plain
// HTTP, is refused with 403 and the reason secret_over_plain_http naming
// the secret, before anything is dialed (the upstream sees no request),
// and recorded as a refused event without the value; the placeholder in
// another header, or to another host, goes out as before.
func TestSecretRefusedOverPlainHTTP(t *testing.T) {
	e := newEgressEnv(t)
	pol, _ := ParsePolicy("allow", []string{"secret.test", "other.test"})
	logs := &lockedBuffer{}
	cfg := ProxyConfig{Log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	cl := Client{ID: "sb-p", Policy: pol, Secrets: []Secret{testSecret()}}
	port := strconv.Itoa(int(e.port))
	checkRefused := func(t *testing.T, status int, refusedHdr, body string, ev Event, path string) {
		t.Helper()
		if status != http.StatusForbidden || !strings.HasPrefix(refusedHdr, ReasonSecretOverPlainHTTP+": API_KEY") {
			t.Errorf("%s: %d %q %q; want 403 %s naming API_KEY", path, status, refusedHdr, body, ReasonSecretOverPlainHTTP)
		}
		if n := len(e.seenPath(path)); n != 0 {
			t.Errorf("%s: upstream saw %d requests, want none", path, n)
		}
		if ev.Verdict != VerdictRefused || !strings.HasPrefix(ev.Reason, ReasonSecretOverPlainHTTP+": API_KEY") || ev.Addr != "" || len(ev.Secrets) != 0 {
			t.Errorf("%s: event %+v; want refused %s naming API_KEY, nothing dialed or injected", path, ev, ReasonSecretOverPlainHTTP)
		}
	}

	t.Run("explicit", func(t *testing.T) {
		p, evs := e.newProxy(t, cl, cfg)
		addr := serveExplicit(t, p)
		path := "/plain-explicit-refused"
		req := secretRequest(t, "POST", "http://secret.test:"+port+path)
		resp, body := explicitDo(t, addr, req, nil)
		checkRefused(t, resp.StatusCode, resp.Header.Get("X-Corral-Egress-Refused"), body, lastEvent(t, evs, 1), path)

		// The placeholder outside the secret's header, or to another
		// host, is not injected anywhere: it goes out unchanged.
		for i, tc := range []struct{ host, header string }{{"secret.test", "X-Other"}, {"other.test", "Authorization"}} {
			path := "/plain-explicit-passes-" + strconv.Itoa(i)
			req, _ := http.NewRequest("GET", "http://"+tc.host+":"+port+path, nil)
			req.Header.Set(tc.header, "CORRAL_SECRET_API_KEY")
			if resp, body := explicitDo(t, addr, req, nil); resp.StatusCode != 200 {
				t.Fatalf("%s: %d %q", path, resp.StatusCode, body)
			}
			s := e.seenPath(path)
			if len(s) != 1 || s[0].header.Get(tc.header) != "CORRAL_SECRET_API_KEY" {
				t.Errorf("%s: upstream saw %+v", path, s)
			}
		}
	})

	t.Run("transparent", func(t *testing.T) {
		p, evs := e.newProxy(t, cl, cfg)
		c, _ := transparentConn(t, p, netip.AddrPortFrom(notDialed, e.port))
		path := "/plain-transparent-refused"
		st, body, hdr := sendHTTP(t, c, bufio.NewReader(c), "secret.test", path, map[string]string{"Authorization": "Bearer CORRAL_SECRET_API_KEY"})
		checkRefused(t, st, hdr.Get("X-Corral-Egress-Refused"), body, lastEvent(t, evs, 1), path)
	})
	if strings.Contains(logs.String(), testSecretValue) {
		t.Error("the secret value is in the proxy log")
	}
	e.checkNoViolations(t)
}

// interceptProxy returns a proxy with a CA for the secret's host (the
// given secrets, by default testSecret()), and a pool trusting both the CA
// and the upstream's own test CA.
func (e *egressEnv) interceptProxy(t *testing.T, cfg ProxyConfig, secrets ...Secret) (*Proxy, *proxyEvents, *CA, *x509.CertPool) {
	t.Helper()
	if secrets == nil {
		secrets = []Secret{testSecret()}
	}
	ca, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg.CA = ca
	pol, _ := ParsePolicy("allow", []string{"secret.test", "other.test"})
	p, evs := e.newProxy(t, Client{ID: "sb-m", Policy: pol, Secrets: secrets}, cfg)
	roots := e.upstreamRoots.Clone()
	roots.AppendCertsFromPEM(ca.CertPEM())
	return p, evs, ca, roots
}

// TestInterceptExplicit checks secret injection into HTTPS through CONNECT
// (threat-model.md #20): with a CA, a CONNECT to a host the sandbox has a secret
// for is terminated with a leaf of the CA, the request inside gets the
// value, and goes on over TLS to the real upstream (verified with
// UpstreamRoots); a CONNECT to another host is a plain tunnel to the real
// upstream's certificate.
func TestInterceptExplicit(t *testing.T) {
	e := newEgressEnv(t)
	p, evs, _, roots := e.interceptProxy(t, ProxyConfig{})
	addr := serveExplicit(t, p)
	tlsPort := strconv.Itoa(int(e.tlsPort))

	resp, body := explicitDo(t, addr, secretRequest(t, "POST", "https://secret.test:"+tlsPort+"/mitm"), roots)
	if resp.StatusCode != 200 || body != "hello from upstream /mitm" {
		t.Fatalf("intercepted: %d %q", resp.StatusCode, body)
	}
	if iss := resp.TLS.PeerCertificates[0].Issuer.CommonName; !strings.HasPrefix(iss, "corral egress CA ") {
		t.Errorf("intercepted leaf issued by %q, want the corral CA", iss)
	}
	e.checkInjected(t, "/mitm", true, true)
	got := waitEvents(t, evs.all, 2)
	if len(got) != 2 {
		t.Fatalf("events %+v", got)
	}
	inner, outer := got[0], got[1]
	if inner.Method != "POST" || inner.Mode != EventExplicit || !inner.Intercepted || inner.Verdict != VerdictAllowed ||
		len(inner.Secrets) != 1 || inner.Addr != e.tlsUpstream.String() || inner.BytesDown == 0 {
		t.Errorf("inner event %+v", inner)
	}
	if outer.Method != "CONNECT" || !outer.Intercepted || outer.Verdict != VerdictAllowed || !strings.Contains(outer.Reason, "intercepted") || outer.BytesUp != 0 {
		t.Errorf("outer event %+v", outer)
	}

	resp, body = explicitDo(t, addr, secretRequest(t, "POST", "https://other.test:"+tlsPort+"/tunnel"), roots)
	if resp.StatusCode != 200 || body != "hello from upstream /tunnel" {
		t.Fatalf("tunnel: %d %q", resp.StatusCode, body)
	}
	if iss := resp.TLS.PeerCertificates[0].Issuer.CommonName; iss != "egress test upstream CA" {
		t.Errorf("tunnelled leaf issued by %q, want the upstream's own CA", iss)
	}
	e.checkInjected(t, "/tunnel", false, true)
	// The hijacked client connections gave their slots back.
	waitUsage(t, p, "sb-m", 0)
	e.checkNoViolations(t)
}

// TestInterceptTransparent checks injection into redirected TLS: the SNI
// names a host with a secret, so the proxy terminates TLS with its CA and
// injects; a request inside naming another host (domain fronting) is
// refused and nothing reaches the upstream.
func TestInterceptTransparent(t *testing.T) {
	e := newEgressEnv(t)
	p, evs, _, roots := e.interceptProxy(t, ProxyConfig{})
	c, _ := transparentConn(t, p, netip.AddrPortFrom(notDialed, e.tlsPort))
	tc := tls.Client(c, &tls.Config{ServerName: "secret.test", RootCAs: roots})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	if iss := tc.ConnectionState().PeerCertificates[0].Issuer.CommonName; !strings.HasPrefix(iss, "corral egress CA ") {
		t.Fatalf("leaf issued by %q", iss)
	}
	br := bufio.NewReader(tc)
	hdr := map[string]string{"Authorization": "Bearer CORRAL_SECRET_API_KEY", "X-Other": "CORRAL_SECRET_API_KEY"}
	if st, body, _ := sendHTTP(t, tc, br, "secret.test", "/mitm-t", hdr); st != 200 || body != "hello from upstream /mitm-t" {
		t.Fatalf("got %d %q", st, body)
	}
	e.checkInjected(t, "/mitm-t", true, true)
	st, body, _ := sendHTTP(t, tc, br, "other.test", "/fronted", hdr)
	if st != 403 || !strings.Contains(body, "does not match the TLS server name secret.test") {
		t.Fatalf("fronted request: %d %q, want 403", st, body)
	}
	if n := len(e.seenPath("/fronted")); n != 0 {
		t.Fatalf("upstream saw the fronted request")
	}
	tc.Close()
	got := waitEvents(t, evs.all, 3)
	if len(got) != 3 || got[0].Verdict != VerdictAllowed || len(got[0].Secrets) != 1 || got[1].Verdict != VerdictRefused ||
		got[2].Method != "TLS" || got[2].Mode != EventTransparent || !got[2].Intercepted {
		t.Fatalf("events %+v", got)
	}
	e.checkNoViolations(t)
}

// TestInterceptSNIMismatch checks that a client cannot CONNECT to the
// secret's host and then speak TLS for another name to the intercepting
// proxy.
func TestInterceptSNIMismatch(t *testing.T) {
	e := newEgressEnv(t)
	p, _, _, roots := e.interceptProxy(t, ProxyConfig{})
	addr := serveExplicit(t, p)
	c, br := dialProxy(t, addr)
	fmt.Fprintf(c, "CONNECT secret.test:%d HTTP/1.1\r\nHost: secret.test\r\n\r\n", e.tlsPort)
	resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	tc := tls.Client(c, &tls.Config{ServerName: "other.test", RootCAs: roots})
	if err := tc.Handshake(); err == nil {
		t.Fatal("handshake for another name succeeded")
	}
}

// TestInterceptWithoutCA checks the documented limit: without a CA, HTTPS
// to a secret's host is tunnelled as-is, so the upstream sees only the
// placeholder.
func TestInterceptWithoutCA(t *testing.T) {
	e := newEgressEnv(t)
	pol, _ := ParsePolicy("allow", []string{"secret.test"})
	p, _ := e.newProxy(t, Client{ID: "sb-n", Policy: pol, Secrets: []Secret{testSecret()}}, ProxyConfig{})
	addr := serveExplicit(t, p)
	resp, body := explicitDo(t, addr, secretRequest(t, "POST", "https://secret.test:"+strconv.Itoa(int(e.tlsPort))+"/noca"), e.upstreamRoots)
	if resp.StatusCode != 200 || body != "hello from upstream /noca" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	e.checkInjected(t, "/noca", false, true)
}

// TestSecretValueNeverLeaks checks threat-model.md #20 on the proxy's own
// output: during injecting requests (explicit HTTP, intercepted HTTPS,
// redirected HTTP) and failing ones (an upstream port that refuses), the
// secret's value appears in no log line (captured without redaction), no
// event and no response to the client, while the upstream did receive it.
// The secret is allowed over plain HTTP, so that the plain paths inject.
func TestSecretValueNeverLeaks(t *testing.T) {
	e := newEgressEnv(t)
	logs := &lockedBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	sec := testSecret()
	sec.AllowHTTP = true
	p, evs, _, roots := e.interceptProxy(t, ProxyConfig{Log: log}, sec)
	addr := serveExplicit(t, p)
	port, tlsPort, closed := strconv.Itoa(int(e.port)), strconv.Itoa(int(e.tlsPort)), strconv.Itoa(int(e.closedPort()))

	var client strings.Builder
	for _, target := range []string{
		"http://secret.test:" + port + "/leak-http",
		"https://secret.test:" + tlsPort + "/leak-https",
		"http://secret.test:" + closed + "/leak-closed",
		"https://secret.test:" + closed + "/leak-closed-tls",
	} {
		resp, body := explicitDo(t, addr, secretRequest(t, "POST", target), roots)
		fmt.Fprintf(&client, "%d %v %s\n", resp.StatusCode, resp.Header, body)
	}
	c, _ := transparentConn(t, p, netip.AddrPortFrom(notDialed, e.port))
	st, body, h := sendHTTP(t, c, bufio.NewReader(c), "secret.test", "/leak-transparent",
		map[string]string{"Authorization": "Bearer CORRAL_SECRET_API_KEY", "Connection": "close"})
	fmt.Fprintf(&client, "%d %v %s\n", st, h, body)

	for _, path := range []string{"/leak-http", "/leak-https", "/leak-transparent"} {
		s := e.seenPath(path)
		if len(s) != 1 || s[0].header.Get("Authorization") != "Bearer "+testSecretValue {
			t.Errorf("upstream did not receive the value for %s: %+v", path, s)
		}
	}
	got := waitEvents(t, evs.all, 7)
	refused := 0
	for _, ev := range got {
		if ev.Verdict == VerdictRefused {
			refused++
		}
	}
	if refused < 2 {
		t.Errorf("want the closed-port requests refused, events %+v", got)
	}
	for name, out := range map[string]string{
		"logs":   logs.String(),
		"events": fmt.Sprintf("%+v %#v", got, got),
		"client": client.String(),
	} {
		if strings.Contains(out, testSecretValue) {
			t.Errorf("secret value found in %s:\n%s", name, out)
		}
	}
	if !strings.Contains(logs.String(), "secrets=API_KEY") {
		t.Errorf("logs do not name the injected secret:\n%s", logs.String())
	}
}
