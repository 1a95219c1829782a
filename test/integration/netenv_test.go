package integration

// The fixture of the network tests (network_test.go): an upstream network
// namespace on a documentation address (RFC 5737) routed to a test veth, a
// DNS server on 127.0.0.1 that the egress proxy and the DNS filter resolve
// with, and corral servers configured to use both. Nothing here sends a
// packet off this machine: every address the fixture serves or names is
// either in the namespace it created (routed to its veth, checked with
// `ip route get` before traffic flows) or on loopback.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/corralhq/corral/internal/server"
	corral "github.com/corralhq/corral/sdk/go"
	"github.com/corralhq/corral/test/testserver"
)

// Host names the fixture's DNS server answers.
const (
	hostAllowed  = "allowed.test"
	hostSecret   = "secret.test"
	hostOther    = "other.test"
	hostPrivate  = "private.test"  // resolves to a private (RFC 1918) address
	hostLoopback = "loopback.test" // resolves to 127.0.0.1
	hostLocal    = "local.test"    // resolves to an address of a host interface (fakeDNS.setLocal)
	exfilZone    = "exfil.test"    // every name under it resolves to the upstream
)

// upstreamCAPath is where the tests write the upstream's CA inside a
// sandbox, for curl --cacert.
const upstreamCAPath = "/tmp/upstream-ca.pem"

// netFixture is everything the network tests share.
type netFixture struct {
	top *testing.T // the top-level test, which owns the lazily started servers
	up  *netUpstream
	dns *fakeDNS
	// srv is the default corral server: default caps, env secrets warned.
	srv *netServer

	// runtime is the runtime of the sandboxes newSandbox makes.
	runtime string

	capsOnce sync.Once
	caps     *netServer
	capsErr  error
}

// newNetFixture builds the upstream namespace, the DNS server and the
// default corral server; everything is torn down in t.Cleanup.
func newNetFixture(t *testing.T) *netFixture {
	t.Helper()
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("network tests need %s(8)", tool)
		}
	}
	fx := &netFixture{top: t}
	fx.up = newNetUpstream(t)
	fx.dns = newFakeDNS(t, fx.up.addr, fx.up.private)
	fx.srv = startNetServer(t, fx, "net", nil)
	return fx
}

// capsServer starts (once) the server with small egress caps that also
// refuses env vars that look like secrets.
func (fx *netFixture) capsServer(t *testing.T) *netServer {
	t.Helper()
	fx.capsOnce.Do(func() {
		fx.caps, fx.capsErr = tryStartNetServer(fx.top, fx, "caps", func(c *server.Config) {
			c.EgressLimits.MaxConns = 2
			c.EgressLimits.MaxBytes = 256 << 10
			c.EgressLimits.RequestsPerMinute = 1000
			c.RefuseEnvSecrets = true
		})
	})
	if fx.capsErr != nil {
		t.Fatalf("start caps server: %v", fx.capsErr)
	}
	return fx.caps
}

// ---------------------------------------------------------------------
// Upstream namespace.

// upstreamReq is one request the upstream HTTP(S) server received.
type upstreamReq struct {
	Host string
	Path string
	Auth string // the Authorization header as received
	TLS  bool
}

// echoReply is the upstream's answer to every ordinary request. It never
// carries the Authorization value itself (only its SHA-256), so that a
// sandbox never learns an injected secret from the echo.
type echoReply struct {
	Host       string `json:"host"`
	Path       string `json:"path"`
	TLS        bool   `json:"tls"`
	AuthSHA256 string `json:"auth_sha256"`
}

// netUpstream is a network namespace holding the upstream servers on
// 203.0.113.x (HTTP :80, HTTPS :443, TCP echo :7000) and a canary on a
// private address that must never see a connection.
type netUpstream struct {
	ns      string
	hostIf  string
	nsIP    string
	addr    netip.Addr // upstream, 203.0.113.x
	private netip.Addr // canary, private (RFC 1918), routed into the namespace
	caPEM   []byte     // the CA that signed the HTTPS leaf
	caFile  string

	mu       sync.Mutex
	reqs     []upstreamReq            // guarded by mu
	snis     map[string]int           // TLS handshakes by server name; guarded by mu
	echoes   int                      // raw TCP echo connections; guarded by mu
	udp      int                      // datagrams to the UDP listener; guarded by mu
	canary   int                      // connections to the private canary; guarded by mu
	holds    map[string]chan struct{} // guarded by mu
	holdWait map[string]int           // requests waiting in /hold/<key>; guarded by mu
	files    map[string][]byte        // static files by path (serveFile); guarded by mu
}

func runCmd(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// hostUses reports whether any host address or non-default route overlaps p.
func hostUses(p netip.Prefix) bool {
	addrs, _ := netlink.AddrList(nil, netlink.FAMILY_V4)
	for _, a := range addrs {
		ones, _ := a.Mask.Size()
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if ok && netip.PrefixFrom(ip, ones).Masked().Overlaps(p) {
			return true
		}
	}
	routes, _ := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		ip, ok := netip.AddrFromSlice(r.Dst.IP.To4())
		if ok && ones > 0 && netip.PrefixFrom(ip, ones).Masked().Overlaps(p) {
			return true
		}
	}
	return false
}

func randBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// newNetUpstream creates the namespace "crtest-up-<hex>", a veth pair on a
// free /30 of 198.51.100.0/24, 203.0.113.x/32 and the private canary on
// the namespace's loopback, and host routes for both via the veth; it
// checks with `ip route get` that they go via the veth, then starts the
// servers (HTTP :80, HTTPS :443, TCP echo :7000, UDP :443, canary :80 and
// :443). Everything is removed in t.Cleanup.
func newNetUpstream(t *testing.T) *netUpstream {
	t.Helper()
	rb := randBytes(t, 3)
	tag := hex.EncodeToString(rb)
	u := &netUpstream{
		ns:       "crtest-up-" + tag,
		hostIf:   "cnt" + tag + "h",
		snis:     map[string]int{},
		holds:    map[string]chan struct{}{},
		holdWait: map[string]int{},
		files:    map[string][]byte{},
	}
	nsIf := "cnt" + tag + "n"

	// A free /30 for the transfer net, a free upstream /32, a free
	// private canary /32.
	var transfer netip.Prefix
	for try := 0; try < 64 && !transfer.IsValid(); try++ {
		k := 1 + int(randBytes(t, 1)[0])%63
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(4 * k)}), 30)
		if !hostUses(p) {
			transfer = p
		}
	}
	for try := 0; try < 64 && !u.addr.IsValid(); try++ {
		a := netip.AddrFrom4([4]byte{203, 0, 113, byte(10 + int(randBytes(t, 1)[0])%240)})
		if !hostUses(netip.PrefixFrom(a, 32)) {
			u.addr = a
		}
	}
	for _, s := range []string{"10.0.0.5", "10.99.113.5", "172.31.113.5", "192.168.213.5"} {
		a := netip.MustParseAddr(s)
		if !hostUses(netip.PrefixFrom(a, 32)) {
			u.private = a
			break
		}
	}
	if !transfer.IsValid() || !u.addr.IsValid() || !u.private.IsValid() {
		t.Fatalf("no free test addresses (transfer %v, upstream %v, private %v)", transfer, u.addr, u.private)
	}
	hostIP := transfer.Addr().Next()
	u.nsIP = hostIP.Next().String()

	runCmd(t, "ip", "netns", "add", u.ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", u.ns).Run() })
	runCmd(t, "ip", "link", "add", u.hostIf, "type", "veth", "peer", "name", nsIf)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", u.hostIf).Run() })
	runCmd(t, "ip", "link", "set", nsIf, "netns", u.ns)
	runCmd(t, "ip", "addr", "add", hostIP.String()+"/30", "dev", u.hostIf)
	runCmd(t, "ip", "link", "set", u.hostIf, "up")
	runCmd(t, "ip", "-n", u.ns, "link", "set", "lo", "up")
	runCmd(t, "ip", "-n", u.ns, "addr", "add", u.nsIP+"/30", "dev", nsIf)
	runCmd(t, "ip", "-n", u.ns, "link", "set", nsIf, "up")
	for _, a := range []netip.Addr{u.addr, u.private} {
		runCmd(t, "ip", "-n", u.ns, "addr", "add", a.String()+"/32", "dev", "lo")
		runCmd(t, "ip", "route", "add", a.String()+"/32", "via", u.nsIP, "dev", u.hostIf)
		t.Cleanup(func() { _ = exec.Command("ip", "route", "del", a.String()+"/32", "via", u.nsIP).Run() })
		// The route must go via our veth before any test traffic flows.
		if got := runCmd(t, "ip", "route", "get", a.String()); !strings.Contains(got, "via "+u.nsIP+" dev "+u.hostIf) {
			t.Fatalf("route to %s does not go via the test veth: %q", a, got)
		}
	}

	ca, leaf := newTestPKI(t)
	u.caPEM = ca
	u.caFile = filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(u.caFile, ca, 0o644); err != nil {
		t.Fatal(err)
	}

	up := u.addr.String()
	priv := u.private.String()
	lns := listenInNetns(t, u.ns, up+":80", up+":443", up+":7000", priv+":80", priv+":443")
	httpLn, tlsLn, echoLn := lns[0], lns[1], lns[2]

	hs := &http.Server{Handler: http.HandlerFunc(u.serveHTTP), ReadHeaderTimeout: 30 * time.Second}
	hss := &http.Server{Handler: http.HandlerFunc(u.serveHTTP), ReadHeaderTimeout: 30 * time.Second}
	tlsCfg := &tls.Config{
		Certificates: []tls.Certificate{leaf},
		GetConfigForClient: func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
			u.mu.Lock()
			u.snis[chi.ServerName]++
			u.mu.Unlock()
			return nil, nil
		},
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); _ = hs.Serve(httpLn) }()
	go func() { defer wg.Done(); _ = hss.Serve(tls.NewListener(tlsLn, tlsCfg)) }()
	go func() { defer wg.Done(); u.serveEcho(echoLn) }()
	for _, ln := range lns[3:] {
		wg.Add(1)
		go func() { defer wg.Done(); u.serveCanary(ln) }()
	}
	// A UDP listener on the upstream's port 443 (QUIC's), which no
	// datagram from a sandbox may reach.
	var udpConn net.PacketConn
	if err := inNetns(u.ns, func() (err error) {
		udpConn, err = net.ListenPacket("udp4", up+":443")
		return err
	}); err != nil {
		t.Fatalf("listen udp in netns %s: %v", u.ns, err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 2048)
		for {
			if _, _, err := udpConn.ReadFrom(buf); err != nil {
				return
			}
			u.mu.Lock()
			u.udp++
			u.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		u.mu.Lock()
		for k, ch := range u.holds {
			close(ch)
			delete(u.holds, k)
		}
		u.mu.Unlock()
		hs.Close()
		hss.Close()
		for _, ln := range lns {
			ln.Close()
		}
		udpConn.Close()
		wg.Wait()
	})
	return u
}

// inNetns runs fn on a goroutine locked to an OS thread that joined the
// named namespace and is never unlocked (the runtime discards the thread
// when the goroutine ends, so no other goroutine ever runs in the
// namespace). Sockets fn opens keep the namespace.
func inNetns(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		f, err := os.Open("/var/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// listenInNetns opens TCP listeners on addrs inside the named namespace.
func listenInNetns(t *testing.T, ns string, addrs ...string) []net.Listener {
	t.Helper()
	var lns []net.Listener
	err := inNetns(ns, func() error {
		for _, a := range addrs {
			ln, err := net.Listen("tcp4", a)
			if err != nil {
				return fmt.Errorf("listen %s: %w", a, err)
			}
			lns = append(lns, ln)
		}
		return nil
	})
	if err != nil {
		for _, l := range lns {
			l.Close()
		}
		t.Fatalf("listen in netns %s: %v", ns, err)
	}
	return lns
}

// newTestPKI returns a test CA (PEM) and a leaf it signed for every test
// host name.
func newTestPKI(t *testing.T) ([]byte, tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "corral network test upstream CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: hostAllowed},
		DNSNames:     []string{hostAllowed, hostSecret, hostOther, hostPrivate, hostLoopback, "*." + exfilZone},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	return caPEM, tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: leafKey}
}

// serveHTTP is the upstream's HTTP and HTTPS handler:
//
//   - /big?n=N answers N bytes (with Content-Length);
//   - /hold/<key> waits until the test releases key, then echoes;
//   - a path given to serveFile answers that file (404 for others under
//     a served file's directory);
//   - anything else echoes (see echoReply).
//
// Every request is recorded.
func (u *netUpstream) serveHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.reqs = append(u.reqs, upstreamReq{Host: r.Host, Path: r.URL.Path, Auth: r.Header.Get("Authorization"), TLS: r.TLS != nil})
	clean := path.Clean(r.URL.Path) // apt asks for /repo/./Packages
	file, isFile := u.files[clean]
	servedDir := false
	for p := range u.files {
		servedDir = servedDir || strings.HasPrefix(clean, p[:strings.LastIndex(p, "/")+1])
	}
	u.mu.Unlock()
	switch {
	case isFile:
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(file)))
		_, _ = w.Write(file)
		return
	case servedDir:
		http.NotFound(w, r)
		return
	case r.URL.Path == "/big":
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(n))
		chunk := bytes.Repeat([]byte("corral-byte-cap!"), 4096) // 64 KiB
		for n > 0 {
			m := min(n, len(chunk))
			if _, err := w.Write(chunk[:m]); err != nil {
				return
			}
			n -= m
		}
		return
	case strings.HasPrefix(r.URL.Path, "/hold/"):
		key := strings.TrimPrefix(r.URL.Path, "/hold/")
		u.mu.Lock()
		ch := u.holdChan(key)
		u.holdWait[key]++
		u.mu.Unlock()
		select {
		case <-ch:
		case <-r.Context().Done():
		case <-time.After(3 * time.Minute):
		}
	}
	rep := echoReply{Host: r.Host, Path: r.URL.Path, TLS: r.TLS != nil}
	if a := r.Header.Get("Authorization"); a != "" {
		sum := sha256.Sum256([]byte(a))
		rep.AuthSHA256 = hex.EncodeToString(sum[:])
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(rep)
}

// holdChan returns the release channel of key; u.mu is held.
func (u *netUpstream) holdChan(key string) chan struct{} {
	ch := u.holds[key]
	if ch == nil {
		ch = make(chan struct{})
		u.holds[key] = ch
	}
	return ch
}

// serveFile makes the upstream answer path with data.
func (u *netUpstream) serveFile(path string, data []byte) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.files[path] = data
}

// holding reports how many requests wait in /hold/<key>.
func (u *netUpstream) holding(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.holdWait[key]
}

// release lets every request waiting in /hold/<key> answer.
func (u *netUpstream) release(key string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if ch := u.holdChan(key); ch != nil {
		close(ch)
		delete(u.holds, key)
	}
}

// requests returns the recorded requests for path.
func (u *netUpstream) requests(path string) []upstreamReq {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []upstreamReq
	for _, r := range u.reqs {
		if r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

// sniCount is how many TLS handshakes named name so far.
func (u *netUpstream) sniCount(name string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.snis[name]
}

// echoCount is how many raw TCP echo connections were accepted so far.
func (u *netUpstream) echoCount() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.echoes
}

// udpCount is how many datagrams reached the upstream's UDP port 443.
func (u *netUpstream) udpCount() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.udp
}

// canaryCount is how many connections reached the private canary.
func (u *netUpstream) canaryCount() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.canary
}

func (u *netUpstream) serveEcho(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		u.mu.Lock()
		u.echoes++
		u.mu.Unlock()
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
			_, _ = io.Copy(c, c)
		}()
	}
}

func (u *netUpstream) serveCanary(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		u.mu.Lock()
		u.canary++
		u.mu.Unlock()
		c.Close()
	}
}

// ---------------------------------------------------------------------
// DNS.

// fakeDNS is the authoritative server the corral servers resolve with
// (Config.EgressResolver). It records every name it was asked.
type fakeDNS struct {
	addr    string
	up      netip.Addr
	private netip.Addr

	mu      sync.Mutex
	queries []string       // guarded by mu
	rebinds map[string]int // A queries per rebind-* name; guarded by mu
	local   netip.Addr     // what hostLocal resolves to (none: NXDOMAIN); guarded by mu
}

// setLocal makes hostLocal resolve to a.
func (d *fakeDNS) setLocal(a netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.local = a
}

func newFakeDNS(t *testing.T, up, private netip.Addr) *fakeDNS {
	t.Helper()
	d := &fakeDNS{up: up, private: private, rebinds: map[string]int{}}
	var pc net.PacketConn
	var ln net.Listener
	for try := 0; try < 20 && ln == nil; try++ {
		p, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp4", p.LocalAddr().String())
		if err != nil {
			p.Close()
			continue
		}
		pc, ln = p, l
	}
	if ln == nil {
		t.Fatal("no free port for the test DNS server")
	}
	d.addr = ln.Addr().String()
	udp := &dns.Server{PacketConn: pc, Handler: d}
	tcp := &dns.Server{Listener: ln, Handler: d}
	var wg sync.WaitGroup
	for _, s := range []*dns.Server{udp, tcp} {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		wg.Add(1)
		go func() { defer wg.Done(); _ = s.ActivateAndServe() }()
		<-started
	}
	t.Cleanup(func() {
		_ = udp.Shutdown()
		_ = tcp.Shutdown()
		wg.Wait()
	})
	return d
}

// ServeDNS answers A queries for the test names; AAAA gets no records.
// A name rebind-*.test rebinds: its first A query gets the upstream's
// address, every later one 127.0.0.1 (threat-model.md #10).
func (d *fakeDNS) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	for _, q := range r.Question {
		name := strings.TrimSuffix(strings.ToLower(q.Name), ".")
		d.mu.Lock()
		d.queries = append(d.queries, name)
		d.mu.Unlock()
		var a netip.Addr
		switch {
		case name == hostAllowed, name == hostSecret, name == hostOther, strings.HasSuffix(name, "."+exfilZone):
			a = d.up
		case name == hostPrivate:
			a = d.private
		case name == hostLoopback:
			a = netip.MustParseAddr("127.0.0.1")
		case name == hostLocal && d.localAddr().IsValid():
			a = d.localAddr()
		case strings.HasPrefix(name, "rebind-") && strings.HasSuffix(name, ".test"):
			a = netip.MustParseAddr("127.0.0.1")
			if q.Qtype == dns.TypeA {
				d.mu.Lock()
				if d.rebinds[name]++; d.rebinds[name] == 1 {
					a = d.up
				}
				d.mu.Unlock()
			}
		default:
			m.Rcode = dns.RcodeNameError
			continue
		}
		if q.Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5},
				A:   a.AsSlice(),
			})
		}
	}
	_ = w.WriteMsg(m)
}

func (d *fakeDNS) localAddr() netip.Addr {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.local
}

// asked reports whether the server was ever asked for name.
func (d *fakeDNS) asked(name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, q := range d.queries {
		if q == name || strings.HasPrefix(q, name+".") {
			return true
		}
	}
	return false
}

// ---------------------------------------------------------------------
// corral servers.

// syncBuffer is a bytes.Buffer safe for concurrent writers (the server's
// log handler).
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// netServer is a corral server of the network tests.
type netServer struct {
	ts   *testserver.Server
	c    *corral.Client
	log  *syncBuffer // every server log line, at debug level
	tag  string      // instance tag: nftables table corral_<tag>
	rng  netip.Prefix
	once sync.Once
	cerr error
}

// close stops the server once.
func (s *netServer) close() error {
	s.once.Do(func() { s.cerr = s.ts.Close() })
	return s.cerr
}

// freeRange picks a /24 of 10.0.0.0/8 for a server's sandboxes that no
// host address or route uses, away from corral's default 10.201.0.0/16.
func freeRange(t *testing.T) netip.Prefix {
	t.Helper()
	for try := 0; try < 64; try++ {
		b := randBytes(t, 2)
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 210 + b[0]%30, b[1], 0}), 24)
		if !hostUses(p) {
			return p
		}
	}
	t.Fatal("no free /24 for sandbox addresses")
	return netip.Prefix{}
}

func startNetServer(t *testing.T, fx *netFixture, name string, configure func(*server.Config)) *netServer {
	t.Helper()
	s, err := tryStartNetServer(t, fx, name, configure)
	if err != nil {
		t.Fatalf("start %s server: %v", name, err)
	}
	return s
}

// tryStartNetServer starts a corral server that resolves with the fixture's
// DNS server, trusts the upstream's CA and logs (at debug level) into a
// buffer the tests search; errors also go to stderr. It is closed in
// t.Cleanup, which also prints the log's tail if t failed.
func tryStartNetServer(t *testing.T, fx *netFixture, name string, configure func(*server.Config)) (*netServer, error) {
	s := &netServer{log: &syncBuffer{}, rng: freeRange(t)}
	ts, err := testserver.StartWith("../../cmd/corral", slog.LevelWarn, func(c *server.Config) {
		c.EgressResolver = fx.dns.addr
		c.EgressUpstreamCA = fx.up.caFile
		c.NetworkRange = s.rng
		c.Log = slog.New(slog.NewMultiHandler(
			slog.NewTextHandler(s.log, &slog.HandlerOptions{Level: slog.LevelDebug}),
			slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}),
		))
		if configure != nil {
			configure(c)
		}
	})
	if err != nil {
		return nil, err
	}
	s.ts = ts
	s.c = corral.New(ts.URL, ts.Key)
	sum := sha256.Sum256([]byte(ts.DataDir))
	s.tag = hex.EncodeToString(sum[:])[:5]
	t.Cleanup(func() {
		if t.Failed() {
			lines := strings.Split(s.log.String(), "\n")
			if len(lines) > 60 {
				lines = lines[len(lines)-60:]
			}
			t.Logf("%s server log (tail):\n%s", name, strings.Join(lines, "\n"))
		}
		if err := s.close(); err != nil {
			t.Errorf("close %s server: %v", name, err)
		}
	})
	return s, nil
}

// ---------------------------------------------------------------------
// Sandbox helpers.

// newSandbox creates a sandbox on s, with the upstream's CA written to
// upstreamCAPath, and kills it in t.Cleanup.
func (fx *netFixture) newSandbox(t *testing.T, s *netServer, opts corral.CreateOptions) *corral.Sandbox {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = 10 * time.Minute
	}
	if opts.Runtime == "" {
		opts.Runtime = fx.runtime
	}
	ctx := context.Background()
	sb, err := s.c.Create(ctx, opts)
	if err != nil {
		t.Fatalf("create sandbox (network %q, allow %q): %v", opts.Network, opts.Allow, err)
	}
	t.Cleanup(func() { _, _ = s.c.Kill(context.Background(), sb.ID) })
	if err := sb.Files().Write(ctx, upstreamCAPath, fx.up.caPEM); err != nil {
		t.Fatalf("write the upstream CA into the sandbox: %v", err)
	}
	return sb
}

// runIn runs a bash command in sb and returns its result; it fails the
// test only when the command could not be run.
func runIn(t *testing.T, sb *corral.Sandbox, cmd string, opts ...corral.RunOptions) *corral.CommandResult {
	t.Helper()
	var o corral.RunOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Minute
	}
	res, err := sb.Run(context.Background(), cmd, o)
	if err != nil {
		t.Fatalf("run %q: %v", cmd, err)
	}
	return res
}

// curlResult is the outcome of one curl in a sandbox.
type curlResult struct {
	Exit   int    // curl's exit code
	Code   int    // HTTP status (0: none)
	Body   string // response body
	Stderr string
}

// curl runs curl with args (shell words) in sb. curl's own time limit
// turns a hang into exit code 28, which tests reject where an immediate
// answer is expected.
func curl(t *testing.T, sb *corral.Sandbox, args string) curlResult {
	t.Helper()
	res := runIn(t, sb, "curl -sS --max-time 30 -w '\\n%{http_code}' "+args)
	out := strings.TrimSuffix(res.Stdout, "\n")
	cr := curlResult{Exit: res.ExitCode, Stderr: res.Stderr}
	if i := strings.LastIndex(out, "\n"); i >= 0 {
		cr.Body, out = out[:i], out[i+1:]
	}
	cr.Code, _ = strconv.Atoi(strings.TrimSpace(out))
	return cr
}

// egressEvent is the data of an egress audit event.
type egressEvent struct {
	ID         int64  `json:"-"`
	Kind       string `json:"-"`
	Host       string `json:"host"`
	Addr       string `json:"addr"`
	Port       int    `json:"port"`
	Method     string `json:"method"`
	BytesUp    int64  `json:"bytes_up"`
	BytesDown  int64  `json:"bytes_down"`
	DurationMS int64  `json:"duration_ms"`
	Verdict    string `json:"verdict"`
	Reason     string `json:"reason"`
}

func (e egressEvent) String() string {
	return fmt.Sprintf("#%d %s %s host=%s addr=%s port=%d verdict=%s reason=%q up=%d down=%d",
		e.ID, e.Kind, e.Method, e.Host, e.Addr, e.Port, e.Verdict, e.Reason, e.BytesUp, e.BytesDown)
}

// egressEvents returns sb's egress audit events with an id above after.
func egressEvents(t *testing.T, s *netServer, sandbox string, after int64) []egressEvent {
	t.Helper()
	evs, err := s.c.Audit(context.Background(), corral.AuditQuery{Sandbox: sandbox, Kind: "egress.", After: after})
	if err != nil {
		t.Fatalf("audit: %v", err)
	}
	out := make([]egressEvent, 0, len(evs))
	for _, ev := range evs {
		var e egressEvent
		if err := json.Unmarshal(ev.Data, &e); err != nil {
			t.Fatalf("audit event %d: %v: %s", ev.ID, err, ev.Data)
		}
		e.ID, e.Kind = ev.ID, ev.Kind
		out = append(out, e)
	}
	return out
}

// auditMark is the id of sb's last audit event (0: none), so that a
// later search sees only what came after.
func auditMark(t *testing.T, s *netServer, sandbox string) int64 {
	t.Helper()
	evs, err := s.c.Audit(context.Background(), corral.AuditQuery{Sandbox: sandbox})
	if err != nil {
		t.Fatalf("audit: %v", err)
	}
	if len(evs) == 0 {
		return 0
	}
	return evs[len(evs)-1].ID
}

// waitEgressEvent waits for an egress event of sb after mark that
// matches; the proxy records an allowed attempt once it has finished,
// which may be just after the sandbox saw the response. It fails the test
// with every event seen if none matches.
func waitEgressEvent(t *testing.T, s *netServer, sandbox string, mark int64, what string, match func(egressEvent) bool) egressEvent {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs := egressEvents(t, s, sandbox, mark)
		for _, e := range evs {
			if match(e) {
				return e
			}
		}
		if time.Now().After(deadline) {
			var lines []string
			for _, e := range evs {
				lines = append(lines, e.String())
			}
			t.Fatalf("no audit event %s among:\n%s", what, strings.Join(lines, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
