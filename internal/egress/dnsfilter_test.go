package egress

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/corralhq/corral/internal/ratelimit"
)

// dnsFakeResolver is the upstream of the tests: a fixed map, no network. It
// counts lookups per name so that tests can assert it was not consulted.
type dnsFakeResolver struct {
	mu      sync.Mutex
	answers map[string][]netip.Addr
	lookups map[string]int
}

func newDNSFakeResolver(answers map[string][]string) *dnsFakeResolver {
	f := &dnsFakeResolver{answers: map[string][]netip.Addr{}, lookups: map[string]int{}}
	for name, as := range answers {
		for _, a := range as {
			f.answers[name] = append(f.answers[name], netip.MustParseAddr(a))
		}
	}
	return f
}

func (f *dnsFakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lookups[host]++
	as, ok := f.answers[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return slices.Clone(as), nil
}

func (f *dnsFakeResolver) count(host string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lookups[host]
}

func (f *dnsFakeResolver) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.lookups {
		n += c
	}
	return n
}

// eventLog collects the filter's events.
type eventLog struct {
	mu  sync.Mutex
	evs []Event
}

func (l *eventLog) add(ev Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.evs = append(l.evs, ev)
}

func (l *eventLog) all() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.evs)
}

const exfilName = "mzxw6ytboi2gk4tfmvzgc3tfon2gk3dpojsws.attacker.test"

func testUpstream() *dnsFakeResolver {
	return newDNSFakeResolver(map[string][]string{
		"api.example.test":      {"203.0.113.10", "2001:db8::10"},
		"www.attacker.test":     {"203.0.113.20"},
		exfilName:               {"203.0.113.21"},
		"unlisted.example.org":  {"203.0.113.30"},
		"internal.example.test": {"10.0.0.5", "169.254.169.254", "127.0.0.1", "::1", "fe80::1", "::ffff:10.0.0.6"},
		"mixed.example.test":    {"10.0.0.5", "203.0.113.11", "169.254.169.254"},
	})
}

func testPolicy(t *testing.T, mode string, allow ...string) Policy {
	t.Helper()
	p, err := ParsePolicy(mode, allow)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// startFilter serves a filter on 127.0.0.1 (UDP and TCP, same port) and
// returns its address. It is stopped when the test ends.
func startFilter(t *testing.T, cfg DNSFilterConfig) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", ln.Addr().String())
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- NewDNSFilter(cfg).Serve(ctx, pc, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after cancel")
		}
	})
	return ln.Addr().String()
}

func query(t *testing.T, addr, network, name string, qtype, qclass uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.Question[0].Qclass = qclass
	c := &dns.Client{Net: network, Timeout: 5 * time.Second}
	resp, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s query %s %s: %v", network, name, dns.TypeToString[qtype], err)
	}
	return resp
}

func answerAddrs(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		switch v := rr.(type) {
		case *dns.A:
			out = append(out, v.A.String())
		case *dns.AAAA:
			out = append(out, v.AAAA.String())
		default:
			out = append(out, "unexpected "+rr.String())
		}
	}
	return out
}

func TestDNSFilter(t *testing.T) {
	up := testUpstream()
	evs := &eventLog{}
	pol := testPolicy(t, "allow", "api.example.test", "*.attacker.test", "internal.example.test", "mixed.example.test")
	addr := startFilter(t, DNSFilterConfig{
		Policy: func(c netip.Addr) (Policy, string, bool) {
			if c == netip.MustParseAddr("127.0.0.1") {
				return pol, "sb-1", true
			}
			return Policy{}, "", false
		},
		Resolver: up,
		Limiter:  ratelimit.New(1000, 1000),
		TTL:      42,
		OnEvent:  evs.add,
	})

	tests := []struct {
		name        string
		net         string
		qname       string
		qtype       uint16
		qclass      uint16 // 0 = IN
		wantRcode   int
		wantAddrs   []string
		wantLookups int // lookups of qname by the upstream
		wantVerdict string
		wantReason  string // substring
	}{
		{"allowed A", "udp", "api.example.test", dns.TypeA, 0, dns.RcodeSuccess, []string{"203.0.113.10"}, 1, VerdictAllowed, "api.example.test"},
		{"allowed AAAA", "udp", "api.example.test", dns.TypeAAAA, 0, dns.RcodeSuccess, []string{"2001:db8::10"}, 1, VerdictAllowed, "api.example.test"},
		{"allowed A over TCP", "tcp", "API.Example.Test", dns.TypeA, 0, dns.RcodeSuccess, []string{"203.0.113.10"}, 1, VerdictAllowed, "api.example.test"},
		{"wildcard allows ordinary name", "udp", "www.attacker.test", dns.TypeA, 0, dns.RcodeSuccess, []string{"203.0.113.20"}, 1, VerdictAllowed, "*.attacker.test"},
		{"unlisted name", "udp", "unlisted.example.org", dns.TypeA, 0, dns.RcodeNameError, nil, 0, VerdictRefused, "not in the allowlist"},
		{"wildcard base is not a subdomain", "udp", "attacker.test", dns.TypeA, 0, dns.RcodeNameError, nil, 0, VerdictRefused, "not in the allowlist"},
		{"exfil label under allowed wildcard", "udp", exfilName, dns.TypeA, 0, dns.RcodeRefused, nil, 0, VerdictRefused, "suspected DNS exfiltration"},
		{"exfil over TCP", "tcp", exfilName, dns.TypeAAAA, 0, dns.RcodeRefused, nil, 0, VerdictRefused, "suspected DNS exfiltration"},
		{"allowed name to private, metadata, loopback A", "udp", "internal.example.test", dns.TypeA, 0, dns.RcodeSuccess, nil, 1, VerdictRefused, "every address refused: 10.0.0.5"},
		{"allowed name to loopback and link-local AAAA", "udp", "internal.example.test", dns.TypeAAAA, 0, dns.RcodeSuccess, nil, 1, VerdictRefused, "every address refused"},
		{"denied addresses dropped, public kept", "udp", "mixed.example.test", dns.TypeA, 0, dns.RcodeSuccess, []string{"203.0.113.11"}, 1, VerdictAllowed, "dropped 10.0.0.5"},
		{"TXT for allowed name", "udp", "api.example.test", dns.TypeTXT, 0, dns.RcodeRefused, nil, 0, VerdictRefused, "TXT is not served"},
		{"MX for allowed name", "udp", "api.example.test", dns.TypeMX, 0, dns.RcodeRefused, nil, 0, VerdictRefused, "MX is not served"},
		{"ANY for allowed name", "tcp", "api.example.test", dns.TypeANY, 0, dns.RcodeRefused, nil, 0, VerdictRefused, "ANY is not served"},
		{"NULL for allowed name", "udp", "www.attacker.test", dns.TypeNULL, 0, dns.RcodeRefused, nil, 0, VerdictRefused, "NULL is not served"},
		{"TXT for unlisted name", "udp", "unlisted.example.org", dns.TypeTXT, 0, dns.RcodeNameError, nil, 0, VerdictRefused, "not in the allowlist"},
		{"class CHAOS", "udp", "api.example.test", dns.TypeTXT, dns.ClassCHAOS, dns.RcodeRefused, nil, 0, VerdictRefused, "IN only"},
		{"IP literal is not a name", "udp", "203.0.113.10", dns.TypeA, 0, dns.RcodeNameError, nil, 0, VerdictRefused, "invalid host name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			host := normalizeHost(tc.qname)
			before, beforeTotal := up.count(host), up.total()
			nEv := len(evs.all())
			qclass := tc.qclass
			if qclass == 0 {
				qclass = dns.ClassINET
			}
			resp := query(t, addr, tc.net, tc.qname, tc.qtype, qclass)
			if resp.Rcode != tc.wantRcode {
				t.Errorf("rcode = %s, want %s", dns.RcodeToString[resp.Rcode], dns.RcodeToString[tc.wantRcode])
			}
			if got := answerAddrs(resp); !slices.Equal(got, tc.wantAddrs) {
				t.Errorf("answer = %v, want %v", got, tc.wantAddrs)
			}
			for _, rr := range resp.Answer {
				if rr.Header().Ttl != 42 {
					t.Errorf("TTL = %d, want 42", rr.Header().Ttl)
				}
			}
			if got := up.count(host) - before; got != tc.wantLookups {
				t.Errorf("upstream lookups of %q = %d, want %d", host, got, tc.wantLookups)
			}
			if got := up.total() - beforeTotal; got != tc.wantLookups {
				t.Errorf("upstream lookups in total = %d, want %d", got, tc.wantLookups)
			}
			all := evs.all()
			if len(all) != nEv+1 {
				t.Fatalf("%d events for one query, want 1", len(all)-nEv)
			}
			ev := all[len(all)-1]
			wantMethod := "DNS " + dns.TypeToString[tc.qtype]
			if ev.Sandbox != "sb-1" && tc.qclass == 0 || ev.Host != host || ev.Method != wantMethod || ev.Verdict != tc.wantVerdict || !strings.Contains(ev.Reason, tc.wantReason) {
				t.Errorf("event = %+v, want sandbox sb-1, host %q, method %q, verdict %s, reason containing %q", ev, host, wantMethod, tc.wantVerdict, tc.wantReason)
			}
			if len(tc.wantAddrs) > 0 && ev.Addr != strings.Join(tc.wantAddrs, ",") {
				t.Errorf("event addr = %q, want %q", ev.Addr, strings.Join(tc.wantAddrs, ","))
			}
		})
	}
}

func TestDNSFilterRefusesWholesale(t *testing.T) {
	tests := []struct {
		name       string
		policy     func(netip.Addr) (Policy, string, bool)
		wantSbx    string
		wantReason string
	}{
		{
			name:       "unknown client",
			policy:     func(netip.Addr) (Policy, string, bool) { return Policy{}, "", false },
			wantReason: "unknown client 127.0.0.1",
		},
		{
			name: "mode none",
			policy: func(netip.Addr) (Policy, string, bool) {
				return Policy{Mode: ModeNone}, "sb-none", true
			},
			wantSbx:    "sb-none",
			wantReason: "networking is off",
		},
		{
			name: "zero policy",
			policy: func(netip.Addr) (Policy, string, bool) {
				return Policy{}, "sb-zero", true
			},
			wantSbx:    "sb-zero",
			wantReason: "networking is off",
		},
	}
	queries := []struct {
		net   string
		name  string
		qtype uint16
	}{
		{"udp", "api.example.test", dns.TypeA},
		{"udp", "api.example.test", dns.TypeAAAA},
		{"tcp", "api.example.test", dns.TypeA},
		{"udp", "www.attacker.test", dns.TypeTXT},
		{"udp", "unlisted.example.org", dns.TypeA},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			up := testUpstream()
			evs := &eventLog{}
			addr := startFilter(t, DNSFilterConfig{Policy: tc.policy, Resolver: up, OnEvent: evs.add})
			for _, q := range queries {
				resp := query(t, addr, q.net, q.name, q.qtype, dns.ClassINET)
				if resp.Rcode != dns.RcodeRefused || len(resp.Answer) != 0 {
					t.Errorf("%s %s: rcode %s with %d answers, want REFUSED and none", q.name, dns.TypeToString[q.qtype], dns.RcodeToString[resp.Rcode], len(resp.Answer))
				}
			}
			if n := up.total(); n != 0 {
				t.Errorf("upstream consulted %d times, want 0", n)
			}
			all := evs.all()
			if len(all) != len(queries) {
				t.Fatalf("%d events, want %d", len(all), len(queries))
			}
			for i, ev := range all {
				if ev.Sandbox != tc.wantSbx || ev.Verdict != VerdictRefused || ev.Reason != tc.wantReason || ev.Host != queries[i].name {
					t.Errorf("event %d = %+v, want sandbox %q, refused, reason %q", i, ev, tc.wantSbx, tc.wantReason)
				}
			}
		})
	}
}

func TestDNSFilterRateLimit(t *testing.T) {
	up := testUpstream()
	evs := &eventLog{}
	pol := testPolicy(t, "allow", "api.example.test")
	const burst = 3
	addr := startFilter(t, DNSFilterConfig{
		Policy:   func(netip.Addr) (Policy, string, bool) { return pol, "sb-rl", true },
		Resolver: up,
		Limiter:  ratelimit.New(0.001, burst),
		OnEvent:  evs.add,
	})
	for i := range burst + 2 {
		network := "udp"
		if i == burst+1 {
			network = "tcp"
		}
		resp := query(t, addr, network, "api.example.test", dns.TypeA, dns.ClassINET)
		want := dns.RcodeSuccess
		if i >= burst {
			want = dns.RcodeRefused
		}
		if resp.Rcode != want {
			t.Errorf("query %d: rcode %s, want %s", i, dns.RcodeToString[resp.Rcode], dns.RcodeToString[want])
		}
	}
	if n := up.count("api.example.test"); n != burst {
		t.Errorf("upstream lookups = %d, want %d (none once over the limit)", n, burst)
	}
	all := evs.all()
	if len(all) != burst+2 {
		t.Fatalf("%d events, want %d", len(all), burst+2)
	}
	for i, ev := range all[burst:] {
		if ev.Sandbox != "sb-rl" || ev.Verdict != VerdictRefused || ev.Reason != "query rate limit exceeded" {
			t.Errorf("event %d = %+v, want refused for the rate limit", burst+i, ev)
		}
	}
}

func TestDNSFilterQuestionCount(t *testing.T) {
	up := testUpstream()
	evs := &eventLog{}
	pol := testPolicy(t, "allow", "api.example.test")
	addr := startFilter(t, DNSFilterConfig{
		Policy:   func(netip.Addr) (Policy, string, bool) { return pol, "sb-q", true },
		Resolver: up,
		OnEvent:  evs.add,
	})
	for _, n := range []int{0, 2} {
		m := new(dns.Msg)
		m.Id = dns.Id()
		m.RecursionDesired = true
		for range n {
			m.Question = append(m.Question, dns.Question{Name: "api.example.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
		}
		c := &dns.Client{Net: "udp", Timeout: 5 * time.Second}
		resp, _, err := c.Exchange(m, addr)
		if err != nil {
			t.Fatalf("%d questions: %v", n, err)
		}
		if resp.Rcode != dns.RcodeFormatError || len(resp.Answer) != 0 {
			t.Errorf("%d questions: rcode %s with %d answers, want FORMERR", n, dns.RcodeToString[resp.Rcode], len(resp.Answer))
		}
	}
	if n := up.total(); n != 0 {
		t.Errorf("upstream consulted %d times, want 0", n)
	}
	if all := evs.all(); len(all) != 2 || all[0].Verdict != VerdictRefused || all[1].Verdict != VerdictRefused {
		t.Errorf("events = %+v, want two refusals", all)
	}
}

func TestDNSFilterListenAndServeStops(t *testing.T) {
	f := NewDNSFilter(DNSFilterConfig{Policy: func(netip.Addr) (Policy, string, bool) { return Policy{}, "", false }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.ListenAndServe(ctx, "127.0.0.1:0") }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ListenAndServe: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ListenAndServe did not return after cancel")
	}
}
