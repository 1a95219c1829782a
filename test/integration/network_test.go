package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	corral "github.com/corralhq/corral/sdk/go"
)

// TestNetwork is the end-to-end battery of corral's network boundary
// (docs/network.md, docs/threat-model.md #8, #10, #20, #21):
// real servers, real runc sandboxes, real veth pairs and nftables rules,
// and an upstream in a network namespace this test creates on a
// documentation address (see netenv_test.go). The subtests share one
// fixture; each says in its doc comment what it proves. The battery runs
// under runc and under gVisor: a gVisor sandbox's traffic leaves its own
// network stack through the same veth pair and meets the same rules.
func TestNetwork(t *testing.T) { eachRuntime(t, testNetwork) }

func testNetwork(t *testing.T, rt string) {
	fx := newNetFixture(t)
	fx.runtime = rt
	t.Run("AllowedDomain", func(t *testing.T) { testNetAllowedDomain(t, fx) })
	t.Run("RefusedDomain", func(t *testing.T) { testNetRefusedDomain(t, fx) })
	t.Run("PrivateAddresses", func(t *testing.T) { testNetPrivateAddresses(t, fx) })
	t.Run("HostAddress", func(t *testing.T) { testNetHostAddress(t, fx) })
	t.Run("DNS", func(t *testing.T) { testNetDNS(t, fx) })
	t.Run("RawTCP", func(t *testing.T) { testNetRawTCP(t, fx) })
	t.Run("RuntimePolicyChange", func(t *testing.T) { testNetRuntimePolicyChange(t, fx) })
	t.Run("SecretInjection", func(t *testing.T) { testNetSecretInjection(t, fx) })
	t.Run("SecretTeams", func(t *testing.T) { testNetSecretTeams(t, fx) })
	t.Run("Caps", func(t *testing.T) { testNetCaps(t, fx) })
	t.Run("HostPlumbing", func(t *testing.T) { testNetHostPlumbing(t, fx) })
	t.Run("EnvSecretWarning", func(t *testing.T) { testNetEnvSecretWarning(t, fx) })
	t.Run("TemplatePackages", func(t *testing.T) { testNetTemplatePackages(t, fx) })
}

// randAlnum returns n random characters of [A-Za-z0-9].
func randAlnum(t *testing.T, n int) string {
	t.Helper()
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b := randBytes(t, n)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func portOf(tls bool) int {
	if tls {
		return 443
	}
	return 80
}

func schemeOf(tls bool) string {
	if tls {
		return "https"
	}
	return "http"
}

// testNetAllowedDomain proves that a sandbox with policy allow
// [allowed.test, *.exfil.test] reaches its upstream by name in each of
// the four ways a program can try: plain HTTP through HTTP_PROXY
// (explicit mode), plain HTTP without a proxy (redirected by nftables to
// the transparent proxy, which goes by the Host header), HTTPS through a
// CONNECT tunnel and HTTPS without a proxy (transparent, by SNI); and for
// a name matched by the wildcard. The upstream gets each request with the
// right Host and path, TLS stays end to end (curl verifies the upstream's
// own CA, which corral never sees), and each attempt leaves one allowed
// audit event of the right kind and method naming the address dialled
// (and a proxy log line saying explicit or transparent, as expected).
func testNetAllowedDomain(t *testing.T, fx *netFixture) {
	s := fx.srv
	sb := fx.newSandbox(t, s, corral.CreateOptions{Network: "allow", Allow: []string{hostAllowed, "*." + exfilZone}})
	up := fx.up.addr.String()

	env := runIn(t, sb, "echo \"$http_proxy $https_proxy\"")
	if !regexp.MustCompile(`^http://[0-9.]+:3128 http://[0-9.]+:3128\n$`).MatchString(env.Stdout) {
		t.Fatalf("proxy variables: %q, want http://<gateway>:3128 for both", env.Stdout)
	}

	ca := "--cacert " + upstreamCAPath
	cases := []struct {
		name   string
		args   string // curl options before the URL
		host   string
		path   string
		tls    bool
		kind   string // audit event kind
		method string // audit event method
		mode   string // the proxy's mode, as its log line says
	}{
		{"http explicit", "", hostAllowed, "/t1/http-explicit", false, "egress.http", "GET", "explicit"},
		{"http transparent", "--noproxy '*'", hostAllowed, "/t1/http-transparent", false, "egress.http", "GET", "transparent"},
		{"https connect", ca, hostAllowed, "/t1/https-connect", true, "egress.connect", "CONNECT", "explicit"},
		{"https transparent", "--noproxy '*' " + ca, hostAllowed, "/t1/https-transparent", true, "egress.connect", "TLS", "transparent"},
		{"wildcard http explicit", "", "sub." + exfilZone, "/t1/wildcard-http", false, "egress.http", "GET", "explicit"},
		{"wildcard https transparent", "--noproxy '*' " + ca, "sub." + exfilZone, "/t1/wildcard-https", true, "egress.connect", "TLS", "transparent"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mark := auditMark(t, s, sb.ID)
			r := curl(t, sb, tc.args+" "+schemeOf(tc.tls)+"://"+tc.host+tc.path)
			if r.Exit != 0 || r.Code != http.StatusOK {
				t.Fatalf("curl: exit %d, status %d, body %q, stderr %q; want 200", r.Exit, r.Code, r.Body, r.Stderr)
			}
			var rep echoReply
			if err := json.Unmarshal([]byte(r.Body), &rep); err != nil {
				t.Fatalf("echo body %q: %v", r.Body, err)
			}
			if rep.Host != tc.host || rep.Path != tc.path || rep.TLS != tc.tls {
				t.Fatalf("upstream echoed %+v, want host %s path %s tls %v", rep, tc.host, tc.path, tc.tls)
			}
			if got := fx.up.requests(tc.path); len(got) != 1 || got[0].Host != tc.host {
				t.Fatalf("upstream recorded %+v for %s, want one request for host %s", got, tc.path, tc.host)
			}
			port := portOf(tc.tls)
			ev := waitEgressEvent(t, s, sb.ID, mark, tc.kind+" "+tc.method+" "+tc.host, func(e egressEvent) bool {
				return e.Kind == tc.kind && e.Method == tc.method && e.Host == tc.host && e.Port == port
			})
			if ev.Verdict != "allowed" || ev.Addr != fmt.Sprintf("%s:%d", up, port) {
				t.Fatalf("audit event %s: want verdict allowed and addr %s:%d", ev, up, port)
			}
			if ev.BytesDown == 0 {
				t.Errorf("audit event %s counts no bytes from upstream", ev)
			}
			// The audit event does not say how the traffic came; the
			// proxy's log line does (explicit: through HTTP_PROXY).
			if !logHas(s, "sandbox="+sb.ID, "mode="+tc.mode, "host="+tc.host, "method="+tc.method, "verdict=allowed") {
				t.Errorf("no server log line for a %s %s to %s", tc.mode, tc.method, tc.host)
			}
		})
	}
}

// logHas reports whether one line of s's log contains every part.
func logHas(s *netServer, parts ...string) bool {
	for _, l := range strings.Split(s.log.String(), "\n") {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(l, p)
		}
		if ok {
			return true
		}
	}
	return false
}

// testNetRefusedDomain proves that a name not on the allowlist
// (other.test, which the resolver knows and whose upstream would answer)
// is refused in every mode, before anything reaches the upstream:
// explicit and transparent HTTP get 403 with a body that starts with
// "corral egress: refused" and names the reason; HTTPS through CONNECT
// and transparent HTTPS fail at once (a non-zero curl exit, never the
// timeout exit 28); the upstream sees neither the request nor a TLS
// handshake for the name; each attempt leaves a refused audit event.
func testNetRefusedDomain(t *testing.T, fx *netFixture) {
	s := fx.srv
	sb := fx.newSandbox(t, s, corral.CreateOptions{Network: "allow", Allow: []string{hostAllowed, "*." + exfilZone}})
	up := fx.up.addr.String()
	ca := "--cacert " + upstreamCAPath
	cases := []struct {
		name   string
		args   string
		path   string
		tls    bool
		kind   string
		method string
		body   string // for HTTP: the start of the 403 body
	}{
		{"http explicit", "", "/t2/http-explicit", false, "egress.http", "GET", "corral egress: refused"},
		{"http transparent", "--noproxy '*' --resolve " + hostOther + ":80:" + up, "/t2/http-transparent", false, "egress.http", "GET", "corral egress: refused: "},
		{"https connect", ca, "/t2/https-connect", true, "egress.connect", "CONNECT", ""},
		{"https transparent", "--noproxy '*' --resolve " + hostOther + ":443:" + up + " " + ca, "/t2/https-transparent", true, "egress.connect", "TLS", ""},
	}
	snis := fx.up.sniCount(hostOther)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mark := auditMark(t, s, sb.ID)
			r := curl(t, sb, tc.args+" "+schemeOf(tc.tls)+"://"+hostOther+tc.path)
			if tc.tls {
				if r.Exit == 0 || r.Exit == 28 || r.Code == http.StatusOK {
					t.Fatalf("curl: exit %d, status %d, stderr %q; want an immediate failure (non-zero exit other than 28)", r.Exit, r.Code, r.Stderr)
				}
			} else {
				if r.Exit != 0 || r.Code != http.StatusForbidden || !strings.HasPrefix(r.Body, tc.body) || !strings.Contains(r.Body, "not in the allowlist") {
					t.Fatalf("curl: exit %d, status %d, body %q; want 403 with body %q... naming \"not in the allowlist\"", r.Exit, r.Code, r.Body, tc.body)
				}
			}
			if got := fx.up.requests(tc.path); len(got) != 0 {
				t.Fatalf("upstream received %+v for a refused name", got)
			}
			ev := waitEgressEvent(t, s, sb.ID, mark, tc.kind+" "+tc.method+" "+hostOther, func(e egressEvent) bool {
				return e.Kind == tc.kind && e.Method == tc.method && e.Host == hostOther
			})
			if ev.Verdict != "refused" || !strings.Contains(ev.Reason, "not in the allowlist") || ev.Addr != "" {
				t.Fatalf("audit event %s: want refused, \"not in the allowlist\", no address dialled", ev)
			}
		})
	}
	if n := fx.up.sniCount(hostOther) - snis; n != 0 {
		t.Fatalf("upstream saw %d TLS handshakes for %s", n, hostOther)
	}
}

// testNetPrivateAddresses proves threat-model.md #10 end to end: names the
// policy allows but that resolve to a private (RFC 1918) or a loopback
// address are refused in every mode with an "always denied" reason naming
// the address, and the proxy never connects there: a canary listening on
// the private address (routed into the test namespace, so a mistaken
// dial would stay on this machine) sees no connection. The DNS filter
// does not hand the sandbox those addresses either. A rebinding name,
// public when the sandbox resolves it and 127.0.0.1 when the proxy does,
// is refused the same way: the proxy judges the address it resolved
// itself, not the one the sandbox connected to.
func testNetPrivateAddresses(t *testing.T, fx *netFixture) {
	s := fx.srv
	sb := fx.newSandbox(t, s, corral.CreateOptions{Network: "allow", Allow: []string{hostAllowed, hostPrivate, hostLoopback}})
	up := fx.up.addr.String()
	ca := "--cacert " + upstreamCAPath
	canary := fx.up.canaryCount()
	for _, h := range []struct{ host, addr string }{
		{hostPrivate, fx.up.private.String()},
		{hostLoopback, "127.0.0.1"},
	} {
		modes := []struct {
			name   string
			args   string
			tls    bool
			kind   string
			method string
		}{
			{"http explicit", "", false, "egress.http", "GET"},
			{"http transparent", "--noproxy '*' --resolve " + h.host + ":80:" + up, false, "egress.http", "GET"},
			{"https connect", ca, true, "egress.connect", "CONNECT"},
			{"https transparent", "--noproxy '*' --resolve " + h.host + ":443:" + up + " " + ca, true, "egress.connect", "TLS"},
		}
		for _, m := range modes {
			t.Run(h.host+" "+m.name, func(t *testing.T) {
				mark := auditMark(t, s, sb.ID)
				path := "/t3/" + strings.ReplaceAll(h.host+"-"+m.name, " ", "-")
				r := curl(t, sb, m.args+" "+schemeOf(m.tls)+"://"+h.host+path)
				if m.tls {
					if r.Exit == 0 || r.Exit == 28 || r.Code == http.StatusOK {
						t.Fatalf("curl: exit %d, status %d, stderr %q; want an immediate failure", r.Exit, r.Code, r.Stderr)
					}
				} else if r.Exit != 0 || r.Code != http.StatusForbidden || !strings.Contains(r.Body, "always denied") {
					t.Fatalf("curl: exit %d, status %d, body %q; want 403 naming \"always denied\"", r.Exit, r.Code, r.Body)
				}
				if got := fx.up.requests(path); len(got) != 0 {
					t.Fatalf("upstream received %+v", got)
				}
				ev := waitEgressEvent(t, s, sb.ID, mark, m.kind+" "+m.method+" "+h.host, func(e egressEvent) bool {
					return e.Kind == m.kind && e.Method == m.method && e.Host == h.host
				})
				if ev.Verdict != "refused" || !strings.Contains(ev.Reason, "always denied") || !strings.Contains(ev.Reason, h.addr) {
					t.Fatalf("audit event %s: want refused with an \"always denied\" reason naming %s", ev, h.addr)
				}
			})
		}
		t.Run(h.host+" dns", func(t *testing.T) {
			mark := auditMark(t, s, sb.ID)
			if res := runIn(t, sb, "getent ahostsv4 "+h.host); res.ExitCode == 0 {
				t.Fatalf("getent ahostsv4 %s answered %q; the filter must drop always-denied addresses", h.host, res.Stdout)
			}
			ev := waitEgressEvent(t, s, sb.ID, mark, "egress.dns A "+h.host, func(e egressEvent) bool {
				return e.Kind == "egress.dns" && e.Method == "DNS A" && e.Host == h.host
			})
			if ev.Verdict != "refused" || !strings.Contains(ev.Reason, "always denied") || ev.Addr != "" {
				t.Fatalf("audit event %s: want refused, \"always denied\", no address answered", ev)
			}
		})
	}

	// DNS rebinding: the name resolves to the upstream when the sandbox
	// asks (through the filter), to 127.0.0.1 when the proxy checks it.
	t.Run("rebinding", func(t *testing.T) {
		name := "rebind-" + strings.ToLower(randAlnum(t, 8)) + ".test"
		rb := fx.newSandbox(t, s, corral.CreateOptions{Network: "allow", Allow: []string{name}})
		if err := rb.Files().Write(context.Background(), "/tmp/dnsprobe.py", []byte(dnsProbe)); err != nil {
			t.Fatal(err)
		}
		if res := runIn(t, rb, "python3 /tmp/dnsprobe.py "+name+" "+up); res.Stdout != "0 1 "+up+"\n" {
			t.Fatalf("first resolution of %s: exit %d %q %q; want the upstream %s", name, res.ExitCode, res.Stdout, res.Stderr, up)
		}
		mark := auditMark(t, s, rb.ID)
		r := curl(t, rb, "--noproxy '*' --resolve "+name+":80:"+up+" http://"+name+"/t3/rebind")
		if r.Exit != 0 || r.Code != http.StatusForbidden || !strings.Contains(r.Body, "always denied") {
			t.Fatalf("curl after rebinding: exit %d, status %d, body %q; want 403 naming \"always denied\"", r.Exit, r.Code, r.Body)
		}
		if got := fx.up.requests("/t3/rebind"); len(got) != 0 {
			t.Fatalf("upstream received %+v", got)
		}
		ev := waitEgressEvent(t, s, rb.ID, mark, "egress.http "+name, func(e egressEvent) bool {
			return e.Kind == "egress.http" && e.Host == name
		})
		if ev.Verdict != "refused" || !strings.Contains(ev.Reason, "always denied") || !strings.Contains(ev.Reason, "127.0.0.1") || ev.Addr != "" {
			t.Fatalf("audit event %s: want refused, \"always denied\" naming 127.0.0.1, nothing dialled", ev)
		}
	})

	if n := fx.up.canaryCount() - canary; n != 0 {
		t.Fatalf("the private canary %s received %d connections", fx.up.private, n)
	}
}

// dnsProbe sends one UDP DNS query for an A record to server:53 and
// prints "<rcode> <answers> <last address>".
const dnsProbe = `import random, socket, struct, sys
name, server = sys.argv[1], sys.argv[2]
q = struct.pack('>HHHHHH', random.randint(0, 65535), 0x0100, 1, 0, 0, 0)
q += b''.join(bytes([len(l)]) + l.encode() for l in name.split('.')) + b'\x00' + struct.pack('>HH', 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(10)
s.sendto(q, (server, 53))
data, _ = s.recvfrom(4096)
n = struct.unpack('>H', data[6:8])[0]
print(data[3] & 0xF, n, socket.inet_ntoa(data[-4:]) if n else '-')
`

// testNetDNS proves threat-model.md #8: the only resolver a sandbox reaches is
// corral's filter, and it answers only allowed names. getent resolves
// allowed.test and a plain name under the allowed *.exfil.test to the
// upstream; other.test and an unlisted name fail (NXDOMAIN); names under
// the allowed wildcard whose first label is hex or base64 data are refused
// as exfiltration. A query sent to an arbitrary address on port 53 (the
// upstream's, where no DNS server listens) is answered by the filter with
// the same verdicts. Every query is an egress.dns audit event, and the
// refused names never reach the upstream resolver.
func testNetDNS(t *testing.T, fx *netFixture) {
	s := fx.srv
	sb := fx.newSandbox(t, s, corral.CreateOptions{Network: "allow", Allow: []string{hostAllowed, "*." + exfilZone}})
	up := fx.up.addr.String()
	hexLabel := hex.EncodeToString(randBytes(t, 16)) // 32 hex digits
	b64Label := "Q2" + randAlnum(t, 30) + "x9Zq"     // base64-shaped, mixed case with digits
	unlisted := "unlisted-" + strings.ToLower(randAlnum(t, 5)) + ".test"
	cases := []struct {
		name   string
		ok     bool
		reason string // refused: part of the audit reason
	}{
		{hostAllowed, true, ""},
		{"www." + exfilZone, true, ""},
		{hostOther, false, "not in the allowlist"},
		{unlisted, false, "not in the allowlist"},
		{hexLabel + "." + exfilZone, false, "suspected DNS exfiltration"},
		{b64Label + "." + exfilZone, false, "suspected DNS exfiltration"},
	}
	if err := sb.Files().Write(context.Background(), "/tmp/dnsprobe.py", []byte(dnsProbe)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		lower := strings.ToLower(tc.name)
		t.Run(lower[:min(len(lower), 24)], func(t *testing.T) {
			mark := auditMark(t, s, sb.ID)
			res := runIn(t, sb, "getent hosts "+tc.name)
			if tc.ok {
				if res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, up+" ") {
					t.Fatalf("getent hosts %s: exit %d %q; want %s", tc.name, res.ExitCode, res.Stdout, up)
				}
			} else if res.ExitCode != 2 || res.Stdout != "" {
				t.Fatalf("getent hosts %s: exit %d %q; want exit 2 (not found) and no answer", tc.name, res.ExitCode, res.Stdout)
			}
			ev := waitEgressEvent(t, s, sb.ID, mark, "egress.dns A "+lower, func(e egressEvent) bool {
				return e.Kind == "egress.dns" && e.Method == "DNS A" && e.Host == lower
			})
			if tc.ok {
				if ev.Verdict != "allowed" || ev.Addr != up {
					t.Fatalf("audit event %s: want allowed with address %s", ev, up)
				}
			} else if ev.Verdict != "refused" || !strings.Contains(ev.Reason, tc.reason) || ev.Addr != "" {
				t.Fatalf("audit event %s: want refused, reason %q, no address", ev, tc.reason)
			}

			// Port 53 of any address is the filter.
			probe := runIn(t, sb, "python3 /tmp/dnsprobe.py "+tc.name+" "+up)
			want := "3 0 -\n" // NXDOMAIN
			switch {
			case tc.ok:
				want = "0 1 " + up + "\n"
			case strings.Contains(tc.reason, "exfiltration"):
				want = "5 0 -\n" // REFUSED
			}
			if probe.ExitCode != 0 || probe.Stdout != want {
				t.Fatalf("DNS query for %s to %s:53: exit %d %q %q; want %q", tc.name, up, probe.ExitCode, probe.Stdout, probe.Stderr, want)
			}
			if asked := fx.dns.asked(lower); asked != tc.ok && tc.name != hostOther {
				t.Fatalf("upstream resolver asked for %s: %v, want %v", lower, asked, tc.ok)
			}
		})
	}
}

// rawProbe connects to host:port, sends a line and reads: the echo
// answers the line at once (then the probe half-closes and reads to the
// end); it prints DATA:<what came back>, EOF (closed without data), RESET
// (ECONNRESET) or TIMEOUT. A send cannot meet the proxy's reset: the
// proxy reads the line before it decides.
const rawProbe = `import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
try:
    s.sendall(b'hello corral\n')
    data = s.recv(4096)
    if data:
        s.shutdown(socket.SHUT_WR)
        while True:
            b = s.recv(4096)
            if not b:
                break
            data += b
        print('DATA:' + data.decode(errors='replace'))
    else:
        print('EOF')
except ConnectionResetError:
    print('RESET')
except socket.timeout:
    print('TIMEOUT')
`

// testNetRawTCP proves that a connection the proxy cannot name (neither
// HTTP nor TLS) is judged by address alone: without a CIDR rule the
// proxy resets it (the sandbox's connect succeeds, since every TCP
// connection is redirected to the host, then reading gets ECONNRESET)
// and the upstream never sees it; with the rule "203.0.113.x/32:7000"
// the echo server answers through the proxy, while the same address on
// another port is still reset. A service listening on every host address
// is not reachable through the sandbox's gateway address either (the
// connection is redirected like any other and the gateway is a private
// address). Each attempt is an egress.tcp audit event. UDP other than
// DNS is rejected by the host at once and never reaches the upstream.
func testNetRawTCP(t *testing.T, fx *netFixture) {
	s := fx.srv
	up := fx.up.addr.String()
	rule := up + "/32:7000"
	noRule := fx.newSandbox(t, s, corral.CreateOptions{Network: "allow", Allow: []string{hostAllowed}})
	withRule := fx.newSandbox(t, s, corral.CreateOptions{Network: "allow", Allow: []string{rule}})

	// A host service on all addresses, and the sandbox's gateway address.
	hostLn, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostLn.Close()
	var hostConns atomic.Int32
	go func() {
		for {
			c, err := hostLn.Accept()
			if err != nil {
				return
			}
			hostConns.Add(1)
			c.Write([]byte("host service\n"))
			c.Close()
		}
	}()
	hostPort := hostLn.Addr().(*net.TCPAddr).Port
	proxyVar := strings.TrimSpace(runIn(t, noRule, "echo $http_proxy").Stdout)
	gw := strings.TrimSuffix(strings.TrimPrefix(proxyVar, "http://"), ":3128")
	if _, err := netip.ParseAddr(gw); err != nil {
		t.Fatalf("gateway from http_proxy %q: %v", proxyVar, err)
	}

	cases := []struct {
		name   string
		sb     *corral.Sandbox
		host   string
		port   int
		want   string
		reason string // part of the audit reason
	}{
		{"no rule", noRule, up, 7000, "RESET\n", "address not in the allowlist"},
		{"rule", withRule, up, 7000, "DATA:hello corral\n\n", "rule " + rule},
		{"rule other port", withRule, up, 7001, "RESET\n", "address not in the allowlist"},
		{"host service via gateway", noRule, gw, hostPort, "RESET\n", "always denied"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.sb.Files().Write(context.Background(), "/tmp/rawprobe.py", []byte(rawProbe)); err != nil {
				t.Fatal(err)
			}
			mark := auditMark(t, s, tc.sb.ID)
			echoes := fx.up.echoCount()
			res := runIn(t, tc.sb, fmt.Sprintf("python3 /tmp/rawprobe.py %s %d", tc.host, tc.port))
			if res.ExitCode != 0 || res.Stdout != tc.want {
				t.Fatalf("raw TCP to %s:%d: exit %d stdout %q stderr %q; want %q", tc.host, tc.port, res.ExitCode, res.Stdout, res.Stderr, tc.want)
			}
			allowed := strings.HasPrefix(tc.want, "DATA:")
			if n := fx.up.echoCount() - echoes; allowed != (n == 1) || n > 1 {
				t.Fatalf("upstream echo accepted %d connections", n)
			}
			ev := waitEgressEvent(t, s, tc.sb.ID, mark, fmt.Sprintf("egress.tcp %s:%d", tc.host, tc.port), func(e egressEvent) bool {
				return e.Kind == "egress.tcp" && e.Method == "TCP" && e.Host == tc.host && e.Port == tc.port
			})
			wantVerdict := "refused"
			if allowed {
				wantVerdict = "allowed"
			}
			if ev.Verdict != wantVerdict || !strings.Contains(ev.Reason, tc.reason) {
				t.Fatalf("audit event %s: want %s, reason %q", ev, wantVerdict, tc.reason)
			}
			if allowed && (ev.BytesUp != 13 || ev.BytesDown != 13 || ev.Addr != fmt.Sprintf("%s:%d", tc.host, tc.port)) {
				t.Fatalf("audit event %s: want 13 bytes each way to %s:%d", ev, tc.host, tc.port)
			}
		})
	}
	if n := hostConns.Load(); n != 0 {
		t.Fatalf("the host service received %d connections from the sandbox", n)
	}

	// UDP other than DNS (QUIC, say) never leaves: the host rejects it
	// at once (ICMP admin-prohibited, EHOSTUNREACH in the sandbox) even
	// with a rule for the address. gVisor's UDP ignores that ICMP error
	// (it handles port-unreachable only, gvisor.dev/issues/5270): there
	// the refusal is silent, the probe times out, and nothing arrives
	// upstream all the same.
	t.Run("udp", func(t *testing.T) {
		if err := withRule.Files().Write(context.Background(), "/tmp/udpprobe.py", []byte(udpProbe)); err != nil {
			t.Fatal(err)
		}
		before := fx.up.udpCount()
		res := runIn(t, withRule, "python3 /tmp/udpprobe.py "+up+" 443")
		want := "ERR 113\n"
		if fx.runtime == "gvisor" {
			want = "TIMEOUT\n"
		}
		if res.ExitCode != 0 || res.Stdout != want {
			t.Fatalf("UDP to %s:443: exit %d %q %q; want %q (ERR 113 is EHOSTUNREACH)", up, res.ExitCode, res.Stdout, res.Stderr, want)
		}
		if n := fx.up.udpCount() - before; n != 0 {
			t.Fatalf("the upstream received %d datagrams", n)
		}
	})
}

// udpProbe sends a datagram to host:port on a connected UDP socket and
// waits for an answer or an error; it prints DATA, ERR <errno> or TIMEOUT.
const udpProbe = `import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(10)
s.connect((sys.argv[1], int(sys.argv[2])))
try:
    s.send(b'quic?')
    s.recv(100)
    print('DATA')
except socket.timeout:
    print('TIMEOUT')
except OSError as e:
    print('ERR', e.errno)
`

// testNetRuntimePolicyChange proves that a running sandbox's network
// policy changes without a restart and takes effect on the next
// connection: created with network none it has only loopback and cannot
// reach the upstream; after SetNetwork(allow [allowed.test]) it can; after
// SetNetwork(allow [other.test]) allowed.test is refused (and other.test
// works); after SetNetwork(none) it has no interface again, and a last
// SetNetwork(allow [allowed.test]) brings it back. GetNetwork reports each
// policy, each change is a network.changed audit event, and the sandbox
// keeps its id, its PID 1 and a file written before the first change.
func testNetRuntimePolicyChange(t *testing.T, fx *netFixture) {
	if fx.runtime == "gvisor" {
		testNetRuntimePolicyChangeGVisor(t, fx)
		return
	}
	s := fx.srv
	ctx := context.Background()
	up := fx.up.addr.String()
	sb := fx.newSandbox(t, s, corral.CreateOptions{})
	marker := randAlnum(t, 24)
	if err := sb.Files().Write(ctx, "/home/user/marker", []byte(marker)); err != nil {
		t.Fatal(err)
	}
	pid1 := func() string {
		t.Helper()
		res := runIn(t, sb, "cut -d' ' -f22 /proc/1/stat")
		if res.ExitCode != 0 || strings.TrimSpace(res.Stdout) == "" {
			t.Fatalf("start time of PID 1: %+v", res)
		}
		return res.Stdout
	}
	links := func() string {
		t.Helper()
		return runIn(t, sb, "ip -o link | awk -F': ' '{print $2}' | cut -d@ -f1").Stdout
	}
	started := pid1()

	setNet := func(mode string, allow []string) {
		t.Helper()
		n, err := s.c.SetNetwork(ctx, sb.ID, mode, allow)
		if err != nil {
			t.Fatalf("SetNetwork(%s, %q): %v", mode, allow, err)
		}
		got, err := s.c.GetNetwork(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []*corral.Network{n, got} {
			if n.Mode != mode || !slices.Equal(n.Allow, allow) && !(len(allow) == 0 && len(n.Allow) == 0) {
				t.Fatalf("network after SetNetwork(%s, %q): %+v", mode, allow, n)
			}
		}
		if (mode == "none") != (got.Usage == nil) {
			t.Fatalf("GetNetwork usage %+v with mode %s", got.Usage, mode)
		}
	}
	// get fetches path from allowed.test (by the sandbox's own DNS, or
	// with --resolve when resolve is set) without a proxy: a sandbox
	// that gains a network later has no proxy variables.
	get := func(host, path string, resolve bool) curlResult {
		t.Helper()
		args := "--noproxy '*' "
		if resolve {
			args += "--resolve " + host + ":80:" + up + " "
		}
		return curl(t, sb, args+"http://"+host+path)
	}
	unreachable := func(step string) {
		t.Helper()
		if l := links(); l != "lo\n" {
			t.Fatalf("%s: interfaces %q, want only lo", step, l)
		}
		for _, resolve := range []bool{false, true} {
			path := fmt.Sprintf("/t6/%s-%v", step, resolve)
			if r := get(hostAllowed, path, resolve); r.Exit == 0 || r.Exit == 28 {
				t.Fatalf("%s: curl (resolve %v): exit %d status %d; want an immediate failure", step, resolve, r.Exit, r.Code)
			}
			if got := fx.up.requests(path); len(got) != 0 {
				t.Fatalf("%s: upstream received %+v", step, got)
			}
		}
	}
	reaches := func(step, host string) {
		t.Helper()
		path := "/t6/" + step + "-" + host
		r := get(host, path, false)
		var rep echoReply
		if r.Exit != 0 || r.Code != http.StatusOK || json.Unmarshal([]byte(r.Body), &rep) != nil || rep.Host != host || rep.Path != path {
			t.Fatalf("%s: curl %s: exit %d status %d body %q stderr %q; want the upstream's echo", step, host, r.Exit, r.Code, r.Body, r.Stderr)
		}
	}

	unreachable("none")

	setNet("allow", []string{hostAllowed})
	if l := links(); !strings.Contains(l, "eth0\n") {
		t.Fatalf("after allow: interfaces %q, want eth0", l)
	}
	reaches("allow", hostAllowed)

	setNet("allow", []string{hostOther})
	if r := get(hostAllowed, "/t6/switched-dns", false); r.Exit != 6 {
		t.Fatalf("allowed.test after the switch: curl exit %d status %d; want 6 (name not resolved)", r.Exit, r.Code)
	}
	if r := get(hostAllowed, "/t6/switched", true); r.Exit != 0 || r.Code != http.StatusForbidden || !strings.Contains(r.Body, "not in the allowlist") {
		t.Fatalf("allowed.test after the switch: exit %d status %d body %q; want 403 not in the allowlist", r.Exit, r.Code, r.Body)
	}
	if got := fx.up.requests("/t6/switched"); len(got) != 0 {
		t.Fatalf("upstream received %+v after the switch", got)
	}
	reaches("switched", hostOther)

	setNet("none", nil)
	unreachable("none-again")

	// And back: the sandbox gets a new veth pair.
	setNet("allow", []string{hostAllowed})
	reaches("again", hostAllowed)

	got, err := s.c.Get(ctx, sb.ID)
	if err != nil || got.ID != sb.ID || got.State != corral.StateRunning {
		t.Fatalf("sandbox after the changes: %+v %v", got, err)
	}
	if b, err := sb.Files().Read(ctx, "/home/user/marker"); err != nil || string(b) != marker {
		t.Fatalf("marker file after the changes: %q %v; want %q (the sandbox was restarted?)", b, err, marker)
	}
	if now := pid1(); now != started {
		t.Fatalf("PID 1 started at %q, before the changes at %q: the sandbox was restarted", now, started)
	}
	evs, err := s.c.Audit(ctx, corral.AuditQuery{Sandbox: sb.ID, Kind: "network.changed"})
	if err != nil || len(evs) != 4 {
		t.Fatalf("network.changed events: %d %v; want 4", len(evs), err)
	}
}

// testNetRuntimePolicyChangeGVisor is testNetRuntimePolicyChange for a
// gVisor sandbox, whose network stack takes its interfaces over when it
// starts: one created with network none cannot gain a network later
// (409 conflict, it stays none and unreachable); one created with allow
// [allowed.test] reaches it, after SetNetwork(allow [other.test]) is
// refused there and reaches other.test, and after SetNetwork(none)
// reaches nothing (its veth pair is gone) and cannot get one back.
func testNetRuntimePolicyChangeGVisor(t *testing.T, fx *netFixture) {
	s := fx.srv
	ctx := context.Background()
	up := fx.up.addr.String()
	get := func(sb *corral.Sandbox, host, path string) curlResult {
		t.Helper()
		return curl(t, sb, "--noproxy '*' --resolve "+host+":80:"+up+" http://"+host+path)
	}
	conflict := func(sb *corral.Sandbox) {
		t.Helper()
		_, err := s.c.SetNetwork(ctx, sb.ID, "allow", []string{hostAllowed})
		var ae *corral.APIError
		if !errors.As(err, &ae) || ae.Status != http.StatusConflict {
			t.Fatalf("SetNetwork(allow) of a gVisor sandbox without a network: %v; want 409", err)
		}
		if n, err := s.c.GetNetwork(ctx, sb.ID); err != nil || n.Mode != "none" {
			t.Fatalf("network after the refused change: %+v, %v; want none", n, err)
		}
	}
	unreachable := func(sb *corral.Sandbox, path string) {
		t.Helper()
		if r := get(sb, hostAllowed, path); r.Exit == 0 {
			t.Fatalf("%s: curl exit 0 status %d; want a failure", path, r.Code)
		}
		if got := fx.up.requests(path); len(got) != 0 {
			t.Fatalf("%s: upstream received %+v", path, got)
		}
	}
	none := fx.newSandbox(t, s, corral.CreateOptions{})
	conflict(none)
	unreachable(none, "/t6g/none")

	sb := fx.newSandbox(t, s, corral.CreateOptions{Network: "allow", Allow: []string{hostAllowed}})
	if r := get(sb, hostAllowed, "/t6g/allow"); r.Exit != 0 || r.Code != http.StatusOK {
		t.Fatalf("allowed.test: exit %d status %d stderr %q; want 200", r.Exit, r.Code, r.Stderr)
	}
	if _, err := s.c.SetNetwork(ctx, sb.ID, "allow", []string{hostOther}); err != nil {
		t.Fatal(err)
	}
	if r := get(sb, hostAllowed, "/t6g/switched"); r.Code != http.StatusForbidden {
		t.Fatalf("allowed.test after the switch: exit %d status %d; want 403", r.Exit, r.Code)
	}
	if r := get(sb, hostOther, "/t6g/other"); r.Exit != 0 || r.Code != http.StatusOK {
		t.Fatalf("other.test after the switch: exit %d status %d; want 200", r.Exit, r.Code)
	}
	if _, err := s.c.SetNetwork(ctx, sb.ID, "none", nil); err != nil {
		t.Fatal(err)
	}
	unreachable(sb, "/t6g/none-again")
	conflict(sb)
}

// testNetSecretInjection proves threat-model.md #20: a brokered secret never
// enters the sandbox yet is usable. The sandbox sees only the placeholder
// CORRAL_SECRET_gh; the proxy puts the real value in the Authorization
// header of requests to secret.test over HTTPS (through CONNECT and
// transparently, which the proxy intercepts with corral's CA that the
// sandbox's bundle trusts), and leaves the placeholder as it is for
// allowed.test, whose HTTPS stays end-to-end encrypted (verified with the
// upstream's own CA). Over plain HTTP (explicit and transparent), where
// the value would cross the network in clear text, a request carrying
// gh's placeholder is refused with 403 secret_over_plain_http naming gh,
// nothing reaches the upstream, and the audit log records the refusal;
// the secret "plain", which the operator set with allow_http, is
// injected over plain HTTP as well. On
// intercepted TLS a request whose Host names another host (domain
// fronting) is refused, so the value reaches secret.test only. A secret
// changed while the sandbox runs is used at once; once deleted, only the
// placeholder goes out. The value appears nowhere: not in env, not in
// any /proc/*/environ readable inside (user's processes as user, root's
// as root; PID 1, the non-dumpable agent, is readable by neither), not in
// files under /etc /home /tmp /root /var/tmp, not in the audit log, the
// server log, GET /v1/secrets or the sandbox's network view. (The upstream
// echoes only a hash of the header, so the sandbox never learns the value
// from the response either.)
func testNetSecretInjection(t *testing.T, fx *netFixture) {
	s := fx.srv
	ctx := context.Background()
	value := "Bearer " + randAlnum(t, 40)
	const name = "gh"
	placeholder := "CORRAL_SECRET_" + name
	if _, err := s.c.PutSecret(ctx, name, []string{hostSecret}, "Authorization", value); err != nil {
		t.Fatalf("put secret: %v", err)
	}
	plainValue := "Bearer " + randAlnum(t, 40)
	const plainName = "plain"
	plainPlaceholder := "CORRAL_SECRET_" + plainName
	if ps, err := s.c.PutSecret(ctx, plainName, []string{hostSecret}, "Authorization", plainValue, corral.SecretOptions{AllowHTTP: true}); err != nil || !ps.AllowHTTP {
		t.Fatalf("put secret with allow_http: %+v %v", ps, err)
	}
	list, err := s.c.ListSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sec := range list {
		if want := sec.Name == plainName; (sec.Name == name || sec.Name == plainName) && sec.AllowHTTP != want {
			t.Fatalf("GET /v1/secrets: %s has allow_http %v, want %v", sec.Name, sec.AllowHTTP, want)
		}
	}
	sb := fx.newSandbox(t, s, corral.CreateOptions{Network: "allow", Allow: []string{hostSecret, hostAllowed}, Secrets: []string{name, plainName}})
	if n, err := s.c.GetNetwork(ctx, sb.ID); err != nil || !slices.Equal(n.Secrets, []string{name, plainName}) {
		t.Fatalf("network: %+v %v; want secrets [%s %s]", n, err, name, plainName)
	}
	// describe says what a header is without printing the value.
	describe := func(got string) string {
		switch got {
		case value:
			return "the secret value"
		case placeholder:
			return "the placeholder"
		case plainValue:
			return "the value of " + plainName
		}
		return fmt.Sprintf("something else (%d bytes)", len(got))
	}

	hdr := `-H "Authorization: $` + placeholder + `" `
	ca := "--cacert " + upstreamCAPath + " "
	cases := []struct {
		name string
		args string
		host string
		tls  bool
		want string
	}{
		{"https connect to secret host", "", hostSecret, true, value},
		{"https transparent to secret host", "--noproxy '*' ", hostSecret, true, value},
		{"https connect to other host", ca, hostAllowed, true, placeholder},
		{"https transparent to other host", "--noproxy '*' " + ca, hostAllowed, true, placeholder},
		{"http explicit to other host", "", hostAllowed, false, placeholder},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := "/t7/" + strings.ReplaceAll(tc.name, " ", "-")
			r := curl(t, sb, hdr+tc.args+schemeOf(tc.tls)+"://"+tc.host+path)
			var rep echoReply
			if r.Exit != 0 || r.Code != http.StatusOK || json.Unmarshal([]byte(r.Body), &rep) != nil {
				t.Fatalf("curl: exit %d status %d body %q stderr %q", r.Exit, r.Code, r.Body, r.Stderr)
			}
			got := fx.up.requests(path)
			if len(got) != 1 || got[0].TLS != tc.tls {
				t.Fatalf("upstream recorded %d requests for %s (%+v)", len(got), path, len(got) == 1 && got[0].TLS)
			}
			if got[0].Auth != tc.want || rep.AuthSHA256 != sha256Hex(tc.want) {
				t.Fatalf("upstream saw %s in Authorization, want %s", describe(got[0].Auth), describe(tc.want))
			}
		})
	}

	// Plain HTTP to the secret's host: gh's placeholder is refused before
	// anything is dialed; plain's (allow_http) is injected.
	for _, mode := range []struct{ name, args string }{{"explicit", ""}, {"transparent", "--noproxy '*' "}} {
		t.Run("http "+mode.name+" to secret host refused", func(t *testing.T) {
			path := "/t7/plain-refused-" + mode.name
			mark := auditMark(t, s, sb.ID)
			r := curl(t, sb, hdr+mode.args+"http://"+hostSecret+path)
			if r.Exit != 0 || r.Code != http.StatusForbidden || !strings.Contains(r.Body, "secret_over_plain_http: "+name) {
				t.Fatalf("curl: exit %d status %d body %q stderr %q; want 403 secret_over_plain_http naming %s", r.Exit, r.Code, r.Body, r.Stderr, name)
			}
			if got := fx.up.requests(path); len(got) != 0 {
				t.Fatalf("upstream received %d requests", len(got))
			}
			ev := waitEgressEvent(t, s, sb.ID, mark, "egress.http refused to "+hostSecret, func(e egressEvent) bool {
				return e.Kind == "egress.http" && e.Host == hostSecret && e.Verdict == "refused"
			})
			if !strings.HasPrefix(ev.Reason, "secret_over_plain_http: "+name) || ev.Addr != "" || ev.BytesUp != 0 {
				t.Fatalf("audit event %s: want secret_over_plain_http naming %s, nothing dialed", ev, name)
			}
		})
		t.Run("http "+mode.name+" to secret host with allow_http", func(t *testing.T) {
			path := "/t7/plain-allowed-" + mode.name
			r := curl(t, sb, `-H "Authorization: $`+plainPlaceholder+`" `+mode.args+"http://"+hostSecret+path)
			var rep echoReply
			if r.Exit != 0 || r.Code != http.StatusOK || json.Unmarshal([]byte(r.Body), &rep) != nil {
				t.Fatalf("curl: exit %d status %d body %q stderr %q", r.Exit, r.Code, r.Body, r.Stderr)
			}
			got := fx.up.requests(path)
			if len(got) != 1 || got[0].TLS || got[0].Auth != plainValue {
				t.Fatalf("upstream recorded %d requests for %s; want one over plain HTTP with the value of %s", len(got), path, plainName)
			}
		})
	}

	// Domain fronting: on TLS intercepted for secret.test, a request whose
	// Host names another host is refused before anything is sent.
	for _, mode := range []struct{ name, args string }{{"connect", ""}, {"transparent", "--noproxy '*' "}} {
		t.Run("fronting "+mode.name, func(t *testing.T) {
			path := "/t7/fronting-" + mode.name
			r := curl(t, sb, hdr+`-H "Host: `+hostAllowed+`" `+mode.args+"https://"+hostSecret+path)
			if r.Exit != 0 || r.Code != http.StatusForbidden || !strings.Contains(r.Body, "does not match the TLS server name") {
				t.Fatalf("curl: exit %d status %d body %q stderr %q; want 403 naming the mismatch", r.Exit, r.Code, r.Body, r.Stderr)
			}
			if got := fx.up.requests(path); len(got) != 0 {
				t.Fatalf("upstream received %d requests for a fronted request", len(got))
			}
		})
	}

	t.Run("value only to its host", func(t *testing.T) {
		fx.up.mu.Lock()
		defer fx.up.mu.Unlock()
		n, plainN := 0, 0
		for _, r := range fx.up.reqs {
			if strings.Contains(r.Auth, strings.TrimPrefix(value, "Bearer ")) {
				n++
				if r.Host != hostSecret || !r.TLS {
					t.Errorf("the secret value reached host %q over TLS %v (path %s)", r.Host, r.TLS, r.Path)
				}
			}
			if strings.Contains(r.Auth, strings.TrimPrefix(plainValue, "Bearer ")) {
				plainN++
				if r.Host != hostSecret {
					t.Errorf("the value of %s reached host %q (path %s)", plainName, r.Host, r.Path)
				}
			}
		}
		if n != 2 || plainN != 2 {
			t.Errorf("the upstream saw the value %d times and that of %s %d times, want 2 each (the HTTPS, resp. plain HTTP, requests to %s)", n, plainName, plainN, hostSecret)
		}
	})

	// A secret changed or deleted while the sandbox runs: the next request
	// carries the new value, then only the placeholder.
	t.Run("rotation and deletion", func(t *testing.T) {
		const rot = "rot"
		v1, v2 := "Bearer "+randAlnum(t, 40), "Bearer "+randAlnum(t, 40)
		if _, err := s.c.PutSecret(ctx, rot, []string{hostSecret}, "Authorization", v1, corral.SecretOptions{AllowHTTP: true}); err != nil {
			t.Fatal(err)
		}
		rs := fx.newSandbox(t, s, corral.CreateOptions{Network: "allow", Allow: []string{hostSecret}, Secrets: []string{rot}})
		sent := func(path string) string {
			t.Helper()
			r := curl(t, rs, `-H "Authorization: $CORRAL_SECRET_`+rot+`" http://`+hostSecret+path)
			got := fx.up.requests(path)
			if r.Exit != 0 || r.Code != http.StatusOK || len(got) != 1 {
				t.Fatalf("curl %s: exit %d status %d, %d requests upstream", path, r.Exit, r.Code, len(got))
			}
			switch got[0].Auth {
			case v1:
				return "v1"
			case v2:
				return "v2"
			case "CORRAL_SECRET_" + rot:
				return "placeholder"
			}
			return fmt.Sprintf("something else (%d bytes)", len(got[0].Auth))
		}
		if got := sent("/t7/rot-1"); got != "v1" {
			t.Fatalf("before the change the upstream saw %s, want v1", got)
		}
		if _, err := s.c.PutSecret(ctx, rot, []string{hostSecret}, "Authorization", v2, corral.SecretOptions{AllowHTTP: true}); err != nil {
			t.Fatal(err)
		}
		if got := sent("/t7/rot-2"); got != "v2" {
			t.Fatalf("after the change the upstream saw %s, want v2", got)
		}
		if err := s.c.DeleteSecret(ctx, rot); err != nil {
			t.Fatal(err)
		}
		if got := sent("/t7/rot-3"); got != "placeholder" {
			t.Fatalf("after the delete the upstream saw %s, want the placeholder", got)
		}
	})

	t.Run("no trace in the sandbox", func(t *testing.T) {
		env := runIn(t, sb, "env")
		if !strings.Contains(env.Stdout, placeholder+"="+placeholder+"\n") || strings.Contains(env.Stdout, value) {
			t.Fatalf("env: has %s=%s %v; contains the secret value %v", placeholder, placeholder,
				strings.Contains(env.Stdout, placeholder+"="+placeholder+"\n"), strings.Contains(env.Stdout, value))
		}
		// PID 1 is corral's agent, which is not dumpable (threat-model.md #6):
		// even sandbox root cannot read its environ. Either way the value
		// must not be there.
		if res := runIn(t, sb, "sudo -n cat /proc/1/environ"); strings.Contains(res.Stdout, value) || res.ExitCode != 0 && !strings.Contains(res.Stderr, "Permission denied") {
			t.Fatalf("/proc/1/environ: exit %d (stderr %q); contains the secret value: %v", res.ExitCode, res.Stderr, strings.Contains(res.Stdout, value))
		}
		// Every environ readable from inside: as user (its own processes)
		// and as root (root's; sandbox root lacks CAP_SYS_PTRACE, so it
		// cannot read user's). The placeholder is there (in this shell's
		// at least), the value nowhere.
		const environs = `for f in /proc/[0-9]*/environ; do tr "\0" "\n" < $f 2>/dev/null; done`
		res := runIn(t, sb, environs+"; sudo -n sh -c '"+environs+"'")
		if !strings.Contains(res.Stdout, placeholder+"="+placeholder+"\n") || strings.Contains(res.Stdout, value) {
			t.Fatalf("/proc/*/environ (exit %d): has the placeholder %v; contains the secret value %v", res.ExitCode,
				strings.Contains(res.Stdout, placeholder+"="+placeholder+"\n"), strings.Contains(res.Stdout, value))
		}
		// The value goes in on stdin, so that it is in no command line. A
		// control string written to a file first shows the search works.
		const grep = "sudo -n grep -rlsF -f - /etc /home /tmp /root /var/tmp"
		control := "control-" + randAlnum(t, 32)
		if err := sb.Files().Write(context.Background(), "/home/user/control.txt", []byte(control)); err != nil {
			t.Fatal(err)
		}
		if res := runIn(t, sb, grep, corral.RunOptions{Stdin: strings.NewReader(control + "\n")}); res.ExitCode != 0 || res.Stdout != "/home/user/control.txt\n" {
			t.Fatalf("control search: exit %d %q %q; want /home/user/control.txt", res.ExitCode, res.Stdout, res.Stderr)
		}
		res = runIn(t, sb, grep, corral.RunOptions{Stdin: strings.NewReader(value + "\n")})
		if res.ExitCode == 0 || strings.TrimSpace(res.Stdout) != "" {
			t.Fatalf("files holding the secret value: exit %d %q", res.ExitCode, res.Stdout)
		}
	})

	t.Run("no trace outside", func(t *testing.T) {
		waitEgressEvent(t, s, sb.ID, 0, "egress.http to secret.test", func(e egressEvent) bool {
			return e.Kind == "egress.http" && e.Host == hostSecret && e.Verdict == "allowed"
		})
		evs, err := s.c.Audit(ctx, corral.AuditQuery{})
		if err != nil {
			t.Fatal(err)
		}
		all, _ := json.Marshal(evs)
		if strings.Contains(string(all), value) || strings.Contains(string(all), plainValue) || !strings.Contains(string(all), hostSecret) {
			t.Fatalf("audit log (%d events): contains the value %v, names %s %v", len(evs), strings.Contains(string(all), value), hostSecret, strings.Contains(string(all), hostSecret))
		}
		for _, path := range []string{"/v1/audit?format=jsonl", "/v1/secrets", "/v1/sandboxes/" + sb.ID + "/network"} {
			body := getRaw(t, s, path)
			if strings.Contains(body, value) || strings.Contains(body, strings.TrimPrefix(value, "Bearer ")) {
				t.Fatalf("GET %s returns the secret value", path)
			}
			if path == "/v1/secrets" && !strings.Contains(body, `"`+name+`"`) {
				t.Fatalf("GET /v1/secrets does not list %s: %s", name, body)
			}
		}
		log := s.log.String()
		if strings.Contains(log, strings.TrimPrefix(value, "Bearer ")) || !strings.Contains(log, hostSecret) {
			t.Fatalf("server log: contains the value %v; mentions %s %v", strings.Contains(log, strings.TrimPrefix(value, "Bearer ")), hostSecret, strings.Contains(log, hostSecret))
		}
	})
}

// getRaw GETs an API path of s and returns the body; it fails unless the
// status is 200.
func getRaw(t *testing.T, s *netServer, path string) string {
	t.Helper()
	req, err := http.NewRequest("GET", s.ts.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", s.ts.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return string(b)
}

// connsProbe holds two connections to the upstream (requests waiting in
// /hold/<key>), waits for /tmp/go, opens a third, then reads the two.
const connsProbe = `import os, socket, sys, time
up, key = sys.argv[1], sys.argv[2]
def req(path):
    return ('GET %s HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n' % path).encode()
held = []
for i in range(2):
    s = socket.create_connection((up, 80), timeout=120)
    s.sendall(req('/hold/' + key))
    held.append(s)
for _ in range(2400):
    if os.path.exists('/tmp/go'):
        break
    time.sleep(0.05)
else:
    print('NO-GO', flush=True)
    sys.exit(3)
try:
    s3 = socket.create_connection((up, 80), timeout=60)
    s3.sendall(req('/t8/third'))
    d = s3.recv(4096)
    print('THIRD:' + ('EOF' if not d else 'DATA ' + d.split(b'\r\n')[0].decode()), flush=True)
except ConnectionResetError:
    print('THIRD:RESET', flush=True)
except Exception as e:
    print('THIRD:ERROR ' + repr(e), flush=True)
for s in held:
    data = b''
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    print('HELD:' + data.split(b'\r\n')[0].decode(), flush=True)
`

// testNetCaps proves threat-model.md #21's per-sandbox egress caps on a server
// configured with MaxConns 2 and MaxBytes 256 KiB: with two connections
// held open through the proxy, a third is reset and recorded with reason
// "cap: connections" while the two complete normally, and the slots come
// back once they close; a download larger than the byte cap is cut short
// (curl reports an error, fewer bytes arrive than were sent, never more
// than the cap), recorded with "cap: bytes", and later requests from that
// sandbox are refused with 403 "cap: bytes" without reaching the upstream.
func testNetCaps(t *testing.T, fx *netFixture) {
	s := fx.capsServer(t)
	ctx := context.Background()
	up := fx.up.addr.String()

	t.Run("connections", func(t *testing.T) {
		sb := fx.newSandbox(t, s, corral.CreateOptions{Network: "allow", Allow: []string{hostAllowed}})
		if err := sb.Files().Write(ctx, "/tmp/conns.py", []byte(connsProbe)); err != nil {
			t.Fatal(err)
		}
		key := strings.ToLower(randAlnum(t, 12))
		var mu sync.Mutex
		var out strings.Builder
		output := func() string { mu.Lock(); defer mu.Unlock(); return out.String() }
		mark := auditMark(t, s, sb.ID)
		h, err := sb.Start(ctx, "python3 /tmp/conns.py "+up+" "+key, corral.RunOptions{
			Timeout:  4 * time.Minute,
			OnStdout: func(b []byte) { mu.Lock(); out.Write(b); mu.Unlock() },
		})
		if err != nil {
			t.Fatal(err)
		}
		released := false
		defer func() {
			if !released {
				fx.up.release(key)
			}
		}()
		waitFor(t, "two requests held at the upstream", time.Minute, func() bool { return fx.up.holding(key) == 2 })
		if n, err := s.c.GetNetwork(ctx, sb.ID); err != nil || n.Usage == nil || n.Usage.Conns != 2 {
			t.Fatalf("usage with two held connections: %+v %v; want 2 connections", n, err)
		}
		runIn(t, sb, "touch /tmp/go")
		waitFor(t, "the third connection's outcome", time.Minute, func() bool {
			select {
			case <-h.Done():
				return true
			default:
				return strings.Contains(output(), "THIRD:")
			}
		})
		fx.up.release(key)
		released = true
		res, err := h.Wait()
		if err != nil {
			t.Fatal(err)
		}
		want := "THIRD:RESET\nHELD:HTTP/1.1 200 OK\nHELD:HTTP/1.1 200 OK\n"
		if res.ExitCode != 0 || res.Stdout != want {
			t.Fatalf("probe: exit %d stdout %q stderr %q; want %q", res.ExitCode, res.Stdout, res.Stderr, want)
		}
		if got := fx.up.requests("/t8/third"); len(got) != 0 {
			t.Fatalf("upstream received the third request: %+v", got)
		}
		ev := waitEgressEvent(t, s, sb.ID, mark, "reason cap: connections", func(e egressEvent) bool {
			return strings.Contains(e.Reason, "cap: connections")
		})
		if ev.Verdict != "refused" || ev.Kind != "egress.tcp" {
			t.Fatalf("audit event %s: want a refused egress.tcp", ev)
		}
		waitFor(t, "connection slots given back", time.Minute, func() bool {
			n, err := s.c.GetNetwork(ctx, sb.ID)
			return err == nil && n.Usage != nil && n.Usage.Conns == 0
		})
		if r := curl(t, sb, "http://"+hostAllowed+"/t8/after-conns"); r.Exit != 0 || r.Code != http.StatusOK {
			t.Fatalf("request after the connections closed: exit %d status %d body %q", r.Exit, r.Code, r.Body)
		}
	})

	t.Run("bytes", func(t *testing.T) {
		const size, capBytes = 1 << 20, 256 << 10
		sb := fx.newSandbox(t, s, corral.CreateOptions{Network: "allow", Allow: []string{hostAllowed}})
		mark := auditMark(t, s, sb.ID)
		res := runIn(t, sb, fmt.Sprintf("curl --noproxy '*' -sS --max-time 60 -o /tmp/big 'http://%s/big?n=%d'; echo \"exit=$?\"; stat -c %%s /tmp/big", hostAllowed, size))
		lines := strings.Fields(res.Stdout)
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "exit=") {
			t.Fatalf("download: %q %q", res.Stdout, res.Stderr)
		}
		exit, _ := strconv.Atoi(strings.TrimPrefix(lines[0], "exit="))
		got, _ := strconv.Atoi(lines[1])
		if exit == 0 || exit == 28 || got >= size || got > capBytes {
			t.Fatalf("download of %d bytes under a %d-byte cap: curl exit %d, %d bytes arrived (stderr %q); want a cut stream", size, capBytes, exit, got, res.Stderr)
		}
		ev := waitEgressEvent(t, s, sb.ID, mark, "reason cap: bytes", func(e egressEvent) bool {
			return e.Kind == "egress.http" && e.Host == hostAllowed && strings.Contains(e.Reason, "cap: bytes")
		})
		if ev.Verdict != "refused" || ev.BytesUp+ev.BytesDown > capBytes {
			t.Fatalf("audit event %s: want refused with at most %d bytes", ev, capBytes)
		}
		if n, err := s.c.GetNetwork(ctx, sb.ID); err != nil || n.Usage == nil || n.Usage.Bytes > capBytes {
			t.Fatalf("usage: %+v %v; want at most %d bytes", n, err, capBytes)
		}
		r := curl(t, sb, "http://"+hostAllowed+"/t8/after-bytes")
		if r.Exit != 0 || r.Code != http.StatusForbidden || !strings.Contains(r.Body, "cap: bytes") {
			t.Fatalf("request after the cap: exit %d status %d body %q; want 403 cap: bytes", r.Exit, r.Code, r.Body)
		}
		if got := fx.up.requests("/t8/after-bytes"); len(got) != 0 {
			t.Fatalf("upstream received a request over the byte cap: %+v", got)
		}
	})
}

// nftChains splits `nft list table` output into chain bodies by name.
func nftChains(out string) map[string]string {
	chains := map[string]string{}
	var name string
	var body strings.Builder
	for _, line := range strings.Split(out, "\n") {
		l := strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(l, "chain "); ok {
			name = strings.TrimSuffix(strings.TrimSpace(rest), "{")
			name = strings.TrimSpace(name)
			body.Reset()
			continue
		}
		if name == "" {
			continue
		}
		if l == "}" {
			chains[name] = body.String()
			name = ""
			continue
		}
		body.WriteString(l + "\n")
	}
	return chains
}

// testNetHostPlumbing proves the host side of a sandbox's network on a
// dedicated server: its nftables table corral_<tag> exists, redirects a
// sandbox interface's DNS to the filter and its other TCP to the proxy,
// rejects other input from sandboxes and drops everything forwarded from
// or to them; a networked sandbox has a host interface carrying its id as
// alias and, inside, eth0 numbered from the configured range with the
// default route via the gateway; Kill removes the interface, and the
// server's Close removes the table.
func testNetHostPlumbing(t *testing.T, fx *netFixture) {
	ps := startNetServer(t, fx, "plumbing", nil)
	ctx := context.Background()
	table := "corral_" + ps.tag
	prefix := "cr" + ps.tag
	if out := runCmd(t, "nft", "list", "tables"); !strings.Contains(out, "table inet "+table+"\n") {
		t.Fatalf("nft list tables: %q lacks inet %s", out, table)
	}
	sb := fx.newSandbox(t, ps, corral.CreateOptions{Network: "allow", Allow: []string{hostAllowed}})

	rules := runCmd(t, "nft", "list", "table", "inet", table)
	chains := nftChains(rules)
	from := `iifname "` + prefix + `*"`
	to := `oifname "` + prefix + `*"`
	hasLine := func(chain string, parts ...string) bool {
		for _, l := range strings.Split(chains[chain], "\n") {
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(l, p)
			}
			if ok {
				return true
			}
		}
		return false
	}
	checks := []struct {
		what  string
		chain string
		parts []string
	}{
		{"udp DNS redirected to the filter", "sandbox_prerouting", []string{from, "udp dport 53", "redirect to :"}},
		{"tcp DNS redirected to the filter", "sandbox_prerouting", []string{from, "tcp dport 53", "redirect to :"}},
		{"other tcp redirected to the proxy", "sandbox_prerouting", []string{from, "tcp", "redirect to :"}},
		{"other input rejected", "sandbox_input", []string{from, "reject"}},
		{"forwarding from sandboxes dropped", "sandbox_forward", []string{from, "drop"}},
		{"forwarding to sandboxes dropped", "sandbox_forward", []string{to, "drop"}},
	}
	for _, c := range checks {
		if !hasLine(c.chain, c.parts...) {
			t.Errorf("%s: no rule in chain %s with %q:\n%s", c.what, c.chain, c.parts, rules)
		}
	}
	if n := strings.Count(chains["sandbox_prerouting"], "redirect to :"); n < 3 {
		t.Errorf("prerouting has %d redirects, want at least 3:\n%s", n, rules)
	}

	var hostIf netlink.Link
	linksNow, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range linksNow {
		if l.Attrs().Alias == sb.ID {
			hostIf = l
		}
	}
	if hostIf == nil || !strings.HasPrefix(hostIf.Attrs().Name, prefix) {
		t.Fatalf("no host interface %s* with alias %s (found %v)", prefix, sb.ID, hostIf)
	}
	name := hostIf.Attrs().Name
	addrs, err := netlink.AddrList(hostIf, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 {
		t.Fatalf("addresses of %s: %v %v", name, addrs, err)
	}
	gw, _ := netip.AddrFromSlice(addrs[0].IP.To4())
	if !ps.rng.Contains(gw) {
		t.Fatalf("gateway %s of %s is outside the range %s", gw, name, ps.rng)
	}
	inside := runIn(t, sb, "ip -o -4 addr show dev eth0 | awk '{print $4}'; ip -4 route")
	fields := strings.Fields(inside.Stdout)
	if len(fields) < 1 {
		t.Fatalf("inside: %q %q", inside.Stdout, inside.Stderr)
	}
	sbAddr, err := netip.ParsePrefix(fields[0])
	if err != nil || !ps.rng.Contains(sbAddr.Addr()) || !strings.Contains(inside.Stdout, "default via "+gw.String()+" dev eth0") {
		t.Fatalf("inside the sandbox: %q; want eth0 in %s and the default route via %s", inside.Stdout, ps.rng, gw)
	}

	if _, err := ps.c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(name); err == nil {
		t.Fatalf("host interface %s still exists after Kill", name)
	}
	if err := ps.close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if out := runCmd(t, "nft", "list", "tables"); strings.Contains(out, table+"\n") {
		t.Fatalf("table %s still exists after the server closed: %q", table, out)
	}
}

// testNetEnvSecretWarning proves the env-var side of threat-model.md #20: a
// GitHub-token-shaped value passed as env var GITHUB_TOKEN is accepted
// with a warning that names the variable but never the value, recorded as
// a sandbox.warning audit event (the value in neither the audit log nor
// the server log); a server configured with RefuseEnvSecrets refuses the
// same request with error code env_secret_refused, on the native and the
// E2B API (400, not 500), without echoing the value and without creating
// a sandbox.
func testNetEnvSecretWarning(t *testing.T, fx *netFixture) {
	ctx := context.Background()
	token := "ghp_" + randAlnum(t, 36)

	s := fx.srv
	sb, err := s.c.Create(ctx, corral.CreateOptions{Env: map[string]string{"GITHUB_TOKEN": token}, Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatalf("create with GITHUB_TOKEN: %v", err)
	}
	t.Cleanup(func() { _, _ = s.c.Kill(context.Background(), sb.ID) })
	named := false
	for _, w := range sb.Warnings {
		named = named || strings.Contains(w, "GITHUB_TOKEN")
		if strings.Contains(w, token) {
			t.Fatalf("warning contains the value: %q", w)
		}
	}
	if !named {
		t.Fatalf("warnings %q do not name GITHUB_TOKEN", sb.Warnings)
	}
	evs, err := s.c.Audit(ctx, corral.AuditQuery{Sandbox: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	warned := false
	for _, ev := range evs {
		if strings.Contains(string(ev.Data), token) {
			t.Fatalf("audit event %s contains the value", ev.Kind)
		}
		warned = warned || ev.Kind == "sandbox.warning" && strings.Contains(string(ev.Data), "GITHUB_TOKEN")
	}
	if !warned {
		t.Fatalf("no sandbox.warning event naming GITHUB_TOKEN among %d events", len(evs))
	}
	if strings.Contains(s.log.String(), token) {
		t.Fatal("the server log contains the env value")
	}

	caps := fx.capsServer(t)
	tag := "envrefuse-" + strings.ToLower(randAlnum(t, 8))
	_, err = caps.c.Create(ctx, corral.CreateOptions{Env: map[string]string{"GITHUB_TOKEN": token}, Metadata: map[string]string{"test": tag}, Timeout: 5 * time.Minute})
	var ae *corral.APIError
	if !errors.As(err, &ae) || ae.Code != "env_secret_refused" || ae.Status != http.StatusBadRequest {
		t.Fatalf("create on a RefuseEnvSecrets server: %v; want 400 env_secret_refused", err)
	}
	if !strings.Contains(ae.Message, "GITHUB_TOKEN") || strings.Contains(ae.Message, token) {
		t.Fatalf("refusal message %q: want it to name GITHUB_TOKEN and not contain the value", ae.Message)
	}
	// The E2B API refuses the same create with 400 and the code, not 500.
	body, _ := json.Marshal(map[string]any{"templateID": "base", "envVars": map[string]string{"GITHUB_TOKEN": token}, "metadata": map[string]string{"test": tag}})
	req, _ := http.NewRequest(http.MethodPost, caps.ts.URL+"/sandboxes", bytes.NewReader(body))
	req.Header.Set("X-API-Key", caps.ts.Key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	eb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(eb), "env_secret_refused") || !strings.Contains(string(eb), "GITHUB_TOKEN") || strings.Contains(string(eb), token) {
		t.Fatalf("E2B create on a RefuseEnvSecrets server: %d %s; want 400 naming env_secret_refused and GITHUB_TOKEN, without the value", resp.StatusCode, eb)
	}
	if list, err := caps.c.List(ctx, corral.ListOptions{State: "all", Metadata: map[string]string{"test": tag}}); err != nil || len(list) != 0 {
		t.Fatalf("sandboxes after the refusal: %d %v; want none", len(list), err)
	}
}
