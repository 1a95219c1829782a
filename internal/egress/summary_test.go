package egress

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/corralhq/corral/internal/ratelimit"
)

// summaries collects a Summarizer's output.
type summaries struct {
	mu  sync.Mutex
	out []Summary
}

func (s *summaries) add(sum Summary) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.out = append(s.out, sum)
}

func (s *summaries) all() []Summary {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Summary(nil), s.out...)
}

// udpQuery sends one A query for name from laddr to the filter at addr.
func udpQuery(t *testing.T, laddr, addr, name string) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	la, err := net.ResolveUDPAddr("udp", laddr)
	if err != nil {
		t.Fatal(err)
	}
	c := &dns.Client{Net: "udp", Timeout: 5 * time.Second, Dialer: &net.Dialer{LocalAddr: la}}
	resp, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("query %s from %s: %v", name, laddr, err)
	}
	return resp
}

// TestSummarizerBoundsDNSFlood defends against the audit flood of issue 10
// item 4: a sandbox looping over refused names made one audit event (and
// one log line) per query. With a Summarizer, sandbox sb-flood's first
// After refusals are events, the rest are counted in one summary (counts
// by mode, top names, top reasons) when its window ends; its allowed
// queries are all events; another sandbox's refusals are recorded one by
// one as before (windows are per sandbox); and nothing is lost: events
// plus suppressed counts equal the queries sent.
func TestSummarizerBoundsDNSFlood(t *testing.T) {
	const after, flood = 5, 600
	sums := &summaries{}
	var logBuf strings.Builder
	var logMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logBuf.Write(b)
	}), nil))
	sum := NewSummarizer(SummaryConfig{Interval: time.Hour, After: after, OnSummary: sums.add})
	evs := &eventLog{}
	pol := testPolicy(t, "allow", "api.example.test")
	addr := startFilter(t, DNSFilterConfig{
		Policy: func(c netip.Addr) (Policy, string, bool) {
			switch c {
			case netip.MustParseAddr("127.0.0.1"):
				return pol, "sb-flood", true
			case netip.MustParseAddr("127.0.0.2"):
				return pol, "sb-other", true
			}
			return Policy{}, "", false
		},
		Resolver: testUpstream(),
		Limiter:  ratelimit.New(1e6, 1e6),
		Log:      logger,
		OnEvent:  evs.add,
		Summary:  sum,
	})
	names := []string{"a.refused.test", "a.refused.test", "a.refused.test", "b.refused.test", "b.refused.test", "c.refused.test"}
	allowed := 0
	for i := 0; i < flood; i++ {
		if r := udpQuery(t, "127.0.0.1:0", addr, names[i%len(names)]); r.Rcode != dns.RcodeNameError {
			t.Fatalf("query %d: rcode %s, want NXDOMAIN", i, dns.RcodeToString[r.Rcode])
		}
		if i%100 == 0 {
			if r := udpQuery(t, "127.0.0.1:0", addr, "api.example.test"); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
				t.Fatalf("allowed query during the flood: %v", r)
			}
			allowed++
		}
	}
	for i := 0; i < after+3; i++ {
		udpQuery(t, "127.0.0.2:0", addr, "other.refused.test")
	}
	count := func(sandbox, verdict string) int {
		n := 0
		for _, e := range evs.all() {
			if e.Sandbox == sandbox && e.Verdict == verdict {
				n++
			}
		}
		return n
	}
	if n := count("sb-flood", VerdictRefused); n != after {
		t.Errorf("sb-flood: %d refused events, want %d (the rest summarised)", n, after)
	}
	if n := count("sb-flood", VerdictAllowed); n != allowed {
		t.Errorf("sb-flood: %d allowed events, want every one of %d", n, allowed)
	}
	if n := count("sb-other", VerdictRefused); n != after {
		t.Errorf("sb-other: %d refused events, want %d", n, after)
	}
	logMu.Lock()
	lines := strings.Count(logBuf.String(), "refused.test")
	logMu.Unlock()
	if lines != 2*after {
		t.Errorf("%d log lines name a refused name, want %d (summarised refusals are not logged one by one)", lines, 2*after)
	}
	if got := sums.all(); len(got) != 0 {
		t.Fatalf("summary before the window ended: %+v", got)
	}
	sum.Forget("sb-flood")
	got := sums.all()
	if len(got) != 1 {
		t.Fatalf("%d summaries after Forget, want 1: %+v", len(got), got)
	}
	s := got[0]
	if s.Sandbox != "sb-flood" || s.Recorded != after || s.Suppressed != flood-after || s.ByMode[EventDNS] != flood-after {
		t.Fatalf("summary %+v: want sb-flood, %d recorded, %d suppressed (all dns)", s, after, flood-after)
	}
	if len(s.TopNames) != 3 || s.TopNames[0].Name != "a.refused.test" || s.TopNames[1].Name != "b.refused.test" ||
		s.TopNames[0].Count+s.TopNames[1].Count+s.TopNames[2].Count != flood-after {
		t.Fatalf("top names %+v: want a, b, c.refused.test summing to %d", s.TopNames, flood-after)
	}
	if len(s.TopReasons) != 1 || !strings.Contains(s.TopReasons[0].Name, "not in the allowlist") {
		t.Fatalf("top reasons %+v", s.TopReasons)
	}
	if s.End.Before(s.Start) {
		t.Fatalf("window %v..%v", s.Start, s.End)
	}
	// sb-other's window summarises its 3 extra refusals on Close.
	sum.Close()
	if got := sums.all(); len(got) != 2 || got[1].Sandbox != "sb-other" || got[1].Suppressed != 3 {
		t.Fatalf("summaries after Close: %+v", got)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// TestSummarizerWindows checks that a window ends by itself when its
// interval's timer fires (its summary is emitted without further traffic) and that the
// next window records refusals one by one again; a window with nothing
// suppressed emits no summary.
func TestSummarizerWindows(t *testing.T) {
	sums := &summaries{}
	s := NewSummarizer(SummaryConfig{Interval: time.Minute, After: 2, OnSummary: sums.add})
	defer s.Close()
	// The window's timer is the one the summarizer starts; the test fires
	// it instead of waiting for the clock.
	var fire func()
	var gotInterval time.Duration
	s.afterFunc = func(d time.Duration, f func()) func() bool {
		gotInterval, fire = d, f
		return func() bool { return true }
	}
	ev := Event{Sandbox: "sb", Mode: EventRaw, Host: "203.0.113.9", Verdict: VerdictRefused, Reason: "no rule"}
	var admitted []bool
	for i := 0; i < 5; i++ {
		admitted = append(admitted, s.admit(ev))
	}
	if fmt.Sprint(admitted) != "[true true false false false]" {
		t.Fatalf("admitted %v", admitted)
	}
	if !s.admit(Event{Sandbox: "sb", Verdict: VerdictAllowed}) {
		t.Fatal("an allowed event was suppressed")
	}
	if gotInterval != time.Minute || fire == nil {
		t.Fatalf("window timer started with %v (fire set: %v), want the interval", gotInterval, fire != nil)
	}
	if n := len(sums.all()); n != 0 {
		t.Fatalf("%d summaries before the window ended", n)
	}
	fire()
	got := sums.all()
	if len(got) != 1 || got[0].Suppressed != 3 || got[0].ByMode[EventRaw] != 3 || got[0].TopNames[0] != (Count{"203.0.113.9", 3}) {
		t.Fatalf("summaries %+v", got)
	}
	if !s.admit(ev) {
		t.Fatal("the first refusal of a new window was suppressed")
	}
	s.Forget("sb") // nothing suppressed: no summary
	if n := len(sums.all()); n != 1 {
		t.Fatalf("%d summaries, want 1", n)
	}
	var nilSum *Summarizer
	if !nilSum.admit(ev) {
		t.Fatal("a nil Summarizer suppressed an event")
	}
}

// TestSummarizerProxyRefusals checks that the proxy's refusals (here
// explicit-mode requests for a name outside the allowlist, answered 403
// before anything is dialled) go through the same summarizer.
func TestSummarizerProxyRefusals(t *testing.T) {
	sums := &summaries{}
	sum := NewSummarizer(SummaryConfig{Interval: time.Hour, After: 3, OnSummary: sums.add})
	pol := testPolicy(t, "allow", "allowed.test")
	evs := &proxyEvents{}
	p := NewProxy(ProxyConfig{
		Client:  func(netip.Addr) (Client, bool) { return Client{ID: "sb-p", Policy: pol}, true },
		OnEvent: evs.add,
		Summary: sum,
	})
	addr := serveExplicit(t, p)
	for i := 0; i < 20; i++ {
		c, br := dialProxy(t, addr) // the proxy closes the connection after a refusal
		if st, _, _ := explicitGet(t, c, br, "http://refused.test/"); st != 403 {
			t.Fatalf("request %d: status %d, want 403", i, st)
		}
		c.Close()
	}
	sum.Forget("sb-p")
	if n := len(evs.all()); n != 3 {
		t.Errorf("%d proxy events, want 3", n)
	}
	got := sums.all()
	if len(got) != 1 || got[0].Suppressed != 17 || got[0].ByMode[EventExplicit] != 17 || got[0].TopNames[0] != (Count{"refused.test", 17}) {
		t.Fatalf("summaries %+v", got)
	}
}

// TestTopCounterKeepsHeavyHitters: a flood of distinct names (DNS
// exfiltration) takes constant memory, and a name asked far more often
// than the rest is still the top name with a count close to its own.
func TestTopCounterKeepsHeavyHitters(t *testing.T) {
	var c topCounter
	for i := 0; i < 20000; i++ {
		c.add(fmt.Sprintf("x%d.exfil.test", i))
		if i%4 == 0 {
			c.add("heavy.test")
		}
	}
	if len(c.n) > summaryTracked {
		t.Fatalf("%d counters, want at most %d", len(c.n), summaryTracked)
	}
	top := c.top(SummaryTopN)
	if len(top) != SummaryTopN || top[0].Name != "heavy.test" || top[0].Count < 5000 {
		t.Fatalf("top %+v", top)
	}
}
