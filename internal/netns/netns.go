// Package netns is the host-side plumbing of a sandbox's network: a network
// namespace, a veth pair with addresses from a configured IPv4 range, and the
// nftables rules that make the egress proxy and the DNS filter the only
// things a sandbox can reach.
//
// A sandbox's traffic never leaves the host by routing. The rules, in one
// nftables table that this package owns (and deletes on Close):
//
//   - prerouting (nat): from a sandbox interface, IPv4 TCP and UDP to port 53
//     are redirected to the DNS filter; every other IPv4 TCP connection is
//     redirected to the transparent proxy; other UDP is redirected to a
//     closed port so that it is rejected below.
//   - input (filter): from a sandbox interface, only the proxy and DNS ports
//     are accepted, and only from the sandbox's own address (no spoofing);
//     everything else is rejected (TCP reset, ICMP admin-prohibited), so a
//     refusal is immediate. The proxy and DNS ports are refused from every
//     other interface except loopback.
//   - forward (filter): everything from or to a sandbox interface is dropped,
//     whatever the host's ip_forward setting.
//
// Interfaces are named <prefix><hash of sandbox id> and carry the sandbox id
// as their alias, so that a restarted server can find and reclaim them.
package netns

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// DefaultRange is the IPv4 range sandbox veth pairs are numbered from when
// [Config.Range] is unset. Each sandbox takes a /30 of it; the first /30 is
// reserved (its first address is the DNS server named in resolv.conf).
var DefaultRange = netip.MustParsePrefix("10.201.0.0/16")

// MaxRangeBits is the longest prefix a range may have: a /28 holds the
// reserved /30 and three sandboxes.
const MaxRangeBits = 28

// CheckRange refuses a veth range that is not IPv4 or smaller than a /28.
func CheckRange(p netip.Prefix) error {
	if !p.IsValid() || !p.Addr().Is4() || p.Bits() > MaxRangeBits {
		return fmt.Errorf("range %s: need an IPv4 prefix of /%d or larger", p, MaxRangeBits)
	}
	return nil
}

// SandboxIfName is the name of the sandbox's interface inside its namespace.
const SandboxIfName = "eth0"

// Config configures a [Manager].
type Config struct {
	// Range is the IPv4 range to number veth pairs from; at least a /28.
	// Zero means [DefaultRange].
	Range netip.Prefix
	// Instance distinguishes corral servers on one host (derived from the
	// data directory): it names the nftables table and prefixes interface
	// names. At most 5 characters of [a-z0-9].
	Instance string
	// NSDir is where named network namespaces are bind-mounted.
	NSDir string
	// ProxyPort is the host port of the transparent proxy listener.
	ProxyPort uint16
	// DNSPort is the host port (UDP and TCP) of the DNS filter.
	DNSPort uint16
}

// Link is one sandbox's veth pair.
type Link struct {
	// ID is the sandbox id.
	ID string
	// HostIf is the host-side interface name.
	HostIf string
	// Gateway is the host-side address; the sandbox's default route.
	Gateway netip.Addr
	// Addr is the sandbox-side address.
	Addr netip.Addr
	// NSPath is the bind-mounted namespace file when the namespace was made
	// by [Manager.Create]; "" when the veth was attached to a namespace the
	// runtime made.
	NSPath string
}

// Manager creates and removes sandbox networks and owns the nftables table.
type Manager struct {
	cfg    Config
	prefix string // interface name prefix
	table  string // nftables table name

	mu       sync.Mutex
	links    map[string]*Link // by sandbox id
	reserved map[string]*Link // addresses held for a later AttachTo
	slots    map[int]string   // slot -> sandbox id
}

// New checks cfg, installs the nftables table (replacing a stale one of the
// same instance) and returns the manager.
func New(cfg Config) (*Manager, error) {
	if !cfg.Range.IsValid() {
		cfg.Range = DefaultRange
	}
	cfg.Range = cfg.Range.Masked()
	if err := CheckRange(cfg.Range); err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	if len(cfg.Instance) == 0 || len(cfg.Instance) > 5 || strings.Trim(cfg.Instance, "abcdefghijklmnopqrstuvwxyz0123456789") != "" {
		return nil, fmt.Errorf("netns: instance %q: need 1 to 5 characters of [a-z0-9]", cfg.Instance)
	}
	if cfg.ProxyPort == 0 || cfg.DNSPort == 0 {
		return nil, errors.New("netns: proxy and DNS ports are required")
	}
	if err := os.MkdirAll(cfg.NSDir, 0o700); err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	m := &Manager{
		cfg:      cfg,
		prefix:   "cr" + cfg.Instance,
		table:    "corral_" + cfg.Instance,
		links:    map[string]*Link{},
		reserved: map[string]*Link{},
		slots:    map[int]string{},
	}
	if err := m.installTable(); err != nil {
		return nil, err
	}
	return m, nil
}

// DNSServer is the address resolv.conf names. Any address works (the rules
// redirect every port-53 packet to the DNS filter); this one is routed via
// the sandbox's default route and belongs to no sandbox.
func (m *Manager) DNSServer() netip.Addr { return m.cfg.Range.Addr().Next() }

// Range is the configured address range.
func (m *Manager) Range() netip.Prefix { return m.cfg.Range }

// IfPrefix is the prefix of every host-side interface of this instance.
func (m *Manager) IfPrefix() string { return m.prefix }

// ifName is the host-side interface name of sandbox id (15 bytes at most).
func (m *Manager) ifName(id string) string {
	sum := sha256.Sum256([]byte(id))
	return (m.prefix + hex.EncodeToString(sum[:]))[:unix.IFNAMSIZ-1]
}

// Lookup returns the link of sandbox id, if it has one.
func (m *Manager) Lookup(id string) (*Link, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.links[id]
	return l, ok
}

// Reserve holds a /30 for sandbox id before its namespace exists; a later
// AttachTo uses it. The returned link has no interface yet.
func (m *Manager) Reserve(id string) (*Link, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.links[id] != nil || m.reserved[id] != nil {
		return nil, fmt.Errorf("netns: sandbox %s already has a network", id)
	}
	slot, gw, addr, err := m.allocate()
	if err != nil {
		return nil, err
	}
	l := &Link{ID: id, HostIf: m.ifName(id), Gateway: gw, Addr: addr}
	m.slots[slot] = id
	m.reserved[id] = l
	return l, nil
}

// Reserved reports whether id holds addresses but no veth pair yet.
func (m *Manager) Reserved(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reserved[id] != nil
}

// Create makes a new network namespace for sandbox id, bind-mounted under
// NSDir, with loopback up and a veth pair to the host. The runtime then
// runs the sandbox in Link.NSPath.
func (m *Manager) Create(id string) (*Link, error) {
	path := filepath.Join(m.cfg.NSDir, id)
	ns, err := newNamedNS(path)
	if err != nil {
		return nil, fmt.Errorf("netns: create namespace for %s: %w", id, err)
	}
	defer ns.Close()
	l, err := m.attach(id, ns)
	if err != nil {
		unmountNS(path)
		return nil, err
	}
	l.NSPath = path
	return l, nil
}

// AttachTo adds a veth pair to an existing namespace (nsPath, for example
// /proc/PID/ns/net of a running sandbox).
func (m *Manager) AttachTo(id, nsPath string) (*Link, error) {
	ns, err := vnetns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("netns: open %s: %w", nsPath, err)
	}
	defer ns.Close()
	return m.attach(id, ns)
}

func (m *Manager) attach(id string, ns vnetns.NsHandle) (l *Link, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.links[id]; ok {
		return nil, fmt.Errorf("netns: sandbox %s already has a network", id)
	}
	var slot int
	var gw, addr netip.Addr
	if r := m.reserved[id]; r != nil {
		slot, gw, addr = m.slotOf(r.Addr), r.Gateway, r.Addr
	} else {
		slot, gw, addr, err = m.allocate()
		if err != nil {
			return nil, err
		}
	}
	hostIf := m.ifName(id)
	peer := "crtmp" + hostIf[len(m.prefix):]
	if len(peer) > unix.IFNAMSIZ-1 {
		peer = peer[:unix.IFNAMSIZ-1]
	}
	// Leftovers of a crash would make LinkAdd fail; remove them.
	if old, err := netlink.LinkByName(hostIf); err == nil {
		_ = netlink.LinkDel(old)
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: hostIf, Alias: id},
		PeerName:      peer,
		PeerNamespace: netlink.NsFd(int(ns)),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("netns: add veth for %s: %w", id, err)
	}
	defer func() {
		if err != nil {
			if hl, e := netlink.LinkByName(hostIf); e == nil {
				_ = netlink.LinkDel(hl)
			}
			_ = m.deleteSandboxRules(id)
		}
	}()
	host, err := netlink.LinkByName(hostIf)
	if err != nil {
		return nil, fmt.Errorf("netns: find %s: %w", hostIf, err)
	}
	if err := netlink.LinkSetAlias(host, id); err != nil {
		return nil, fmt.Errorf("netns: alias %s: %w", hostIf, err)
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipNet(gw, 30)}); err != nil {
		return nil, fmt.Errorf("netns: address %s: %w", hostIf, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return nil, fmt.Errorf("netns: up %s: %w", hostIf, err)
	}
	if err := configureInside(ns, peer, gw, addr); err != nil {
		return nil, fmt.Errorf("netns: configure namespace of %s: %w", id, err)
	}
	// IPv4 only: without IPv6 on either end, an IPv6 connection fails at
	// once instead of waiting on neighbour discovery that is rejected.
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+hostIf+"/disable_ipv6", []byte("1"), 0)
	if err := inNamespace(ns, func() error {
		err := os.WriteFile("/proc/sys/net/ipv6/conf/"+SandboxIfName+"/disable_ipv6", []byte("1"), 0)
		if errors.Is(err, os.ErrNotExist) {
			return nil // IPv6 is off on this host
		}
		return err
	}); err != nil {
		return nil, fmt.Errorf("netns: disable IPv6 in %s: %w", id, err)
	}
	if err := m.addSandboxRules(id, hostIf, addr); err != nil {
		return nil, err
	}
	l = &Link{ID: id, HostIf: hostIf, Gateway: gw, Addr: addr}
	m.links[id] = l
	m.slots[slot] = id
	delete(m.reserved, id)
	return l, nil
}

// configureInside renames the peer to eth0, numbers it, brings it and
// loopback up and adds the default route, all through a netlink handle in
// the sandbox's namespace (the calling thread never changes namespace).
func configureInside(ns vnetns.NsHandle, peer string, gw, addr netip.Addr) error {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("up lo: %w", err)
	}
	in, err := h.LinkByName(peer)
	if err != nil {
		return fmt.Errorf("find %s: %w", peer, err)
	}
	if err := h.LinkSetName(in, SandboxIfName); err != nil {
		return fmt.Errorf("rename %s: %w", peer, err)
	}
	if err := h.AddrAdd(in, &netlink.Addr{IPNet: ipNet(addr, 30)}); err != nil {
		return fmt.Errorf("address: %w", err)
	}
	if err := h.LinkSetUp(in); err != nil {
		return fmt.Errorf("up: %w", err)
	}
	route := &netlink.Route{LinkIndex: in.Attrs().Index, Gw: net.IP(gw.AsSlice()), Dst: nil}
	if err := h.RouteAdd(route); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}

// allocate picks the lowest free /30 whose addresses no host interface
// already uses. m.mu is held.
func (m *Manager) allocate() (slot int, gw, addr netip.Addr, err error) {
	used := map[netip.Addr]bool{}
	if addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4); err == nil {
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
				used[ip] = true
			}
		}
	}
	n := 1 << (32 - m.cfg.Range.Bits()) / 4
	base := m.cfg.Range.Addr().As4()
	b := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	for s := 1; s < n; s++ {
		if _, taken := m.slots[s]; taken {
			continue
		}
		g := u32Addr(b + uint32(s)*4 + 1)
		a := u32Addr(b + uint32(s)*4 + 2)
		if used[g] || used[a] {
			continue
		}
		return s, g, a, nil
	}
	return 0, netip.Addr{}, netip.Addr{}, fmt.Errorf("netns: address range %s is exhausted", m.cfg.Range)
}

func u32Addr(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, 32)}
}

func (m *Manager) slotOf(a netip.Addr) int {
	base := m.cfg.Range.Addr().As4()
	x := a.As4()
	b := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	v := uint32(x[0])<<24 | uint32(x[1])<<16 | uint32(x[2])<<8 | uint32(x[3])
	return int((v - b) / 4)
}

// Remove deletes sandbox id's veth pair (both ends), its rules and its
// namespace file. Removing a sandbox without a network is not an error.
func (m *Manager) Remove(id string) error {
	m.mu.Lock()
	l := m.links[id]
	if l == nil {
		l = m.reserved[id]
	}
	delete(m.links, id)
	delete(m.reserved, id)
	if l != nil {
		delete(m.slots, m.slotOf(l.Addr))
	}
	m.mu.Unlock()
	var errs []error
	name := m.ifName(id)
	if hl, err := netlink.LinkByName(name); err == nil {
		if err := netlink.LinkDel(hl); err != nil {
			errs = append(errs, fmt.Errorf("netns: delete %s: %w", name, err))
		}
	}
	if err := m.deleteSandboxRules(id); err != nil {
		errs = append(errs, err)
	}
	unmountNS(filepath.Join(m.cfg.NSDir, id))
	return errors.Join(errs...)
}

// Adopt is run once at start-up, after a crash left interfaces behind. It
// keeps (and re-registers, with fresh rules) the veth pairs of sandboxes
// that keep reports as live, and removes every other interface and
// namespace file of this instance. It returns the adopted links and the ids
// whose network was removed.
func (m *Manager) Adopt(keep func(id string) bool) (adopted []*Link, removed []string, err error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, nil, fmt.Errorf("netns: list links: %w", err)
	}
	for _, hl := range links {
		a := hl.Attrs()
		if !strings.HasPrefix(a.Name, m.prefix) {
			continue
		}
		id := a.Alias
		if id != "" && keep(id) {
			if l, err := m.adopt(id, hl); err == nil {
				adopted = append(adopted, l)
				continue
			}
		}
		_ = netlink.LinkDel(hl)
		if id != "" {
			_ = m.deleteSandboxRules(id)
			removed = append(removed, id)
		}
	}
	entries, _ := os.ReadDir(m.cfg.NSDir)
	for _, e := range entries {
		id := e.Name()
		if _, ok := m.Lookup(id); ok {
			if l, _ := m.Lookup(id); l != nil {
				l.NSPath = filepath.Join(m.cfg.NSDir, id)
			}
			continue
		}
		if keep(id) {
			continue // a live sandbox without a veth still runs in this namespace
		}
		unmountNS(filepath.Join(m.cfg.NSDir, id))
	}
	return adopted, removed, nil
}

func (m *Manager) adopt(id string, hl netlink.Link) (*Link, error) {
	addrs, err := netlink.AddrList(hl, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 {
		return nil, fmt.Errorf("netns: %s has no single address", hl.Attrs().Name)
	}
	gw, ok := netip.AddrFromSlice(addrs[0].IP.To4())
	if !ok || !m.cfg.Range.Contains(gw) {
		return nil, fmt.Errorf("netns: %s: address outside the range", hl.Attrs().Name)
	}
	l := &Link{ID: id, HostIf: hl.Attrs().Name, Gateway: gw, Addr: gw.Next()}
	m.mu.Lock()
	defer m.mu.Unlock()
	slot := m.slotOf(l.Addr)
	if other, taken := m.slots[slot]; taken && other != id {
		return nil, fmt.Errorf("netns: slot of %s taken", id)
	}
	_ = m.deleteSandboxRules(id)
	if err := m.addSandboxRules(id, l.HostIf, l.Addr); err != nil {
		return nil, err
	}
	m.links[id] = l
	m.slots[slot] = id
	return l, nil
}

// Close removes every sandbox's veth pair and the nftables table. Sandboxes
// that keep running lose their network until they are attached again.
func (m *Manager) Close() error {
	m.mu.Lock()
	ids := make([]string, 0, len(m.links))
	for id := range m.links {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	var errs []error
	for _, id := range ids {
		if err := m.Remove(id); err != nil {
			errs = append(errs, err)
		}
	}
	if err := m.deleteTable(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// newNamedNS creates a network namespace and bind-mounts it at path. The
// calling goroutine's thread enters the new namespace only for the unshare
// and goes back before it is unlocked; if it cannot go back, the thread is
// left locked so that the runtime discards it.
func newNamedNS(path string) (vnetns.NsHandle, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return 0, err
	}
	f.Close()
	runtime.LockOSThread()
	orig, err := vnetns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		os.Remove(path)
		return 0, err
	}
	defer orig.Close()
	ns, err := vnetns.New()
	if err != nil {
		// New failed before or after unshare; make sure we are home.
		if vnetns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		os.Remove(path)
		return 0, err
	}
	src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
	mountErr := unix.Mount(src, path, "", unix.MS_BIND, "")
	if err := vnetns.Set(orig); err != nil {
		ns.Close()
		return 0, fmt.Errorf("return to host namespace: %w", err) // thread stays locked
	}
	runtime.UnlockOSThread()
	if mountErr != nil {
		ns.Close()
		os.Remove(path)
		return 0, fmt.Errorf("bind-mount namespace: %w", mountErr)
	}
	return ns, nil
}

// inNamespace runs fn on a thread that joined ns; the thread is discarded
// afterwards (never unlocked), so no other goroutine runs in ns.
func inNamespace(ns vnetns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := vnetns.Set(ns); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func unmountNS(path string) {
	_ = unix.Unmount(path, unix.MNT_DETACH)
	_ = os.Remove(path)
}

// Reap removes interfaces, rules and namespace files of this instance
// whose sandbox is neither known here nor reported live by keep, and
// returns their sandbox ids (the periodic reaper; see also Adopt).
func (m *Manager) Reap(keep func(id string) bool) []string {
	links, err := netlink.LinkList()
	if err != nil {
		return nil
	}
	var gone []string
	for _, hl := range links {
		a := hl.Attrs()
		if !strings.HasPrefix(a.Name, m.prefix) {
			continue
		}
		id := a.Alias
		if _, known := m.Lookup(id); known || (id != "" && keep(id)) {
			continue
		}
		if err := netlink.LinkDel(hl); err == nil {
			if id != "" {
				_ = m.deleteSandboxRules(id)
			}
			gone = append(gone, id)
		}
	}
	entries, _ := os.ReadDir(m.cfg.NSDir)
	for _, e := range entries {
		id := e.Name()
		if _, known := m.Lookup(id); known || keep(id) || m.Reserved(id) {
			continue
		}
		unmountNS(filepath.Join(m.cfg.NSDir, id))
	}
	return gone
}
