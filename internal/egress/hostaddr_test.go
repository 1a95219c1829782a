package egress

import (
	"bufio"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestHostAddressesAlwaysDenied checks, on this machine's real interface
// addresses, the defence against a sandbox reaching the host's own
// services through the proxy: every address assigned to a host interface
// is refused by the one address check, named or not, in every mode, also
// when an explicit rule names exactly that address and when it is
// embedded in an IPv6 transition form, with a reason starting with
// "host_address" unless a never-openable range (loopback, link-local)
// names it first.
func TestHostAddressesAlwaysDenied(t *testing.T) {
	addrs, err := interfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	hostOnly := 0
	for _, a := range addrs {
		d := lookup(a)
		if d != nil && d.never {
			continue // loopback, link-local: named by their range
		}
		hostOnly++
		rule := a.String() + "/" + strconv.Itoa(a.BitLen())
		if a.Is6() {
			rule = "[" + rule + "]"
		}
		for _, p := range []Policy{
			mustPolicy(t, "all-public"),
			mustPolicy(t, "all-public", rule),
			mustPolicy(t, "allow", rule, "host.example.test"),
		} {
			for _, named := range []bool{true, false} {
				ok, why := p.AllowsAddr(a, 80, named)
				if ok || !strings.HasPrefix(why, "always denied: "+ReasonHostAddress+": ") {
					t.Errorf("%s %v named=%v: AllowsAddr = %v, %q; want refused with %s", p.Mode, p.Rules, named, ok, why, ReasonHostAddress)
				}
			}
		}
		if ok, why := AlwaysDenied(a); !ok || !strings.HasPrefix(why, ReasonHostAddress) {
			t.Errorf("AlwaysDenied(%s) = %v, %q", a, ok, why)
		}
		if a.Is4() {
			b := a.As4()
			nat64 := netip.AddrFrom16([16]byte{0, 0x64, 0xff, 0x9b, 10: 0, 11: 0, 12: b[0], 13: b[1], 14: b[2], 15: b[3]})
			for _, x := range []netip.Addr{nat64, netip.AddrFrom16(a.As16())} {
				if ok, why := mustPolicy(t, "all-public").AllowsAddr(x, 80, false); ok || !strings.Contains(why, ReasonHostAddress) {
					t.Errorf("%s (embeds host address %s): AllowsAddr = %v, %q", x, a, ok, why)
				}
			}
		}
	}
	t.Logf("%d host addresses outside never-openable ranges checked", hostOnly)
}

// dummyIf is a dummy interface (or, on a kernel without the dummy driver,
// a veth pair with both ends on the host) a test created in the host's
// network namespace: addresses put on it are addresses of this host, and nothing
// sent to them leaves the machine.
type dummyIf struct {
	name string
}

// newDummyIf creates an up dummy interface without addresses and removes
// it in t.Cleanup. It skips when not root or without ip(8).
func newDummyIf(t *testing.T) *dummyIf {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip(8) from iproute2")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a dummy interface")
	}
	var rb [3]byte
	if _, err := rand.Read(rb[:]); err != nil {
		t.Fatal(err)
	}
	d := &dummyIf{name: fmt.Sprintf("crtd%x", rb)}
	out, err := exec.Command("ip", "link", "add", d.name, "type", "dummy").CombinedOutput()
	if err != nil && strings.Contains(string(out), "Unknown device type") {
		// A kernel without the dummy driver: one end of a veth pair
		// whose both ends stay in the host's namespace serves the same.
		out, err = exec.Command("ip", "link", "add", d.name, "type", "veth", "peer", "name", d.name+"p").CombinedOutput()
	}
	if err != nil {
		t.Fatalf("ip link add %s: %v: %s", d.name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", d.name).Run() })
	if out, err := exec.Command("ip", "link", "set", d.name, "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set %s up: %v: %s", d.name, err, out)
	}
	return d
}

// addAddr puts one of candidates on the interface (the first that no
// other interface holds) and returns it.
func (d *dummyIf) addAddr(t *testing.T, candidates []netip.Addr) netip.Addr {
	t.Helper()
	var last []byte
	for _, a := range candidates {
		args := []string{"addr", "add", a.String() + "/" + strconv.Itoa(a.BitLen()), "dev", d.name}
		if a.Is6() {
			args = append(args, "nodad")
		}
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err == nil {
			return a
		}
		last = out
	}
	t.Fatalf("no free address for %s among %v: %s", d.name, candidates, last)
	return netip.Addr{}
}

// countingListener listens on a:0 and counts the connections it accepts.
func countingListener(t *testing.T, a netip.Addr) (netip.AddrPort, *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", netip.AddrPortFrom(a, 0).String())
	if err != nil {
		t.Fatalf("listen on %s: %v", a, err)
	}
	t.Cleanup(func() { l.Close() })
	n := &atomic.Int64{}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return netip.MustParseAddrPort(l.Addr().String()), n
}

// TestProxyRefusesHostAddress checks the defence against an all-public
// sandbox reaching a service of the host itself: a listener on an address
// of a host interface (a documentation address on a dummy interface,
// added after the proxy has served and loaded the host's addresses, as a
// new interface or address would be on a running server) is never
// reached through the proxy, by name (resolving to its IPv4 or IPv6
// address, or to the IPv4-mapped form), by IP literal, by an IPv6
// transition form embedding it, explicitly (plain HTTP and CONNECT) or
// transparently (HTTP by Host, TLS by SNI, raw TCP by the original
// destination). Each attempt is refused with the reason host_address and
// recorded; the listener accepts nothing. The test's dial guard lets the
// proxy dial the dummy addresses, so only the policy check stands between
// the sandbox and the listener.
func TestProxyRefusesHostAddress(t *testing.T) {
	e := newEgressEnv(t)
	dum := newDummyIf(t)
	pol := mustPolicy(t, "all-public")
	cl := Client{ID: "sb-host", Policy: pol}

	// Before the addresses exist: the proxy serves (and reads the host's
	// addresses) normally.
	{
		p, _ := e.newProxy(t, cl, ProxyConfig{})
		addr := serveExplicit(t, p)
		if r := viaHTTP(t, addr, "http://allowed.test:"+strconv.Itoa(int(e.port))+"/before"); r.status != 200 {
			t.Fatalf("allowed request before the dummy address: %+v", r)
		}
	}

	var v4s, v6s []netip.Addr
	for i := 250; i <= 254; i++ { // outside the .10-.249 the netns tests use
		v4s = append(v4s, netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}))
	}
	var rb [2]byte
	if _, err := rand.Read(rb[:]); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		v6s = append(v6s, netip.MustParseAddr(fmt.Sprintf("2001:db8:c0ff:ee::%x:%x", rb[0]^byte(i), rb[1])))
	}
	v4 := dum.addAddr(t, v4s)
	v6 := dum.addAddr(t, v6s)
	ap4, n4 := countingListener(t, v4)
	ap6, n6 := countingListener(t, v6)
	port := strconv.Itoa(int(ap4.Port()))
	port6 := strconv.Itoa(int(ap6.Port()))
	b4 := v4.As4()
	nat64 := netip.AddrFrom16([16]byte{0, 0x64, 0xff, 0x9b, 12: b4[0], 13: b4[1], 14: b4[2], 15: b4[3]})
	e.res.mu.Lock()
	e.res.names["host4.test"] = [][]netip.Addr{{v4}}
	e.res.names["host6.test"] = [][]netip.Addr{{v6}}
	e.res.names["mapped.test"] = [][]netip.Addr{{netip.AddrFrom16(v4.As16())}}
	e.res.mu.Unlock()

	newProxy := func(t *testing.T) (*Proxy, *proxyEvents) {
		p, evs := e.newProxy(t, cl, ProxyConfig{})
		// Only the policy may stop a dial to the dummy addresses.
		p.dialGuard = func(ap netip.AddrPort) error {
			if a := ap.Addr(); a != e.upstream.Addr() && a != v4 && a != v6 {
				e.violations.Store(ap.String(), true)
				return errors.New("test guard: refusing to dial " + ap.String())
			}
			return nil
		}
		return p, evs
	}
	checkEvent := func(t *testing.T, evs *proxyEvents) {
		t.Helper()
		got := waitEvents(t, evs.all, 1)
		if len(got) != 1 || got[0].Verdict != VerdictRefused || !strings.Contains(got[0].Reason, ReasonHostAddress) || got[0].Sandbox != "sb-host" {
			t.Errorf("events %+v; want one refusal with %s", got, ReasonHostAddress)
		}
	}

	explicit := []struct {
		name    string
		connect bool
		target  string
	}{
		{"http-name-v4", false, "http://host4.test:" + port + "/"},
		{"connect-name-v4", true, "host4.test:" + port},
		{"http-literal-v4", false, "http://" + v4.String() + ":" + port + "/"},
		{"connect-literal-v4", true, v4.String() + ":" + port},
		{"http-name-v6", false, "http://host6.test:" + port6 + "/"},
		{"connect-literal-v6", true, "[" + v6.String() + "]:" + port6},
		{"http-name-mapped", false, "http://mapped.test:" + port + "/"},
		{"connect-literal-mapped", true, "[::ffff:" + v4.String() + "]:" + port},
		{"connect-literal-nat64", true, "[" + nat64.String() + "]:" + port},
	}
	for _, tc := range explicit {
		t.Run("explicit-"+tc.name, func(t *testing.T) {
			p, evs := newProxy(t)
			addr := serveExplicit(t, p)
			var r result
			if tc.connect {
				r = viaConnect(t, addr, tc.target, "/")
			} else {
				r = viaHTTP(t, addr, tc.target)
			}
			if r.status != 403 || !strings.Contains(r.refused, ReasonHostAddress) {
				t.Errorf("%s: %d %q %q; want 403 with %s", tc.target, r.status, r.refused, r.body, ReasonHostAddress)
			}
			checkEvent(t, evs)
		})
	}

	t.Run("transparent-http-name", func(t *testing.T) {
		p, evs := newProxy(t)
		c, _ := transparentConn(t, p, ap4)
		st, body, _ := sendHTTP(t, c, bufio.NewReader(c), "host4.test:"+port, "/", nil)
		if st != 403 || !strings.Contains(body, ReasonHostAddress) {
			t.Errorf("%d %q; want 403 with %s", st, body, ReasonHostAddress)
		}
		checkEvent(t, evs)
	})
	t.Run("transparent-http-literal", func(t *testing.T) {
		p, evs := newProxy(t)
		c, _ := transparentConn(t, p, ap4)
		st, body, _ := sendHTTP(t, c, bufio.NewReader(c), ap4.String(), "/", nil)
		if st != 403 || !strings.Contains(body, ReasonHostAddress) {
			t.Errorf("%d %q; want 403 with %s", st, body, ReasonHostAddress)
		}
		checkEvent(t, evs)
	})
	t.Run("transparent-tls-sni", func(t *testing.T) {
		p, evs := newProxy(t)
		c, _ := transparentConn(t, p, ap4)
		if err := tls.Client(c, &tls.Config{ServerName: "host4.test", InsecureSkipVerify: true}).Handshake(); err == nil {
			t.Error("TLS handshake through the proxy to a host address succeeded")
		}
		checkEvent(t, evs)
	})
	t.Run("transparent-raw", func(t *testing.T) {
		p, evs := newProxy(t)
		c, _ := transparentConn(t, p, ap4)
		if _, err := io.WriteString(c, "\x00raw bytes\n"); err != nil {
			t.Fatal(err)
		}
		expectReset(t, c)
		checkEvent(t, evs)
	})

	// No attempt may have reached the listeners. A probe of the test's
	// own is accepted after any connection made before it, so once the
	// probe is counted the count is final.
	for _, l := range []struct {
		ap netip.AddrPort
		n  *atomic.Int64
	}{{ap4, n4}, {ap6, n6}} {
		c, err := net.Dial("tcp", l.ap.String())
		if err != nil {
			t.Fatalf("probe %s: %v", l.ap, err)
		}
		c.Close()
		deadline := time.Now().Add(10 * time.Second)
		for l.n.Load() == 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := l.n.Load(); got == 0 {
			t.Errorf("the listener on %s never counted the probe", l.ap)
		} else if got != 1 {
			t.Errorf("the listener on host address %s accepted %d connections besides the probe", l.ap, got-1)
		}
	}
	e.checkNoViolations(t)
}

// BenchmarkAllowsAddr measures the address check with the host address
// lookup (one non-blocking netlink poll when nothing changed).
func BenchmarkAllowsAddr(b *testing.B) {
	p, _ := ParsePolicy("all-public", nil)
	a := netip.MustParseAddr("203.0.113.9")
	for b.Loop() {
		p.AllowsAddr(a, 443, true)
	}
}
