package integration

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corral "github.com/corralhq/corral/sdk/go"
)

// hostIf is an interface the test created in the host's network namespace
// (a dummy; a veth pair with both ends on the host where the kernel has
// no dummy driver), holding one documentation address: an address of
// this host that nothing outside the machine routes to.
type hostIf struct {
	name string
	addr netip.Addr
}

// newHostIf creates the interface with a free 203.0.113.250-254/32 (the
// upstream namespaces use .10-.249) and removes it in t.Cleanup.
func newHostIf(t *testing.T) *hostIf {
	t.Helper()
	h := &hostIf{name: fmt.Sprintf("crtd%x", randBytes(t, 3))}
	out, err := exec.Command("ip", "link", "add", h.name, "type", "dummy").CombinedOutput()
	if err != nil && strings.Contains(string(out), "Unknown device type") {
		out, err = exec.Command("ip", "link", "add", h.name, "type", "veth", "peer", "name", h.name+"p").CombinedOutput()
	}
	if err != nil {
		t.Fatalf("ip link add %s: %v: %s", h.name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", h.name).Run() })
	runCmd(t, "ip", "link", "set", h.name, "up")
	for i := 250; i <= 254 && !h.addr.IsValid(); i++ {
		a := netip.AddrFrom4([4]byte{203, 0, 113, byte(i)})
		if hostUses(netip.PrefixFrom(a, 32)) {
			continue
		}
		if exec.Command("ip", "addr", "add", a.String()+"/32", "dev", h.name).Run() == nil {
			h.addr = a
		}
	}
	if !h.addr.IsValid() {
		t.Fatal("no free address in 203.0.113.250-254 for the host interface")
	}
	return h
}

// countAccepts listens on ap and counts the connections it accepts.
func countAccepts(t *testing.T, ap netip.AddrPort) *atomic.Int64 {
	t.Helper()
	l, err := net.Listen("tcp", ap.String())
	if err != nil {
		t.Fatalf("listen on %s: %v", ap, err)
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
	return n
}

// testNetHostAddress proves that an all-public sandbox cannot reach a
// service of the host itself through the egress proxy: a listener on an
// address of a host interface, added while the server runs (as a new
// interface or address would be), is never reached, by name (local.test
// resolves to it) or by IP literal, explicitly (HTTP_PROXY: plain HTTP and
// CONNECT) or transparently (HTTP by Host, TLS by SNI, raw TCP). Each
// attempt is refused at once (403 naming host_address, or a reset) and
// recorded in the audit log with the reason host_address; the DNS filter
// gives the sandbox no address for the name; the listeners accept
// nothing.
func testNetHostAddress(t *testing.T, fx *netFixture) {
	s := fx.srv
	sb := fx.newSandbox(t, s, corral.CreateOptions{Network: "all-public"})
	// The proxy has served (and read the host's addresses) before the
	// interface exists.
	if r := curl(t, sb, "http://"+hostAllowed+"/t9/before"); r.Exit != 0 || r.Code != http.StatusOK {
		t.Fatalf("curl before the host interface: exit %d status %d %q", r.Exit, r.Code, r.Stderr)
	}

	hi := newHostIf(t)
	fx.dns.setLocal(hi.addr)
	t.Cleanup(func() { fx.dns.setLocal(netip.Addr{}) })
	n80 := countAccepts(t, netip.AddrPortFrom(hi.addr, 80))
	n443 := countAccepts(t, netip.AddrPortFrom(hi.addr, 443))
	n7000 := countAccepts(t, netip.AddrPortFrom(hi.addr, 7000))
	local, up := hi.addr.String(), fx.up.addr.String()

	cases := []struct {
		name   string
		cmd    string // a curl argument list, or a shell command when raw
		raw    bool
		http   bool // a 403 response is expected (else a failed connection)
		kind   string
		method string
		host   string
	}{
		{"http explicit by name", "http://" + hostLocal + "/t9", false, true, "egress.http", "GET", hostLocal},
		{"http explicit by literal", "http://" + local + "/t9", false, true, "egress.http", "GET", local},
		{"https connect by name", "https://" + hostLocal + "/t9", false, false, "egress.connect", "CONNECT", hostLocal},
		{"https connect by literal", "https://" + local + "/t9", false, false, "egress.connect", "CONNECT", local},
		// The sandbox cannot resolve local.test (the filter drops the
		// address): curl connects anywhere and the proxy goes by name.
		{"http transparent by name", "--noproxy '*' --resolve " + hostLocal + ":80:" + up + " http://" + hostLocal + "/t9", false, true, "egress.http", "GET", hostLocal},
		{"http transparent by literal", "--noproxy '*' http://" + local + "/t9", false, true, "egress.http", "GET", local},
		{"https transparent by name", "--noproxy '*' --resolve " + hostLocal + ":443:" + up + " https://" + hostLocal + "/t9", false, false, "egress.connect", "TLS", hostLocal},
		{"raw tcp by literal", "exec 3<>/dev/tcp/" + local + "/7000 && echo hello >&3 && cat <&3", true, false, "egress.tcp", "TCP", local},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mark := auditMark(t, s, sb.ID)
			if tc.raw {
				if res := runIn(t, sb, "timeout 30 bash -c '"+tc.cmd+"'"); res.ExitCode == 0 || res.ExitCode == 124 {
					t.Fatalf("raw connection: exit %d %q %q; want an immediate failure", res.ExitCode, res.Stdout, res.Stderr)
				}
			} else {
				r := curl(t, sb, tc.cmd)
				if tc.http {
					if r.Exit != 0 || r.Code != http.StatusForbidden || !strings.Contains(r.Body, "host_address") {
						t.Fatalf("curl: exit %d status %d body %q stderr %q; want 403 naming host_address", r.Exit, r.Code, r.Body, r.Stderr)
					}
				} else if r.Exit == 0 || r.Exit == 28 || r.Code == http.StatusOK {
					t.Fatalf("curl: exit %d status %d stderr %q; want an immediate failure", r.Exit, r.Code, r.Stderr)
				}
			}
			ev := waitEgressEvent(t, s, sb.ID, mark, tc.kind+" "+tc.method+" "+tc.host, func(e egressEvent) bool {
				return e.Kind == tc.kind && e.Method == tc.method && e.Host == tc.host
			})
			if ev.Verdict != "refused" || !strings.Contains(ev.Reason, "host_address: "+local) || ev.BytesUp != 0 {
				t.Fatalf("audit event %s: want refused with host_address naming %s, nothing sent", ev, local)
			}
		})
	}
	t.Run("dns", func(t *testing.T) {
		mark := auditMark(t, s, sb.ID)
		if res := runIn(t, sb, "getent ahostsv4 "+hostLocal); res.ExitCode == 0 {
			t.Fatalf("getent ahostsv4 %s answered %q; the filter must drop the host's addresses", hostLocal, res.Stdout)
		}
		ev := waitEgressEvent(t, s, sb.ID, mark, "egress.dns A "+hostLocal, func(e egressEvent) bool {
			return e.Kind == "egress.dns" && e.Method == "DNS A" && e.Host == hostLocal
		})
		if ev.Verdict != "refused" || !strings.Contains(ev.Reason, "host_address") || ev.Addr != "" {
			t.Fatalf("audit event %s: want refused naming host_address, no address answered", ev)
		}
	})

	// No attempt reached the listeners. A probe of the test's own is
	// accepted after any earlier connection, so once it is counted the
	// count is final.
	for port, n := range map[uint16]*atomic.Int64{80: n80, 443: n443, 7000: n7000} {
		ap := netip.AddrPortFrom(hi.addr, port)
		c, err := net.Dial("tcp", ap.String())
		if err != nil {
			t.Fatalf("probe %s: %v", ap, err)
		}
		c.Close()
		deadline := time.Now().Add(10 * time.Second)
		for n.Load() == 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := n.Load(); got != 1 {
			t.Errorf("the listener on %s accepted %s connections besides the probe", ap, strconv.Itoa(int(got-1)))
		}
	}
}
