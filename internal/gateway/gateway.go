// Package gateway runs the host side of every sandbox's network: one
// transparent proxy listener and one DNS filter shared by all sandboxes of
// a server, the per-sandbox veth pairs and nftables rules (package netns),
// and the table that maps a sandbox's address to its identity, egress
// policy, caps and brokered secrets. A sandbox is identified by the source
// address of its connections; the nftables rules make sure it cannot use
// another's.
package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/inroot"
	"github.com/corralhq/corral/internal/netns"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/proto/agentproto"
)

// ExplicitProxyPort is the port of the explicit (HTTP_PROXY) proxy on a
// sandbox's gateway address. Nothing listens on it: the connection is
// redirected like all TCP and recognised by its original destination.
const ExplicitProxyPort = 3128

// Config configures a [Gateway].
type Config struct {
	// Range numbers the veth pairs (default netns.DefaultRange).
	Range netip.Prefix
	// Instance tells corral servers on one host apart (1-5 of [a-z0-9]).
	Instance string
	// Dir holds the namespace files, resolv.conf and CA bundles.
	Dir string
	// Resolver resolves names for the proxy and the DNS filter. Nil means
	// the host's resolver (Go's, reading /etc/resolv.conf).
	Resolver egress.Resolver
	// CA, when set, lets the proxy intercept TLS to hosts a sandbox has a
	// secret for.
	CA *egress.CA
	// UpstreamRoots verifies upstream TLS when intercepting (nil: system).
	UpstreamRoots *x509.CertPool
	// Log receives proxy and DNS logs; wrap it with egress.NewSlogHandler.
	Log *slog.Logger
	// OnEvent receives every egress attempt (proxy and DNS), except the
	// refusals Summary counts instead.
	OnEvent func(egress.Event)
	// Summary, when set, summarises each sandbox's refusals past its rate
	// (proxy and DNS share it).
	Summary *egress.Summarizer
}

// Gateway is the host side of sandbox networking.
type Gateway struct {
	cfg   Config
	nets  *netns.Manager
	proxy *egress.Proxy
	dns   *egress.DNSFilter

	proxyLn    net.Listener
	dnsUDP     net.PacketConn
	dnsTCP     net.Listener
	explicit   *http.Server
	explicitLn *connListener

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	resolvConf string

	mu     sync.RWMutex
	byAddr map[netip.Addr]*entry
	byID   map[string]*entry
}

type entry struct {
	link   *netns.Link
	client egress.Client
}

// New opens the listeners, installs the nftables table and starts serving.
func New(cfg Config) (*Gateway, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Resolver == nil {
		cfg.Resolver = &net.Resolver{PreferGo: true}
	}
	if err := os.MkdirAll(cfg.Dir, 0o711); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g := &Gateway{cfg: cfg, byAddr: map[netip.Addr]*entry{}, byID: map[string]*entry{}}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	ok := false
	defer func() {
		if !ok {
			g.closeListeners()
		}
	}()
	var err error
	// The listeners take all addresses: connections reach them only by
	// the nftables redirect; the table refuses their ports from any
	// interface other than loopback and the sandboxes'.
	if g.proxyLn, err = net.Listen("tcp4", "0.0.0.0:0"); err != nil {
		return nil, fmt.Errorf("gateway: proxy listener: %w", err)
	}
	if g.dnsUDP, g.dnsTCP, err = listenDNS(); err != nil {
		return nil, err
	}
	g.proxy = egress.NewProxy(egress.ProxyConfig{
		Client:        g.lookup,
		Resolver:      cfg.Resolver,
		CA:            cfg.CA,
		UpstreamRoots: cfg.UpstreamRoots,
		Log:           cfg.Log,
		OnEvent:       cfg.OnEvent,
		Summary:       cfg.Summary,
	})
	g.dns = egress.NewDNSFilter(egress.DNSFilterConfig{
		Policy: func(a netip.Addr) (egress.Policy, string, bool) {
			c, ok := g.lookup(a)
			return c.Policy, c.ID, ok
		},
		Resolver: cfg.Resolver,
		Log:      cfg.Log,
		OnEvent:  cfg.OnEvent,
		Summary:  cfg.Summary,
	})
	dir := filepath.Join(cfg.Dir, "netns")
	g.nets, err = netns.New(netns.Config{
		Range: cfg.Range, Instance: cfg.Instance, NSDir: dir,
		ProxyPort: port(g.proxyLn.Addr()), DNSPort: port(g.dnsTCP.Addr()),
	})
	if err != nil {
		return nil, err
	}
	g.resolvConf = filepath.Join(cfg.Dir, "resolv.conf")
	rc := fmt.Sprintf("# corral: every DNS query goes to corral's DNS filter\nnameserver %s\noptions edns0 attempts:2 timeout:2\n", g.nets.DNSServer())
	if err := writeFileAtomic(g.resolvConf, []byte(rc), 0o644); err != nil {
		g.nets.Close()
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g.explicitLn = newConnListener()
	g.explicit = g.proxy.Server("")
	g.wg.Add(3)
	go func() { defer g.wg.Done(); _ = g.explicit.Serve(g.explicitLn) }()
	go func() { defer g.wg.Done(); _ = g.dns.Serve(g.ctx, g.dnsUDP, g.dnsTCP) }()
	go func() { defer g.wg.Done(); g.acceptLoop() }()
	ok = true
	return g, nil
}

func port(a net.Addr) uint16 {
	switch v := a.(type) {
	case *net.TCPAddr:
		return uint16(v.Port)
	case *net.UDPAddr:
		return uint16(v.Port)
	}
	return 0
}

// listenDNS binds UDP and TCP on the same free port.
func listenDNS() (net.PacketConn, net.Listener, error) {
	var last error
	for try := 0; try < 20; try++ {
		pc, err := net.ListenPacket("udp4", "0.0.0.0:0")
		if err != nil {
			return nil, nil, fmt.Errorf("gateway: DNS listener: %w", err)
		}
		ln, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", port(pc.LocalAddr())))
		if err == nil {
			return pc, ln, nil
		}
		pc.Close()
		last = err
	}
	return nil, nil, fmt.Errorf("gateway: DNS listener: %w", last)
}

// acceptLoop serves redirected connections: those to ExplicitProxyPort of
// an address in the sandbox range (a gateway; after a server restart the
// sandbox's may have changed) go to the explicit proxy, all others to the
// transparent proxy. Either way the client is identified by its source
// address, never by the address it dialled.
func (g *Gateway) acceptLoop() {
	for {
		c, err := g.proxyLn.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			g.cfg.Log.Warn("gateway accept", "err", err)
			continue
		}
		go g.serveConn(c)
	}
}

func (g *Gateway) serveConn(c net.Conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		return
	}
	orig, err := egress.OriginalDst(tc)
	if err != nil {
		// Not redirected (a host process dialled the port): refuse.
		_ = tc.SetLinger(0)
		c.Close()
		return
	}
	if orig.Port() == ExplicitProxyPort && g.nets.Range().Contains(orig.Addr()) {
		if !g.explicitLn.push(c) {
			c.Close()
		}
		return
	}
	g.proxy.ServeTransparent(g.ctx, c, orig)
}

// lookup is the proxy's and DNS filter's view of who is asking.
func (g *Gateway) lookup(a netip.Addr) (egress.Client, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	e := g.byAddr[a.Unmap()]
	if e == nil {
		return egress.Client{}, false
	}
	return e.client, true
}

// Reserve holds addresses for a sandbox that gets its veth pair with
// Attach once it runs.
func (g *Gateway) Reserve(id string) (*netns.Link, error) { return g.nets.Reserve(id) }

// Reserved reports whether id holds addresses but has no veth pair yet.
func (g *Gateway) Reserved(id string) bool { return g.nets.Reserved(id) }

// Attach adds a veth pair to a running sandbox's namespace (nsPath). Until
// [Gateway.Set] is called every request from it is refused.
func (g *Gateway) Attach(id, nsPath string) (*netns.Link, error) {
	l, err := g.nets.AttachTo(id, nsPath)
	if err != nil {
		return nil, err
	}
	g.register(l)
	return l, nil
}

// Create makes a network namespace with a veth pair for a sandbox about
// to start in it (Link.NSPath): gVisor's network stack takes the
// namespace's interfaces over when it starts. Until [Gateway.Set] is
// called every request from it is refused.
func (g *Gateway) Create(id string) (*netns.Link, error) {
	l, err := g.nets.Create(id)
	if err != nil {
		return nil, err
	}
	g.register(l)
	return l, nil
}

func (g *Gateway) register(l *netns.Link) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := &entry{link: l, client: egress.Client{ID: l.ID}}
	g.byAddr[l.Addr] = e
	g.byID[l.ID] = e
}

// Set installs (or replaces) sandbox id's identity, policy, caps and
// secrets; it takes effect on the next connection or query.
func (g *Gateway) Set(id string, c egress.Client) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.byID[id]
	if e == nil {
		return fmt.Errorf("gateway: sandbox %s has no network", id)
	}
	c.ID = id
	e.client = c
	return nil
}

// Link returns sandbox id's veth pair, if it has one.
func (g *Gateway) Link(id string) (*netns.Link, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	e := g.byID[id]
	if e == nil {
		return nil, false
	}
	return e.link, true
}

// Remove deletes sandbox id's network and forgets it. Open connections of
// the sandbox break with the veth pair.
func (g *Gateway) Remove(id string) error {
	g.mu.Lock()
	if e := g.byID[id]; e != nil {
		delete(g.byAddr, e.link.Addr)
		delete(g.byID, id)
	}
	g.mu.Unlock()
	g.proxy.Forget(id)
	g.cfg.Summary.Forget(id)
	return g.nets.Remove(id)
}

// Adopt is run at start-up: veth pairs left by a crashed server are kept
// for sandboxes keep reports live (and registered with a deny-all client
// until Set) and removed otherwise.
func (g *Gateway) Adopt(keep func(id string) bool) ([]*netns.Link, error) {
	links, _, err := g.nets.Adopt(keep)
	for _, l := range links {
		g.register(l)
	}
	return links, err
}

// Ensure reinstalls the nftables table if it went missing; see
// netns.Manager.Ensure.
func (g *Gateway) Ensure() (bool, error) { return g.nets.Ensure() }

// Reap removes veth pairs and rules of sandboxes that are not registered
// here and that keep does not report live; it returns their ids.
func (g *Gateway) Reap(keep func(id string) bool) []string { return g.nets.Reap(keep) }

// Usage returns sandbox id's current egress counters.
func (g *Gateway) Usage(id string) egress.Usage { return g.proxy.Usage(id) }

// ResolvConf is the host file to bind-mount at /etc/resolv.conf.
func (g *Gateway) ResolvConf() string { return g.resolvConf }

// ProxyEnv returns the proxy variables for a sandbox with link l.
func ProxyEnv(l *netns.Link) map[string]string {
	u := fmt.Sprintf("http://%s:%d", l.Gateway, ExplicitProxyPort)
	return map[string]string{
		"HTTP_PROXY": u, "HTTPS_PROXY": u, "http_proxy": u, "https_proxy": u,
		"NO_PROXY": "localhost,127.0.0.1,::1", "no_proxy": "localhost,127.0.0.1,::1",
	}
}

// Close stops serving, removes every veth pair and the nftables table.
func (g *Gateway) Close() error {
	g.cancel()
	g.closeListeners()
	err := g.nets.Close()
	g.wg.Wait()
	return err
}

func (g *Gateway) closeListeners() {
	if g.proxyLn != nil {
		g.proxyLn.Close()
	}
	if g.dnsUDP != nil {
		g.dnsUDP.Close()
	}
	if g.dnsTCP != nil {
		g.dnsTCP.Close()
	}
	if g.explicit != nil {
		g.explicit.Close()
	}
	if g.explicitLn != nil {
		g.explicitLn.Close()
	}
}

func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// connListener is a net.Listener fed with connections by push.
type connListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newConnListener() *connListener {
	return &connListener{ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *connListener) push(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4zero} }

// Paths inside a sandbox that trusts the egress CA.
const (
	// SandboxCABundle is the system CA bundle of Debian-based templates.
	SandboxCABundle = agentproto.CABundle
	// SandboxCAFile holds the egress CA alone.
	SandboxCAFile = agentproto.CAFile
)

// MaxCABundleBytes bounds the template CA bundle corral reads to append
// the egress CA (Debian's is about 200 KiB).
const MaxCABundleBytes = 8 << 20

// TrustFiles returns what makes a sandbox of the template at rootfs trust
// the egress CA (only sandboxes that use secrets get it): the template's
// CA bundle with the CA appended, bind-mounted over SandboxCABundle; the CA
// alone at SandboxCAFile; and env vars for tools that keep their own trust
// store (Python requests, Node.js). The template's bundle is read with
// inroot.ReadFile, resolved as the sandbox resolves it: a bundle that links
// to a host file (DATA/ca/ca-key.pem) cannot put that file in the
// sandbox; one that is not a regular file or is over MaxCABundleBytes is
// an inroot.RefusedError.
func (g *Gateway) TrustFiles(rootfs string) ([]runtime.FileBind, map[string]string, error) {
	if g.cfg.CA == nil {
		return nil, nil, errors.New("no egress CA configured")
	}
	ca := g.cfg.CA.CertPEM()
	caFile := filepath.Join(g.cfg.Dir, "egress-ca.pem")
	if err := writeFileAtomic(caFile, ca, 0o644); err != nil {
		return nil, nil, err
	}
	// The bundle is template content: read inside the template's root
	// (a link to the host's CA key or admin key resolves inside it).
	bundle, err := inroot.ReadFile(rootfs, SandboxCABundle, MaxCABundleBytes)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("read template CA bundle: %w", err)
	}
	sum := sha256.Sum256(append(bundle, ca...))
	bundleFile := filepath.Join(g.cfg.Dir, "ca-bundle-"+hex.EncodeToString(sum[:8])+".crt")
	if _, err := os.Stat(bundleFile); err != nil {
		b := append(append(slices.Clone(bundle), '\n'), ca...)
		if err := writeFileAtomic(bundleFile, b, 0o644); err != nil {
			return nil, nil, err
		}
	}
	files := []runtime.FileBind{
		{Source: bundleFile, Destination: SandboxCABundle},
		{Source: caFile, Destination: SandboxCAFile},
	}
	return files, TrustEnv(), nil
}

// TrustEnv is the environment that points tools keeping their own trust
// store (Python requests, curl, Node.js) at SandboxCABundle and
// SandboxCAFile.
func TrustEnv() map[string]string {
	return map[string]string{
		"SSL_CERT_FILE":       SandboxCABundle,
		"REQUESTS_CA_BUNDLE":  SandboxCABundle,
		"CURL_CA_BUNDLE":      SandboxCABundle,
		"NODE_EXTRA_CA_CERTS": SandboxCAFile,
	}
}
