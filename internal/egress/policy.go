// Package egress is corral's network boundary: the per-sandbox egress
// policy (which names and addresses a sandbox may reach), the always-denied
// address set checked at dial time, the egress proxy (explicit and
// transparent modes, caps, secret injection with TLS interception), the DNS
// filter with its per-sandbox query rate limit, heuristics against DNS
// exfiltration, a scan of env vars for secrets, and redaction of secret values
// from logs and stored events.
//
// The proxy and the DNS filter serve connections they are handed; the
// listeners and the host plumbing that routes sandbox traffic to them live
// in packages gateway and netns. They apply the policy
// (threat-model.md #8, #9, #10, #20):
//
//   - the DNS filter answers a query only if [Policy.AllowsName] accepts the
//     name, [ExfilSuspect] does not flag it and the sandbox's query rate
//     limit ([ratelimit.Keyed]) admits it;
//   - the proxy checks the requested name with [Policy.AllowsName], resolves
//     it itself, and calls [Policy.AllowsAddr] on every address it is about to
//     dial, so that DNS rebinding and an allowed name pointing at a private,
//     loopback or metadata address both fail;
//   - every log line and stored audit event passes through a [Redactor].
package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Mode is the kind of egress a sandbox has.
type Mode string

const (
	// ModeNone means no egress at all. It is the default.
	ModeNone Mode = "none"
	// ModeAllow permits only the listed domain patterns and CIDR rules.
	ModeAllow Mode = "allow"
	// ModeAllPublic permits every public address (for trusted use). Private,
	// loopback, link-local, CGNAT and metadata ranges, and the host's own
	// addresses, stay denied.
	ModeAllPublic Mode = "all-public"
)

// MaxEntries is the largest number of allow entries a policy may have.
const MaxEntries = 256

// Policy is a sandbox's egress policy. Build it with [ParsePolicy]; the zero
// value denies everything.
type Policy struct {
	// Mode selects the kind of egress.
	Mode Mode
	// Domains are normalized domain patterns: "api.github.com" matches that
	// name exactly, "*.pypi.org" matches strict subdomains of pypi.org.
	Domains []string
	// Rules are address rules for connections that are not made by name
	// (raw TCP), and deliberate exceptions to the private-range denial.
	Rules []CIDRRule
}

// CIDRRule allows connections to addresses in Prefix on Port.
type CIDRRule struct {
	// Prefix is the masked address range.
	Prefix netip.Prefix
	// Port is the destination port; 0 means any port.
	Port uint16
}

// String formats the rule the way [ParsePolicy] accepts it.
func (r CIDRRule) String() string {
	if r.Port == 0 {
		return r.Prefix.String()
	}
	if r.Prefix.Addr().Is6() {
		return "[" + r.Prefix.String() + "]:" + strconv.Itoa(int(r.Port))
	}
	return r.Prefix.String() + ":" + strconv.Itoa(int(r.Port))
}

// Matches reports whether addr (unmapped) and port fall under the rule.
func (r CIDRRule) Matches(addr netip.Addr, port uint16) bool {
	return r.Prefix.Contains(addr) && (r.Port == 0 || r.Port == port)
}

// ParsePolicy builds a policy from a mode ("none", "allow", "all-public"; the
// empty string means "none") and allow entries. Each entry is either a domain
// pattern ("api.github.com", "*.pypi.org") or an address rule: "CIDR",
// "CIDR:port", "IP", "IP:port", with IPv6 in brackets when a port is given
// ("[2001:db8::/32]:443"). A bare IP is a single-address rule. Errors name the
// offending entry. Duplicate entries are dropped.
func ParsePolicy(mode string, allow []string) (Policy, error) {
	var p Policy
	switch m := Mode(strings.ToLower(strings.TrimSpace(mode))); m {
	case "", ModeNone:
		p.Mode = ModeNone
	case ModeAllow, ModeAllPublic:
		p.Mode = m
	default:
		return Policy{}, fmt.Errorf("egress: unknown network mode %q (want none, allow or all-public)", mode)
	}
	if p.Mode == ModeNone && len(allow) > 0 {
		return Policy{}, fmt.Errorf("egress: network mode %q takes no allow entries (got %d); use mode allow", ModeNone, len(allow))
	}
	if len(allow) > MaxEntries {
		return Policy{}, fmt.Errorf("egress: %d allow entries, at most %d are accepted", len(allow), MaxEntries)
	}
	seenD := map[string]bool{}
	seenR := map[CIDRRule]bool{}
	for _, raw := range allow {
		e := strings.TrimSpace(raw)
		if e == "" {
			return Policy{}, fmt.Errorf("egress: empty allow entry")
		}
		if looksLikeAddressRule(e) {
			r, err := parseRule(e)
			if err != nil {
				return Policy{}, fmt.Errorf("egress: allow entry %q: %w", raw, err)
			}
			if !seenR[r] {
				seenR[r] = true
				p.Rules = append(p.Rules, r)
			}
			continue
		}
		d, err := parseDomainPattern(e)
		if err != nil {
			return Policy{}, fmt.Errorf("egress: allow entry %q: %w", raw, err)
		}
		if !seenD[d] {
			seenD[d] = true
			p.Domains = append(p.Domains, d)
		}
	}
	return p, nil
}

// looksLikeAddressRule tells address rules from domain patterns: anything
// with '/', ':' or '[' or made only of digits and dots is an address form.
// (A domain pattern never contains those, and an all-numeric name is refused
// anyway.)
func looksLikeAddressRule(e string) bool {
	if strings.ContainsAny(e, "/:[]") {
		return true
	}
	return strings.Trim(e, "0123456789.") == ""
}

// parseRule parses "CIDR", "CIDR:port", "IP", "IP:port", "[v6 CIDR]:port",
// "[v6 IP]:port".
func parseRule(e string) (CIDRRule, error) {
	host, portStr := e, ""
	switch {
	case strings.HasPrefix(e, "["):
		end := strings.Index(e, "]")
		if end < 0 {
			return CIDRRule{}, errors.New("missing ']' after IPv6 address")
		}
		host = e[1:end]
		rest := e[end+1:]
		if rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return CIDRRule{}, fmt.Errorf("unexpected %q after ']'", rest)
			}
			portStr = rest[1:]
			if portStr == "" {
				return CIDRRule{}, errors.New("empty port after ':'")
			}
		}
	case strings.Count(e, ":") == 1:
		// IPv4 (or IPv4 CIDR) with a port. A bare IPv6 address has at
		// least two colons and takes no port without brackets.
		i := strings.IndexByte(e, ':')
		host, portStr = e[:i], e[i+1:]
		if portStr == "" {
			return CIDRRule{}, errors.New("empty port after ':'")
		}
	}
	var pfx netip.Prefix
	if strings.Contains(host, "/") {
		p, err := netip.ParsePrefix(host)
		if err != nil {
			return CIDRRule{}, fmt.Errorf("bad CIDR %q", host)
		}
		pfx = p
	} else {
		a, err := netip.ParseAddr(host)
		if err != nil {
			return CIDRRule{}, fmt.Errorf("bad IP address %q (a domain pattern is letters, digits, '-' and '.', an address rule is CIDR[:port] or IP:port)", host)
		}
		if a.Zone() != "" {
			return CIDRRule{}, errors.New("zoned IPv6 addresses are not accepted")
		}
		pfx = netip.PrefixFrom(a, a.BitLen())
	}
	// An IPv4-mapped IPv6 prefix is the same IPv4 range; store it as IPv4 so
	// that it matches the unmapped addresses the checks use.
	if pfx.Addr().Is4In6() && pfx.Bits() >= 96 {
		pfx = netip.PrefixFrom(pfx.Addr().Unmap(), pfx.Bits()-96)
	}
	pfx = pfx.Masked()
	r := CIDRRule{Prefix: pfx}
	if portStr != "" {
		n, err := strconv.ParseUint(portStr, 10, 16)
		if err != nil || n == 0 {
			return CIDRRule{}, fmt.Errorf("bad port %q (want 1-65535; omit the port to allow any)", portStr)
		}
		r.Port = uint16(n)
	}
	// A rule lying wholly inside a range that is never reachable would be
	// silently useless; say so instead.
	for _, d := range deniedRanges {
		if d.never && d.prefix.Bits() <= pfx.Bits() && d.prefix.Contains(pfx.Addr()) {
			return CIDRRule{}, fmt.Errorf("%s is never reachable from a sandbox: %s", pfx, d.reason)
		}
	}
	return r, nil
}

// parseDomainPattern validates and normalizes a domain pattern.
func parseDomainPattern(e string) (string, error) {
	d := strings.TrimSuffix(strings.ToLower(e), ".")
	if d == "*" {
		return "", errors.New("'*' alone would allow every name; use mode all-public for that")
	}
	rest := d
	wild := false
	if strings.HasPrefix(d, "*.") {
		wild = true
		rest = d[2:]
	}
	if strings.Contains(rest, "*") {
		return "", errors.New("a wildcard is only allowed as the whole first label, as in *.example.com")
	}
	if err := checkName(rest); err != nil {
		return "", err
	}
	if strings.Count(rest, ".") == 0 {
		if wild {
			return "", fmt.Errorf("wildcard over a single-label suffix %q is too broad", rest)
		}
		return "", fmt.Errorf("single-label name %q is not accepted; give a fully qualified name", rest)
	}
	if len(d) > 253 {
		return "", fmt.Errorf("pattern is %d characters long, at most 253 are allowed", len(d))
	}
	return d, nil
}

// checkName validates a lower-case host name without a trailing dot.
func checkName(n string) error {
	if n == "" {
		return errors.New("empty name")
	}
	if len(n) > 253 {
		return fmt.Errorf("name is %d characters long, at most 253 are allowed", len(n))
	}
	if _, err := netip.ParseAddr(n); err == nil {
		return errors.New("IP literal is not a domain name; use an address rule such as 203.0.113.7:443")
	}
	labels := strings.Split(n, ".")
	for _, l := range labels {
		if l == "" {
			return errors.New("empty label")
		}
		if len(l) > 63 {
			return fmt.Errorf("label %q is longer than 63 characters", l)
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("label %q starts or ends with '-'", l)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				if c >= 0x80 {
					return fmt.Errorf("label %q is not ASCII; use its punycode (xn--) form", l)
				}
				return fmt.Errorf("label %q has character %q; only a-z, 0-9 and '-' are allowed", l, c)
			}
		}
	}
	// An all-numeric last label makes the name read as an IP address to
	// many resolvers and URL parsers ("1.2.3", "0x7f.1" style tricks).
	last := labels[len(labels)-1]
	if strings.Trim(last, "0123456789") == "" {
		return fmt.Errorf("all-numeric top-level label %q looks like an IP address", last)
	}
	return nil
}

// normalizeHost lower-cases a host name and drops one trailing dot.
func normalizeHost(h string) string {
	return strings.TrimSuffix(strings.ToLower(strings.TrimSpace(h)), ".")
}

// AllowsName reports whether the policy lets the sandbox reach host by name.
// Matching is case-insensitive and ignores a trailing dot; "*.suffix" matches
// strict subdomains of suffix, not suffix itself. When the name is allowed
// the second result names the matching pattern (or the mode); when refused it
// is a short reason such as "not in the allowlist" or "networking is off".
// IP literals are not names and are always refused here; the caller checks
// them with [Policy.AllowsAddr] instead.
func (p Policy) AllowsName(host string) (bool, string) {
	if p.Mode == "" || p.Mode == ModeNone {
		return false, "networking is off"
	}
	h := normalizeHost(host)
	if err := checkName(h); err != nil {
		return false, "invalid host name: " + err.Error()
	}
	switch p.Mode {
	case ModeAllPublic:
		return true, "all-public"
	case ModeAllow:
		for _, d := range p.Domains {
			if suffix, ok := strings.CutPrefix(d, "*."); ok {
				if strings.HasSuffix(h, "."+suffix) {
					return true, d
				}
			} else if h == d {
				return true, d
			}
		}
		return false, "not in the allowlist"
	}
	return false, "unknown network mode"
}

// AllowsAddr is the check made on the address the proxy is about to dial,
// after it resolved the name itself (so DNS rebinding fails). The order is:
//
//  1. Networking off: refused.
//  2. The always-denied set (see [AlwaysDenied]) is refused whatever the
//     policy, with one exception: an address inside an explicit [CIDRRule]
//     whose prefix lies within the same denied range is allowed (an
//     operator's deliberate rule, e.g. "10.1.2.0/24:5432" for an internal
//     database). The exception never applies to unspecified, loopback,
//     link-local and metadata addresses, nor to the host's own addresses
//     (any address on any of its interfaces, reason "host_address: ..."),
//     nor to private IPv4 embedded in IPv6 transition forms, and a broad
//     rule such as "0.0.0.0/0" does not open private ranges.
//  3. A named connection (the proxy resolved an allowed name) may reach any
//     remaining, public, address in allow and all-public modes.
//  4. An unnamed connection (raw TCP) must match a CIDR rule (port 0 = any)
//     in allow mode; in all-public mode any public address is allowed.
//
// The second result is the reason: the matching rule when allowed, a short
// explanation when refused.
func (p Policy) AllowsAddr(addr netip.Addr, port uint16, named bool) (bool, string) {
	if p.Mode == "" || p.Mode == ModeNone {
		return false, "networking is off"
	}
	if !addr.IsValid() {
		return false, "invalid address"
	}
	a := canonical(addr)
	if d, reason := classify(a); d != nil {
		if !d.never {
			for _, r := range p.Rules {
				if r.Matches(a, port) && d.prefix.Bits() <= r.Prefix.Bits() && d.prefix.Contains(r.Prefix.Addr()) {
					return true, "explicit rule " + r.String()
				}
			}
		}
		return false, "always denied: " + reason
	}
	switch p.Mode {
	case ModeAllPublic:
		return true, "all-public"
	case ModeAllow:
		if named {
			return true, "allowed name"
		}
		for _, r := range p.Rules {
			if r.Matches(a, port) {
				return true, "rule " + r.String()
			}
		}
		return false, "address not in the allowlist"
	}
	return false, "unknown network mode"
}
