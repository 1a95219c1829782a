package netns

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
)

// inNS runs fn on a thread that has joined the namespace at path.
func inNS(t *testing.T, path string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		ns, err := vnetns.GetFromPath(path)
		if err != nil {
			t.Errorf("open %s: %v", path, err)
			return
		}
		defer ns.Close()
		if err := vnetns.Set(ns); err != nil {
			t.Errorf("setns: %v", err)
			return
		}
		fn()
	}()
	<-done
}

type testNet struct {
	m     *Manager
	proxy net.Listener
	dns   net.PacketConn
}

func newTestManager(t *testing.T) *testNet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	proxy, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	dns, err := net.ListenPacket("udp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dns.Close() })
	m, err := New(Config{
		Range:     netip.MustParsePrefix("10.231.0.0/24"),
		Instance:  "t" + strconv.Itoa(os.Getpid()%100),
		NSDir:     t.TempDir(),
		ProxyPort: uint16(proxy.Addr().(*net.TCPAddr).Port),
		DNSPort:   uint16(dns.LocalAddr().(*net.UDPAddr).Port),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return &testNet{m: m, proxy: proxy, dns: dns}
}

func TestCreateRedirectRemove(t *testing.T) {
	tn := newTestManager(t)
	m := tn.m
	l, err := m.Create("sbxone")
	if err != nil {
		t.Fatal(err)
	}
	if !m.Range().Contains(l.Addr) || l.Gateway.Next() != l.Addr {
		t.Fatalf("link addresses %v/%v outside %v", l.Gateway, l.Addr, m.Range())
	}
	if hl, err := netlink.LinkByName(l.HostIf); err != nil || hl.Attrs().Alias != "sbxone" {
		t.Fatalf("host interface %s: %v", l.HostIf, err)
	}

	// Inside: eth0 carries the address and a default route via the gateway.
	inNS(t, l.NSPath, func() {
		ifs, err := net.InterfaceByName(SandboxIfName)
		if err != nil {
			t.Errorf("eth0: %v", err)
			return
		}
		addrs, _ := ifs.Addrs()
		if len(addrs) == 0 || !strings.HasPrefix(addrs[0].String(), l.Addr.String()+"/") {
			t.Errorf("eth0 addresses %v, want %v", addrs, l.Addr)
		}
	})

	// Any TCP destination lands on the proxy listener, from the sandbox's
	// own address.
	accepted := make(chan net.Addr, 1)
	go func() {
		c, err := tn.proxy.Accept()
		if err != nil {
			accepted <- nil
			return
		}
		accepted <- c.RemoteAddr()
		c.Close()
	}()
	inNS(t, l.NSPath, func() {
		c, err := net.Dial("tcp4", "203.0.113.77:4444")
		if err != nil {
			t.Errorf("dial redirected: %v", err)
			return
		}
		c.Close()
	})
	if ra := <-accepted; ra == nil || !strings.HasPrefix(ra.String(), l.Addr.String()+":") {
		t.Fatalf("proxy saw %v, want a connection from %v", ra, l.Addr)
	}

	// DNS to any address lands on the DNS listener.
	inNS(t, l.NSPath, func() {
		c, err := net.Dial("udp4", m.DNSServer().String()+":53")
		if err != nil {
			t.Errorf("dial dns: %v", err)
			return
		}
		c.Write([]byte("q"))
		c.Close()
	})
	buf := make([]byte, 16)
	n, from, err := tn.dns.ReadFrom(buf)
	if err != nil || string(buf[:n]) != "q" || !strings.HasPrefix(from.String(), l.Addr.String()+":") {
		t.Fatalf("dns listener got %q from %v: %v", buf[:n], from, err)
	}

	// Other UDP is refused at once (ICMP admin-prohibited → EHOSTUNREACH on
	// a connected socket), never silently dropped.
	inNS(t, l.NSPath, func() {
		c, err := net.Dial("udp4", "203.0.113.77:5000")
		if err != nil {
			t.Errorf("dial udp: %v", err)
			return
		}
		defer c.Close()
		c.Write([]byte("x"))
		_, err = c.Read(make([]byte, 4))
		if !errors.Is(err, syscall.EHOSTUNREACH) && !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("stray UDP: got %v, want an immediate ICMP refusal", err)
		}
	})

	// IPv6 is off on both ends: an IPv6 connection fails at once.
	inNS(t, l.NSPath, func() {
		b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + SandboxIfName + "/disable_ipv6")
		if err == nil && strings.TrimSpace(string(b)) != "1" {
			t.Errorf("IPv6 still on inside: disable_ipv6=%q", b)
		}
	})

	// A second sandbox gets another /30.
	l2, err := m.Create("sbxtwo")
	if err != nil {
		t.Fatal(err)
	}
	if l2.Addr == l.Addr || l2.HostIf == l.HostIf {
		t.Fatalf("second link reuses %v %v", l2.Addr, l2.HostIf)
	}

	if err := m.Remove("sbxone"); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(l.HostIf); err == nil {
		t.Fatalf("interface %s still present after Remove", l.HostIf)
	}
	if _, err := os.Stat(l.NSPath); !os.IsNotExist(err) {
		t.Fatalf("namespace file %s still present: %v", l.NSPath, err)
	}
	if n := countRules(t, m, "sbxone"); n != 0 {
		t.Fatalf("%d rules of sbxone left", n)
	}
	if n := countRules(t, m, "sbxtwo"); n != sandboxRules {
		t.Fatalf("sbxtwo has %d rules, want %d", n, sandboxRules)
	}

	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(l2.HostIf); err == nil {
		t.Fatalf("interface %s still present after Close", l2.HostIf)
	}
	c, _ := nftables.New()
	tables, _ := c.ListTablesOfFamily(nftables.TableFamilyINet)
	for _, tb := range tables {
		if tb.Name == m.table {
			t.Fatalf("table %s still present after Close", m.table)
		}
	}
}

func TestAdoptKeepsLiveAndRemovesDead(t *testing.T) {
	tn := newTestManager(t)
	m := tn.m
	live, err := m.Create("live")
	if err != nil {
		t.Fatal(err)
	}
	dead, err := m.Create("dead")
	if err != nil {
		t.Fatal(err)
	}
	// A new manager of the same instance (a restarted server) adopts.
	m2, err := New(m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	adopted, removed, err := m2.Adopt(func(id string) bool { return id == "live" })
	if err != nil {
		t.Fatal(err)
	}
	if len(adopted) != 1 || adopted[0].ID != "live" || adopted[0].Addr != live.Addr {
		t.Fatalf("adopted %+v", adopted)
	}
	if len(removed) != 1 || removed[0] != "dead" {
		t.Fatalf("removed %v", removed)
	}
	if _, err := netlink.LinkByName(dead.HostIf); err == nil {
		t.Fatal("dead sandbox's interface survived Adopt")
	}
	if _, err := os.Stat(dead.NSPath); !os.IsNotExist(err) {
		t.Fatal("dead sandbox's namespace file survived Adopt")
	}
	if n := countRules(t, m2, "live"); n != sandboxRules {
		t.Fatalf("live has %d rules after adopt, want %d", n, sandboxRules)
	}
	if err := m2.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"ipv6 range", Config{Range: netip.MustParsePrefix("fd00::/64"), Instance: "a", ProxyPort: 1, DNSPort: 2}},
		{"tiny range", Config{Range: netip.MustParsePrefix("10.0.0.0/30"), Instance: "a", ProxyPort: 1, DNSPort: 2}},
		{"bad instance", Config{Instance: "ABCD", ProxyPort: 1, DNSPort: 2}},
		{"no ports", Config{Instance: "a"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.NSDir = t.TempDir()
			if _, err := New(tc.cfg); err == nil {
				t.Fatal("want error")
			}
		})
	}
}

// sandboxRules is the number of rules tagged with a sandbox's id: its
// anti-spoofing rule and its DNS packet limit.
const sandboxRules = 2

func countRules(t *testing.T, m *Manager, id string) int {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tb := m.tableRef()
	rules, err := c.GetRules(tb, &nftables.Chain{Name: chainAntispoof, Table: tb})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range rules {
		if string(r.UserData) == id {
			n++
		}
	}
	return n
}

// TestReapRemovesUnknown: the periodic reaper removes an interface left by
// a sandbox this manager does not know (and keeps known ones).
func TestReapRemovesUnknown(t *testing.T) {
	tn := newTestManager(t)
	m := tn.m
	kept, err := m.Create("kept")
	if err != nil {
		t.Fatal(err)
	}
	stray, err := m.Create("stray")
	if err != nil {
		t.Fatal(err)
	}
	// Forget "stray" as a crashed server would have.
	m.mu.Lock()
	delete(m.links, "stray")
	m.mu.Unlock()
	gone := m.Reap(func(string) bool { return false })
	if len(gone) != 1 || gone[0] != "stray" {
		t.Fatalf("reaped %v, want [stray]", gone)
	}
	if _, err := netlink.LinkByName(stray.HostIf); err == nil {
		t.Fatal("stray interface survived")
	}
	if _, err := netlink.LinkByName(kept.HostIf); err != nil {
		t.Fatalf("kept interface removed: %v", err)
	}
}

// TestEnsureRestoresTable: a deleted table (nft flush ruleset) comes back
// with the rules of the sandboxes the manager knows.
func TestEnsureRestoresTable(t *testing.T) {
	tn := newTestManager(t)
	m := tn.m
	if _, err := m.Create("kept"); err != nil {
		t.Fatal(err)
	}
	if restored, err := m.Ensure(); err != nil || restored {
		t.Fatalf("Ensure with the table in place: %v %v", restored, err)
	}
	if err := m.deleteTable(); err != nil {
		t.Fatal(err)
	}
	if restored, err := m.Ensure(); err != nil || !restored {
		t.Fatalf("Ensure after the table was deleted: %v %v", restored, err)
	}
	if n := countRules(t, m, "kept"); n != sandboxRules {
		t.Fatalf("kept has %d rules after the restore, want %d", n, sandboxRules)
	}
}

// TestDNSFloodLimitedPerSandbox defends the other sandboxes' name
// resolution against a DNS flood that does not wait for answers: the
// packets one sandbox sends to the DNS filter beyond DNSPacketBurst plus
// DNSPacketRate a second are dropped in the kernel, so they never reach
// the filter's shared socket, while a second sandbox's queries sent right
// after the flood all arrive.
func TestDNSFloodLimitedPerSandbox(t *testing.T) {
	tn := newTestManager(t)
	flooder, err := tn.m.Create("flooder")
	if err != nil {
		t.Fatal(err)
	}
	other, err := tn.m.Create("other")
	if err != nil {
		t.Fatal(err)
	}
	// Count what reaches the listener, by sender address.
	got := map[string]int{}
	var mu sync.Mutex
	done := make(chan struct{})
	if uc, ok := tn.dns.(*net.UDPConn); ok {
		_ = uc.SetReadBuffer(8 << 20)
	}
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		for {
			_, from, err := tn.dns.ReadFrom(buf)
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(from.String())
			mu.Lock()
			got[host]++
			mu.Unlock()
		}
	}()
	const flood = 20000
	start := time.Now()
	inNS(t, flooder.NSPath, func() {
		c, err := net.Dial("udp4", tn.m.DNSServer().String()+":53")
		if err != nil {
			t.Errorf("dial dns: %v", err)
			return
		}
		defer c.Close()
		for i := 0; i < flood; i++ {
			c.Write([]byte("q"))
		}
	})
	elapsed := time.Since(start)
	const queries = 50
	inNS(t, other.NSPath, func() {
		c, err := net.Dial("udp4", tn.m.DNSServer().String()+":53")
		if err != nil {
			t.Errorf("dial dns: %v", err)
			return
		}
		defer c.Close()
		for i := 0; i < queries; i++ {
			c.Write([]byte("q"))
		}
	})
	// Wait until the other sandbox's queries have all arrived (or a
	// generous deadline passed), then stop reading.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		n := got[other.Addr.String()]
		mu.Unlock()
		if n >= queries {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // let packets already queued land
	tn.dns.SetReadDeadline(time.Now())
	<-done
	mu.Lock()
	defer mu.Unlock()
	if n := got[other.Addr.String()]; n != queries {
		t.Errorf("the other sandbox's queries that arrived: %d of %d", n, queries)
	}
	// The limit lets through the burst plus the rate over the time the
	// flood took (a second of slack for the token bucket's granularity).
	allowed := DNSPacketBurst + int(float64(DNSPacketRate)*(elapsed.Seconds()+1))
	if n := got[flooder.Addr.String()]; n == 0 || n > allowed || n >= flood {
		t.Errorf("the flooder's packets that arrived: %d of %d sent in %v; want 1..%d", n, flood, elapsed, allowed)
	}
	t.Logf("flooder: %d of %d packets arrived in %v (bound %d); other: %d of %d", got[flooder.Addr.String()], flood, elapsed, allowed, got[other.Addr.String()], queries)
}
