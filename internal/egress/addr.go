package egress

import (
	"net/netip"
)

// deniedRange is one entry of the always-denied set.
type deniedRange struct {
	prefix netip.Prefix
	reason string
	// never marks ranges that no policy rule can open: unspecified,
	// loopback, link-local, metadata and ranges a TCP connection to makes no
	// sense (multicast, broadcast, reserved).
	never bool
}

func dr(cidr, reason string, never bool) deniedRange {
	return deniedRange{prefix: netip.MustParsePrefix(cidr), reason: reason, never: never}
}

// deniedRanges is the always-denied set (threat-model.md #9, #10), after the
// IANA special-purpose registries (RFC 6890). More specific entries come
// before the ranges that contain them, so the first match gives the most
// precise reason. The documentation ranges (192.0.2.0/24, 198.51.100.0/24,
// 203.0.113.0/24, RFC 5737; 2001:db8::/32, RFC 3849) are deliberately not
// here: they are never routed on the Internet, and corral's own tests put
// their upstream servers there.
var deniedRanges = []deniedRange{
	// IPv4.
	// "This network" (RFC 791, RFC 1122 §3.2.1.3). On Linux a connect to
	// 0.0.0.0 reaches the local host.
	dr("0.0.0.0/8", "\"this network\" 0.0.0.0/8 (RFC 1122)", true),
	// Private-use (RFC 1918).
	dr("10.0.0.0/8", "private 10.0.0.0/8 (RFC 1918)", false),
	// Alibaba Cloud metadata service, inside the CGNAT range below.
	dr("100.100.100.200/32", "cloud metadata 100.100.100.200 (Alibaba Cloud)", true),
	// Shared address space, carrier-grade NAT (RFC 6598).
	dr("100.64.0.0/10", "shared address space / CGNAT 100.64.0.0/10 (RFC 6598)", false),
	// Loopback (RFC 1122 §3.2.1.3).
	dr("127.0.0.0/8", "loopback 127.0.0.0/8 (RFC 1122)", true),
	// Cloud metadata (AWS, GCP, Azure, OCI, ...) inside link-local.
	dr("169.254.169.254/32", "cloud metadata 169.254.169.254", true),
	// Link-local (RFC 3927).
	dr("169.254.0.0/16", "link-local 169.254.0.0/16 (RFC 3927)", true),
	// Private-use (RFC 1918).
	dr("172.16.0.0/12", "private 172.16.0.0/12 (RFC 1918)", false),
	// IETF protocol assignments, incl. DS-Lite and NAT64 discovery
	// (RFC 6890 §2.2.2, RFC 7335, RFC 7050).
	dr("192.0.0.0/24", "IETF protocol assignments 192.0.0.0/24 (RFC 6890)", false),
	// Deprecated 6to4 relay anycast (RFC 7526).
	dr("192.88.99.0/24", "6to4 relay anycast 192.88.99.0/24 (RFC 7526)", false),
	// Private-use (RFC 1918).
	dr("192.168.0.0/16", "private 192.168.0.0/16 (RFC 1918)", false),
	// Benchmarking (RFC 2544).
	dr("198.18.0.0/15", "benchmarking 198.18.0.0/15 (RFC 2544)", false),
	// Multicast (RFC 5771).
	dr("224.0.0.0/4", "multicast 224.0.0.0/4 (RFC 5771)", true),
	// Limited broadcast (RFC 919, RFC 8190).
	dr("255.255.255.255/32", "limited broadcast 255.255.255.255 (RFC 919)", true),
	// Reserved for future use (RFC 1112 §4).
	dr("240.0.0.0/4", "reserved 240.0.0.0/4 (RFC 1112)", true),

	// IPv6.
	// Unspecified (RFC 4291 §2.5.2).
	dr("::/128", "unspecified :: (RFC 4291)", true),
	// Loopback (RFC 4291 §2.5.3).
	dr("::1/128", "loopback ::1 (RFC 4291)", true),
	// IPv4-compatible addresses, deprecated (RFC 4291 §2.5.5.1). They
	// embed an IPv4 address and have no legitimate use.
	dr("::/96", "deprecated IPv4-compatible IPv6 ::/96 (RFC 4291)", true),
	// Discard-only (RFC 6666).
	dr("100::/64", "discard-only 100::/64 (RFC 6666)", true),
	// Local-use IPv4/IPv6 translation (RFC 8215); the embedded IPv4 can be
	// anything the local translator maps to.
	dr("64:ff9b:1::/48", "local-use NAT64 64:ff9b:1::/48 (RFC 8215)", false),
	// AWS instance metadata over IPv6 (Nitro), inside the ULA range.
	dr("fd00:ec2::254/128", "cloud metadata fd00:ec2::254 (AWS)", true),
	// Unique local addresses (RFC 4193).
	dr("fc00::/7", "unique local fc00::/7 (RFC 4193)", false),
	// Link-local unicast (RFC 4291 §2.5.6).
	dr("fe80::/10", "link-local fe80::/10 (RFC 4291)", true),
	// Site-local, deprecated (RFC 3879).
	dr("fec0::/10", "deprecated site-local fec0::/10 (RFC 3879)", false),
	// Multicast (RFC 4291 §2.7).
	dr("ff00::/8", "multicast ff00::/8 (RFC 4291)", true),
}

// IPv6 transition forms that embed an IPv4 address. If the embedded address
// is denied, so is the IPv6 one, and no rule can open it.
var (
	// NAT64 well-known prefix (RFC 6052): 64:ff9b::a.b.c.d.
	nat64Prefix = netip.MustParsePrefix("64:ff9b::/96")
	// IPv4-translated addresses, SIIT (RFC 2765): ::ffff:0:a.b.c.d.
	siitPrefix = netip.MustParsePrefix("::ffff:0:0:0/96")
	// 6to4 (RFC 3056): 2002:AABB:CCDD::/48 embeds A.B.C.D.
	sixToFourPrefix = netip.MustParsePrefix("2002::/16")
	// Teredo (RFC 4380): 2001:0:SSSS:SSSS:flags:port:CCCC:CCCC with the
	// server IPv4 in bits 32-63 and the client IPv4 inverted in bits 96-127.
	teredoPrefix = netip.MustParsePrefix("2001::/32")
)

// canonical strips an IPv6 zone and unmaps IPv4-mapped IPv6 addresses
// (::ffff:a.b.c.d, RFC 4291 §2.5.5.2), which a dual-stack socket dials as
// the IPv4 address itself.
func canonical(a netip.Addr) netip.Addr {
	return a.WithZone("").Unmap()
}

// embeddedIPv4 returns the IPv4 addresses embedded in an IPv6 transition
// form, with the name of the form.
func embeddedIPv4(a netip.Addr) ([]netip.Addr, string) {
	if !a.Is6() {
		return nil, ""
	}
	b := a.As16()
	v4 := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{b[i], b[i+1], b[i+2], b[i+3]}) }
	switch {
	case nat64Prefix.Contains(a):
		return []netip.Addr{v4(12)}, "NAT64 (RFC 6052)"
	case siitPrefix.Contains(a):
		return []netip.Addr{v4(12)}, "IPv4-translated (RFC 2765)"
	case sixToFourPrefix.Contains(a):
		return []netip.Addr{v4(2)}, "6to4 (RFC 3056)"
	case teredoPrefix.Contains(a):
		client := netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]})
		return []netip.Addr{v4(4), client}, "Teredo (RFC 4380)"
	}
	return nil, ""
}

// lookup finds the first denied range containing a (already canonical).
func lookup(a netip.Addr) *deniedRange {
	for i := range deniedRanges {
		if deniedRanges[i].prefix.Contains(a) {
			return &deniedRanges[i]
		}
	}
	return nil
}

// deny finds the denied range a (canonical) falls in: a never-openable
// range first, then the host's own addresses ([ReasonHostAddress], never
// openable either, so that an explicit rule for a private range does not
// open the host's address inside it), then the private-like ranges a rule
// can open.
func deny(a netip.Addr) *deniedRange {
	d := lookup(a)
	if d != nil && d.never {
		return d
	}
	if h := hostRange(a); h != nil {
		return h
	}
	return d
}

// classify returns the denied range a falls in (nil when a is public) and
// the reason. Addresses that embed a denied IPv4 address (a private one,
// or one of the host's) yield a synthetic range that is never allowed.
// It is the one address check of the package: [AlwaysDenied],
// [Policy.AllowsAddr] (the proxy at plan and dial time, the DNS filter on
// its answers) all come here.
func classify(a netip.Addr) (*deniedRange, string) {
	if d := deny(a); d != nil {
		return d, d.reason
	}
	if embedded, form := embeddedIPv4(a); embedded != nil {
		for _, e := range embedded {
			if d := deny(e); d != nil {
				reason := form + " form of " + e.String() + ": " + d.reason
				return &deniedRange{prefix: netip.PrefixFrom(a, 128), reason: reason, never: true}, reason
			}
		}
	}
	return nil, ""
}

// AlwaysDenied reports whether addr is in the set no policy opens by
// default: unspecified, loopback, link-local (with the cloud metadata
// addresses 169.254.169.254, fd00:ec2::254 and 100.100.100.200), private,
// unique-local, CGNAT, "this network", IETF protocol assignments,
// benchmarking, multicast, broadcast and reserved ranges, and every
// address assigned to an interface of this host ([ReasonHostAddress]), in
// IPv4 form or embedded in IPv6 (IPv4-mapped, IPv4-compatible, NAT64,
// IPv4-translated, 6to4, Teredo). The reason names the range and its RFC,
// or starts with "host_address: ". Only an explicit
// CIDR rule of a policy can open part of the private-like subset; see
// [Policy.AllowsAddr]. An invalid address is denied.
func AlwaysDenied(addr netip.Addr) (bool, string) {
	if !addr.IsValid() {
		return true, "invalid address"
	}
	if d, reason := classify(canonical(addr)); d != nil {
		return true, reason
	}
	return false, ""
}
