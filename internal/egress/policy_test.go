package egress

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func TestParsePolicyGood(t *testing.T) {
	tests := []struct {
		mode    string
		allow   []string
		want    Mode
		domains []string
		rules   []string
	}{
		{"", nil, ModeNone, nil, nil},
		{"none", nil, ModeNone, nil, nil},
		{"allow", nil, ModeAllow, nil, nil},
		{"all-public", nil, ModeAllPublic, nil, nil},
		{" Allow ", []string{"API.GitHub.com."}, ModeAllow, []string{"api.github.com"}, nil},
		{"allow", []string{"*.pypi.org", "files.pythonhosted.org"}, ModeAllow, []string{"*.pypi.org", "files.pythonhosted.org"}, nil},
		{"allow", []string{"xn--bcher-kva.example"}, ModeAllow, []string{"xn--bcher-kva.example"}, nil},
		{"allow", []string{"a-b.c-d.example"}, ModeAllow, []string{"a-b.c-d.example"}, nil},
		{"allow", []string{"api.github.com", "API.github.com"}, ModeAllow, []string{"api.github.com"}, nil},
		{"allow", []string{strings.Repeat("a", 63) + ".example"}, ModeAllow, []string{strings.Repeat("a", 63) + ".example"}, nil},
		{"allow", []string{"203.0.113.0/24:443"}, ModeAllow, nil, []string{"203.0.113.0/24:443"}},
		{"allow", []string{"203.0.113.0/24"}, ModeAllow, nil, []string{"203.0.113.0/24"}},
		{"allow", []string{"203.0.113.7:5432"}, ModeAllow, nil, []string{"203.0.113.7/32:5432"}},
		{"allow", []string{"203.0.113.7"}, ModeAllow, nil, []string{"203.0.113.7/32"}},
		{"allow", []string{"203.0.113.77/24:443"}, ModeAllow, nil, []string{"203.0.113.0/24:443"}},
		{"allow", []string{"10.1.2.0/24:5432"}, ModeAllow, nil, []string{"10.1.2.0/24:5432"}},
		{"allow", []string{"[2001:db8::/32]:443"}, ModeAllow, nil, []string{"[2001:db8::/32]:443"}},
		{"allow", []string{"2001:db8::/32"}, ModeAllow, nil, []string{"2001:db8::/32"}},
		{"allow", []string{"[2001:db8::1]:22"}, ModeAllow, nil, []string{"[2001:db8::1/128]:22"}},
		{"allow", []string{"2001:db8::1"}, ModeAllow, nil, []string{"2001:db8::1/128"}},
		{"allow", []string{"[::ffff:203.0.113.0/120]:80"}, ModeAllow, nil, []string{"203.0.113.0/24:80"}},
		{"allow", []string{"0.0.0.0/0:443"}, ModeAllow, nil, []string{"0.0.0.0/0:443"}},
		{"allow", []string{"203.0.113.0/24:65535"}, ModeAllow, nil, []string{"203.0.113.0/24:65535"}},
		{"allow", []string{"api.github.com", "203.0.113.5:443"}, ModeAllow, []string{"api.github.com"}, []string{"203.0.113.5/32:443"}},
		{"all-public", []string{"10.9.0.0/16:6379"}, ModeAllPublic, nil, []string{"10.9.0.0/16:6379"}},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s %v", tc.mode, tc.allow), func(t *testing.T) {
			p, err := ParsePolicy(tc.mode, tc.allow)
			if err != nil {
				t.Fatal(err)
			}
			if p.Mode != tc.want {
				t.Errorf("mode %q, want %q", p.Mode, tc.want)
			}
			if fmt.Sprint(p.Domains) != fmt.Sprint(tc.domains) {
				t.Errorf("domains %v, want %v", p.Domains, tc.domains)
			}
			var rules []string
			for _, r := range p.Rules {
				rules = append(rules, r.String())
			}
			if fmt.Sprint(rules) != fmt.Sprint(tc.rules) {
				t.Errorf("rules %v, want %v", rules, tc.rules)
			}
		})
	}
}

func TestParsePolicyBad(t *testing.T) {
	many := make([]string, MaxEntries+1)
	for i := range many {
		many[i] = fmt.Sprintf("h%d.example.com", i)
	}
	tests := []struct {
		mode  string
		allow []string
		msg   string // the error must contain this
	}{
		{"open", nil, "unknown network mode"},
		{"none", []string{"api.github.com"}, "takes no allow entries"},
		{"", []string{"api.github.com"}, "takes no allow entries"},
		{"allow", many, "at most 256"},
		{"allow", []string{""}, "empty allow entry"},
		{"allow", []string{"*"}, `"*"`},
		{"allow", []string{"*.com"}, "single-label suffix"},
		{"allow", []string{"*."}, `"*."`},
		{"allow", []string{"localhost"}, "single-label"},
		{"allow", []string{"api.*.com"}, "wildcard"},
		{"allow", []string{"*api.github.com"}, "wildcard"},
		{"allow", []string{"*.*.github.com"}, "wildcard"},
		{"allow", []string{"-bad.example.com"}, `"-bad.example.com"`},
		{"allow", []string{"bad-.example.com"}, "starts or ends"},
		{"allow", []string{"a..example.com"}, "empty label"},
		{"allow", []string{"under_score.example.com"}, "character"},
		{"allow", []string{"bücher.example"}, "punycode"},
		{"allow", []string{"api.github.com/path"}, "api.github.com/path"},
		{"allow", []string{strings.Repeat("a", 64) + ".example"}, "longer than 63"},
		{"allow", []string{strings.Repeat("abcdefghi.", 26) + "example"}, "at most 253"},
		{"allow", []string{"1.2.3"}, `"1.2.3"`},
		{"allow", []string{"example.123"}, "all-numeric"},
		{"allow", []string{"203.0.113.0/33"}, "bad CIDR"},
		{"allow", []string{"203.0.113.0/24:0"}, "bad port"},
		{"allow", []string{"203.0.113.0/24:65536"}, "bad port"},
		{"allow", []string{"203.0.113.0/24:http"}, "bad port"},
		{"allow", []string{"203.0.113.0/24:"}, "empty port"},
		{"allow", []string{"[2001:db8::/32"}, "missing ']'"},
		{"allow", []string{"[2001:db8::/32]443"}, "after ']'"},
		{"allow", []string{"[2001:db8::/32]:"}, "empty port"},
		{"allow", []string{"[2001:db8::1%eth0]:22"}, "zoned"},
		{"allow", []string{"[fe80::1%eth0]:22"}, "zoned"},
		{"allow", []string{"127.0.0.1:5432"}, "never reachable"},
		{"allow", []string{"127.0.0.0/8"}, "never reachable"},
		{"allow", []string{"169.254.169.254:80"}, "never reachable"},
		{"allow", []string{"[::1]:80"}, "never reachable"},
		{"allow", []string{"[::ffff:127.0.0.1]:80"}, "never reachable"},
		{"allow", []string{"fe80::/64"}, "never reachable"},
		{"allow", []string{"0.0.0.0"}, "never reachable"},
		{"allow", []string{"[fd00:ec2::254]:80"}, "never reachable"},
		{"allow", []string{"api.github.com", "evil!.com"}, `"evil!.com"`},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s %.40v", tc.mode, tc.allow), func(t *testing.T) {
			_, err := ParsePolicy(tc.mode, tc.allow)
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %q does not contain %q", err, tc.msg)
			}
		})
	}
}

func mustPolicy(t *testing.T, mode string, allow ...string) Policy {
	t.Helper()
	p, err := ParsePolicy(mode, allow)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAllowsName(t *testing.T) {
	allow := mustPolicy(t, "allow", "api.github.com", "*.pypi.org", "files.pythonhosted.org")
	none := mustPolicy(t, "none")
	empty := mustPolicy(t, "allow")
	public := mustPolicy(t, "all-public")
	tests := []struct {
		p      Policy
		host   string
		want   bool
		reason string
	}{
		{allow, "api.github.com", true, "api.github.com"},
		{allow, "API.GitHub.COM", true, "api.github.com"},
		{allow, "api.github.com.", true, "api.github.com"},
		{allow, "github.com", false, "not in the allowlist"},
		{allow, "evil.api.github.com", false, "not in the allowlist"},
		{allow, "api.github.com.evil.test", false, "not in the allowlist"},
		{allow, "xapi.github.com", false, "not in the allowlist"},
		{allow, "files.pypi.org", true, "*.pypi.org"},
		{allow, "a.b.pypi.org", true, "*.pypi.org"},
		{allow, "pypi.org", false, "not in the allowlist"}, // wildcard excludes apex
		{allow, "evilpypi.org", false, "not in the allowlist"},
		{allow, "pypi.org.evil.test", false, "not in the allowlist"},
		{allow, "files.pythonhosted.org", true, "files.pythonhosted.org"},
		{allow, "", false, "invalid host name"},
		{allow, "203.0.113.5", false, "IP literal"},
		{allow, "::1", false, "IP literal"},
		{allow, "api.github.com:443", false, "invalid host name"},
		{allow, "under_score.pypi.org", false, "invalid host name"},
		{none, "api.github.com", false, "networking is off"},
		{Policy{}, "api.github.com", false, "networking is off"},
		{empty, "api.github.com", false, "not in the allowlist"},
		{public, "anything.example.com", true, "all-public"},
		{public, "localhost", true, "all-public"},
		{public, "bad..name", false, "invalid host name"},
		{public, "127.0.0.1", false, "IP literal"},
	}
	for _, tc := range tests {
		t.Run(string(tc.p.Mode)+" "+tc.host, func(t *testing.T) {
			got, reason := tc.p.AllowsName(tc.host)
			if got != tc.want || !strings.Contains(reason, tc.reason) {
				t.Fatalf("AllowsName(%q) = %v, %q; want %v, %q", tc.host, got, reason, tc.want, tc.reason)
			}
		})
	}
}

// TestAllowsAddr (threat-model.md #9, #10): the dial-time check refuses loopback,
// link-local, metadata, private, CGNAT and other special ranges, in every
// IPv6 embedding, whatever the policy; only an explicit, equally narrow
// CIDR rule opens a private range, and nothing opens loopback, link-local,
// metadata or unspecified addresses.
func TestAllowsAddr(t *testing.T) {
	allow := mustPolicy(t, "allow", "api.github.com", "203.0.113.0/24:443", "198.51.100.7", "[2001:db8:1::/48]:22",
		"10.1.2.0/24:5432", "100.64.5.0/24", "[fd12:3456::/32]:5432", "0.0.0.0/0:8443")
	public := mustPolicy(t, "all-public", "192.168.7.0/24:6379")
	none := mustPolicy(t, "none")

	type tc struct {
		p      Policy
		addr   string
		port   uint16
		named  bool
		want   bool
		reason string
	}
	var tests []tc
	// Always denied, whatever the policy and however the connection is made.
	denied := []struct{ addr, reason string }{
		{"0.0.0.0", "this network"},
		{"0.1.2.3", "this network"},
		{"127.0.0.1", "loopback"},
		{"127.255.255.254", "loopback"},
		{"10.0.0.5", "private 10.0.0.0/8"},
		{"10.255.255.255", "RFC 1918"},
		{"172.16.0.1", "private 172.16.0.0/12"},
		{"172.31.255.255", "RFC 1918"},
		{"192.168.1.1", "private 192.168.0.0/16"},
		{"100.64.0.1", "CGNAT"},
		{"100.127.255.255", "CGNAT"},
		{"100.100.100.200", "Alibaba"},
		{"169.254.169.254", "metadata 169.254.169.254"},
		{"169.254.0.1", "link-local"},
		{"192.0.0.8", "IETF protocol"},
		{"192.0.0.170", "IETF protocol"},
		{"192.88.99.1", "6to4 relay"},
		{"198.18.0.1", "benchmarking"},
		{"198.19.255.255", "benchmarking"},
		{"224.0.0.1", "multicast"},
		{"239.255.255.250", "multicast"},
		{"240.0.0.1", "reserved"},
		{"255.255.255.255", "broadcast"},
		{"::", "unspecified"},
		{"::1", "loopback ::1"},
		{"::ffff:127.0.0.1", "loopback 127"},
		{"::ffff:10.0.0.5", "private 10"},
		{"::ffff:169.254.169.254", "metadata"},
		{"::127.0.0.1", "IPv4-compatible"},
		{"::8.8.8.8", "IPv4-compatible"},
		{"64:ff9b::7f00:1", "NAT64 (RFC 6052) form of 127.0.0.1"},
		{"64:ff9b::a9fe:a9fe", "NAT64 (RFC 6052) form of 169.254.169.254"},
		{"64:ff9b::192.168.0.1", "NAT64"},
		{"64:ff9b:1::1", "local-use NAT64"},
		{"::ffff:0:a00:1", "IPv4-translated"},
		{"2002:7f00:1::1", "6to4 (RFC 3056) form of 127.0.0.1"},
		{"2002:a9fe:a9fe::", "6to4 (RFC 3056) form of 169.254.169.254"},
		{"2002:c0a8:101::1", "6to4"},
		{"2001:0:4136:e378:8000:63bf:80ff:fffe", "Teredo (RFC 4380) form of 127.0.0.1"}, // client ^7f000001
		{"2001:0:a00:1:8000:63bf:3fff:fdd2", "Teredo (RFC 4380) form of 10.0.0.1"},      // server 10.0.0.1
		{"fe80::1", "link-local fe80"},
		{"fe80::1%eth0", "link-local"},
		{"febf::1", "link-local"},
		{"fd00:ec2::254", "metadata fd00:ec2::254"},
		{"fc00::1", "unique local"},
		{"fdff:ffff::1", "unique local"},
		{"fec0::1", "site-local"},
		{"ff02::1", "multicast"},
		{"100::1", "discard-only"},
	}
	for _, d := range denied {
		for _, p := range []Policy{allow, public} {
			for _, named := range []bool{true, false} {
				tests = append(tests, tc{p, d.addr, 443, named, false, d.reason})
			}
		}
		tests = append(tests, tc{none, d.addr, 443, true, false, "networking is off"})
	}
	tests = append(tests,
		// Public addresses: named connections pass in allow and all-public.
		tc{allow, "140.82.112.5", 443, true, true, "allowed name"},
		tc{allow, "2606:50c0:8000::153", 443, true, true, "allowed name"},
		tc{allow, "::ffff:140.82.112.5", 443, true, true, "allowed name"},
		tc{allow, "64:ff9b::8c52:7005", 443, true, true, "allowed name"}, // NAT64 of public
		tc{allow, "2002:8c52:7005::1", 443, true, true, "allowed name"},  // 6to4 of public
		tc{public, "140.82.112.5", 443, true, true, "all-public"},
		tc{public, "140.82.112.5", 22, false, true, "all-public"},
		tc{none, "140.82.112.5", 443, true, false, "networking is off"},
		tc{Policy{}, "140.82.112.5", 443, true, false, "networking is off"},
		tc{allow, "", 443, true, false, "invalid address"},
		// Documentation ranges are not special (corral's tests live there).
		tc{public, "203.0.113.9", 80, false, true, "all-public"},
		tc{public, "2001:db8::1", 80, false, true, "all-public"},
		// Unnamed (raw TCP) connections in allow mode need a rule.
		tc{allow, "203.0.113.9", 443, false, true, "rule 203.0.113.0/24:443"},
		tc{allow, "203.0.113.9", 80, false, false, "not in the allowlist"},
		tc{allow, "::ffff:203.0.113.9", 443, false, true, "rule"},
		tc{allow, "198.51.100.7", 1234, false, true, "rule 198.51.100.7/32"},
		tc{allow, "198.51.100.8", 1234, false, false, "not in the allowlist"},
		tc{allow, "2001:db8:1::99", 22, false, true, "rule"},
		tc{allow, "2001:db8:1::99", 23, false, false, "not in the allowlist"},
		tc{allow, "2001:db8:2::99", 22, false, false, "not in the allowlist"},
		tc{allow, "140.82.112.5", 8443, false, true, "rule 0.0.0.0/0:8443"},
		// The CIDR-rule exception for private-like ranges.
		tc{allow, "10.1.2.3", 5432, false, true, "explicit rule 10.1.2.0/24:5432"},
		tc{allow, "10.1.2.3", 5432, true, true, "explicit rule"},
		tc{allow, "::ffff:10.1.2.3", 5432, false, true, "explicit rule"},
		tc{allow, "10.1.2.3", 5433, false, false, "private"},
		tc{allow, "10.1.3.3", 5432, false, false, "private"},
		tc{allow, "100.64.5.77", 9000, false, true, "explicit rule 100.64.5.0/24"},
		tc{allow, "fd12:3456::5", 5432, false, true, "explicit rule"},
		tc{public, "192.168.7.20", 6379, false, true, "explicit rule"},
		tc{public, "192.168.7.20", 6380, false, false, "private"},
		// A broad rule does not open private ranges, and an embedded form
		// of a ruled private address stays denied.
		tc{allow, "10.0.0.1", 8443, false, false, "private"},
		tc{allow, "192.168.0.1", 8443, true, false, "private"},
		tc{allow, "127.0.0.1", 8443, false, false, "loopback"},
		tc{allow, "64:ff9b::a01:203", 5432, false, false, "NAT64"},
	)
	if len(tests) < 40 {
		t.Fatalf("only %d cases", len(tests))
	}
	for _, c := range tests {
		name := fmt.Sprintf("%s/%s:%d/named=%v", c.p.Mode, c.addr, c.port, c.named)
		t.Run(name, func(t *testing.T) {
			var a netip.Addr
			if c.addr != "" {
				a = netip.MustParseAddr(c.addr)
			}
			got, reason := c.p.AllowsAddr(a, c.port, c.named)
			if got != c.want || !strings.Contains(reason, c.reason) {
				t.Fatalf("AllowsAddr = %v, %q; want %v, %q", got, reason, c.want, c.reason)
			}
		})
	}
}

// TestAlwaysDenied covers the exported check on its own, including the
// private range a policy rule could open.
func TestAlwaysDenied(t *testing.T) {
	for _, c := range []struct {
		addr string
		want bool
	}{
		{"10.1.2.3", true}, {"::ffff:192.168.1.1", true}, {"169.254.169.254", true},
		{"fd00:ec2::254", true}, {"64:ff9b::100.100.100.200", true}, {"100.100.100.200", true},
		{"140.82.112.5", false}, {"203.0.113.1", false}, {"2606:4700::1111", false},
		{"64:ff9b::1.1.1.1", false}, {"2001:db8::1", false},
	} {
		got, reason := AlwaysDenied(netip.MustParseAddr(c.addr))
		if got != c.want || got != (reason != "") {
			t.Errorf("AlwaysDenied(%s) = %v, %q; want %v", c.addr, got, reason, c.want)
		}
	}
	if got, _ := AlwaysDenied(netip.Addr{}); !got {
		t.Error("invalid address not denied")
	}
}

// TestAttack09MetadataNeverAllowed (threat-model.md #9): no policy, however broad,
// lets a sandbox dial a cloud metadata endpoint, named or not, in any form.
func TestAttack09MetadataNeverAllowed(t *testing.T) {
	policies := []Policy{
		mustPolicy(t, "all-public", "0.0.0.0/0", "::/0", "169.254.0.0/15"),
		mustPolicy(t, "allow", "0.0.0.0/0", "::/0", "metadata.google.internal", "*.internal.example"),
	}
	for _, p := range policies {
		for _, s := range []string{"169.254.169.254", "::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe",
			"2002:a9fe:a9fe::1", "fd00:ec2::254", "100.100.100.200", "169.254.170.2"} {
			for _, named := range []bool{true, false} {
				if ok, _ := p.AllowsAddr(netip.MustParseAddr(s), 80, named); ok {
					t.Errorf("%s %s named=%v allowed", p.Mode, s, named)
				}
			}
		}
	}
}

// TestAttack10Rebinding (threat-model.md #10): the check is on the dialed address,
// so an allowed name whose answer changes from public to loopback or
// private is refused at the second dial.
func TestAttack10Rebinding(t *testing.T) {
	p := mustPolicy(t, "allow", "rebind.example.com")
	if ok, _ := p.AllowsName("rebind.example.com"); !ok {
		t.Fatal("name refused")
	}
	if ok, _ := p.AllowsAddr(netip.MustParseAddr("203.0.113.10"), 443, true); !ok {
		t.Fatal("first (public) answer refused")
	}
	for _, s := range []string{"127.0.0.1", "10.0.0.5", "::1", "::ffff:127.0.0.1"} {
		if ok, _ := p.AllowsAddr(netip.MustParseAddr(s), 443, true); ok {
			t.Errorf("rebound answer %s allowed", s)
		}
	}
}
