package netns

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// rejectPort is where stray UDP from a sandbox is redirected: nothing
// listens and the input chain rejects it, so the sender gets an immediate
// ICMP error instead of silence.
const rejectPort = 9

// Chain names (nft keywords such as "fwd" are avoided).
const (
	chainPrerouting = "sandbox_prerouting"
	chainAntispoof  = "sandbox_antispoof"
	chainInput      = "sandbox_input"
	chainForward    = "sandbox_forward"
)

func (m *Manager) tableRef() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: m.table}
}

// installTable replaces this instance's table with a fresh one holding the
// rules that cover every sandbox interface (by name prefix).
func (m *Manager) installTable() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("netns: nftables: %w", err)
	}
	// Delete a stale table first; ignore "not found".
	if tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet); err == nil {
		for _, t := range tables {
			if t.Name == m.table {
				c.DelTable(t)
			}
		}
	}
	t := c.AddTable(m.tableRef())
	pre := c.AddChain(&nftables.Chain{
		Name: chainPrerouting, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest,
	})
	anti := c.AddChain(&nftables.Chain{
		Name: chainAntispoof, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityRef(-10),
	})
	_ = anti
	in := c.AddChain(&nftables.Chain{
		Name: chainInput, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter,
	})
	fw := c.AddChain(&nftables.Chain{
		Name: chainForward, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter,
	})

	fromSandbox := m.ifPrefixMatch(expr.MetaKeyIIFNAME)
	add := func(ch *nftables.Chain, parts ...[]expr.Any) {
		var all []expr.Any
		for _, p := range parts {
			all = append(all, p...)
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: all})
	}

	// prerouting: DNS to the filter, all other TCP to the proxy, other UDP
	// to the closed reject port.
	add(pre, fromSandbox, ipv4(), l4(unix.IPPROTO_UDP), dport(53), redirect(m.cfg.DNSPort))
	add(pre, fromSandbox, ipv4(), l4(unix.IPPROTO_TCP), dport(53), redirect(m.cfg.DNSPort))
	add(pre, fromSandbox, ipv4(), l4(unix.IPPROTO_TCP), redirect(m.cfg.ProxyPort))
	add(pre, fromSandbox, ipv4(), l4(unix.IPPROTO_UDP), redirect(rejectPort))

	// input: sandboxes reach only the proxy and the DNS filter.
	add(in, fromSandbox, ipv4(), l4(unix.IPPROTO_TCP), dport(m.cfg.ProxyPort), verdict(expr.VerdictAccept))
	add(in, fromSandbox, ipv4(), l4(unix.IPPROTO_TCP), dport(m.cfg.DNSPort), verdict(expr.VerdictAccept))
	add(in, fromSandbox, ipv4(), l4(unix.IPPROTO_UDP), dport(m.cfg.DNSPort), verdict(expr.VerdictAccept))
	add(in, fromSandbox, l4(unix.IPPROTO_TCP), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})
	add(in, fromSandbox, []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}})
	// The proxy and DNS ports listen on all addresses: refuse them from
	// every interface that is neither loopback nor a sandbox's.
	notLocal := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname("lo")},
	}
	notSandbox := m.ifPrefixMatchNeq(expr.MetaKeyIIFNAME)
	for _, p := range []struct {
		proto byte
		port  uint16
	}{{unix.IPPROTO_TCP, m.cfg.ProxyPort}, {unix.IPPROTO_TCP, m.cfg.DNSPort}, {unix.IPPROTO_UDP, m.cfg.DNSPort}} {
		add(in, notLocal, notSandbox, l4(p.proto), dport(p.port), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}})
	}

	// forward: nothing is ever routed from or to a sandbox.
	add(fw, fromSandbox, verdict(expr.VerdictDrop))
	add(fw, m.ifPrefixMatch(expr.MetaKeyOIFNAME), verdict(expr.VerdictDrop))

	if err := c.Flush(); err != nil {
		return fmt.Errorf("netns: install nftables table %s: %w", m.table, err)
	}
	return nil
}

// deleteTable removes this instance's table.
func (m *Manager) deleteTable() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("netns: nftables: %w", err)
	}
	c.DelTable(m.tableRef())
	if err := c.Flush(); err != nil {
		return fmt.Errorf("netns: delete nftables table %s: %w", m.table, err)
	}
	return nil
}

// DNSPacketRate and DNSPacketBurst bound the UDP DNS packets one sandbox
// can send to the DNS filter (packets per second, and the burst above
// that rate); the excess is dropped in the kernel.
const (
	DNSPacketRate  = 1000
	DNSPacketBurst = 2000
)

// addSandboxRules adds the rules of one sandbox, tagged with its id: the
// anti-spoofing rule (packets from its interface must carry its address)
// and its DNS packet limit. The limit defends the other sandboxes' name
// resolution against a flood that does not wait for answers: the DNS
// filter's one UDP socket is shared, and without a per-sandbox bound in
// the kernel one sandbox's packets could fill its receive buffer so that
// everyone else's queries are dropped before the filter's own per-sandbox
// rate limit ever sees them.
func (m *Manager) addSandboxRules(id, hostIf string, addr netip.Addr) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("netns: nftables: %w", err)
	}
	t := m.tableRef()
	ch := &nftables.Chain{Name: chainAntispoof, Table: t}
	a4 := addr.As4()
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, UserData: []byte(id), Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(hostIf)},
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: a4[:]},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}})
	dnsLimit := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(hostIf)},
	}
	dnsLimit = append(dnsLimit, l4(unix.IPPROTO_UDP)...)
	dnsLimit = append(dnsLimit, dport(m.cfg.DNSPort)...)
	dnsLimit = append(dnsLimit,
		&expr.Limit{Type: expr.LimitTypePkts, Rate: DNSPacketRate, Unit: expr.LimitTimeSecond, Burst: DNSPacketBurst, Over: true},
		&expr.Verdict{Kind: expr.VerdictDrop})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, UserData: []byte(id), Exprs: dnsLimit})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("netns: add rules for %s: %w", id, err)
	}
	return nil
}

// deleteSandboxRules removes the rules tagged with id.
func (m *Manager) deleteSandboxRules(id string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("netns: nftables: %w", err)
	}
	t := m.tableRef()
	rules, err := c.GetRules(t, &nftables.Chain{Name: chainAntispoof, Table: t})
	if err != nil {
		return fmt.Errorf("netns: list rules: %w", err)
	}
	n := 0
	for _, r := range rules {
		if string(r.UserData) == id {
			if err := c.DelRule(r); err != nil {
				return fmt.Errorf("netns: delete rule of %s: %w", id, err)
			}
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("netns: delete rules of %s: %w", id, err)
	}
	return nil
}

// ifPrefixMatch matches an interface name starting with the instance's
// prefix (nft: iifname "crX*"): Cmp compares only len(Data) bytes.
func (m *Manager) ifPrefixMatch(key expr.MetaKey) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(m.prefix)},
	}
}

func (m *Manager) ifPrefixMatchNeq(key expr.MetaKey) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte(m.prefix)},
	}
}

// ifname pads an exact interface name to IFNAMSIZ as the kernel stores it.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

func ipv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

func l4(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

func dport(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(p)},
	}
}

func redirect(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(p)},
		&expr.Redir{RegisterProtoMin: 1},
	}
}

func verdict(k expr.VerdictKind) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: k}}
}

// Ensure reinstalls this instance's table (with every known sandbox's
// rule) when it is missing, for example after someone ran
// `nft flush ruleset`: without it, sandbox traffic to the host would no
// longer be confined. It reports whether it had to.
func (m *Manager) Ensure() (bool, error) {
	c, err := nftables.New()
	if err != nil {
		return false, fmt.Errorf("netns: nftables: %w", err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, fmt.Errorf("netns: list tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == m.table {
			return false, nil
		}
	}
	if err := m.installTable(); err != nil {
		return true, err
	}
	m.mu.Lock()
	links := make([]*Link, 0, len(m.links))
	for _, l := range m.links {
		links = append(links, l)
	}
	m.mu.Unlock()
	for _, l := range links {
		if err := m.addSandboxRules(l.ID, l.HostIf, l.Addr); err != nil {
			return true, err
		}
	}
	return true, nil
}
