package egress

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeClock is a settable clock for the request-rate window.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// explicitGet sends a GET for target through the explicit proxy on the
// raw connection c and reads the response.
func explicitGet(t *testing.T, c net.Conn, br *bufio.Reader, target string) (int, string, string) {
	t.Helper()
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", target)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("GET %s: %v", target, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("X-Corral-Egress-Refused"), string(b)
}

func dialProxy(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return c, bufio.NewReader(c)
}

// lastEvent waits for n events and returns the last.
func lastEvent(t *testing.T, evs *proxyEvents, n int) Event {
	t.Helper()
	got := waitEvents(t, evs.all, n)
	if len(got) < n {
		t.Fatalf("got %d events, want %d: %+v", len(got), n, got)
	}
	return got[n-1]
}

// refusedEvent waits for n events and returns the one refused with
// reason. Events are recorded when a request or connection ends, so an
// allowed request's event may come after the next request's refusal; the
// order is not asserted.
func refusedEvent(t *testing.T, evs *proxyEvents, n int, reason string) Event {
	t.Helper()
	got := waitEvents(t, evs.all, n)
	var found []Event
	for _, ev := range got {
		if ev.Reason == reason && ev.Verdict == VerdictRefused {
			found = append(found, ev)
		}
	}
	if len(got) < n || len(found) == 0 {
		t.Fatalf("got %d events (want %d), none refused with %q: %+v", len(got), n, reason, got)
	}
	return found[len(found)-1]
}

// countRefused counts the events refused with reason.
func countRefused(evs []Event, reason string) int {
	n := 0
	for _, ev := range evs {
		if ev.Reason == reason && ev.Verdict == VerdictRefused {
			n++
		}
	}
	return n
}

// TestCapConnections checks the per-sandbox connection cap (threat-model.md
// #21) in both modes: with MaxConns 1, a second connection while the first
// is open is refused with reason "cap: connections" (403 in explicit mode,
// a reset for a redirected connection), and once the first is closed a new
// one is admitted.
func TestCapConnections(t *testing.T) {
	e := newEgressEnv(t)
	pol, _ := ParsePolicy("allow", []string{"allowed.test", "203.0.113.0/24"})
	target := "http://allowed.test:" + strconv.Itoa(int(e.port)) + "/conns"

	t.Run("explicit", func(t *testing.T) {
		p, evs := e.newProxy(t, Client{ID: "sb-c1", Policy: pol, Limits: Limits{MaxConns: 1}}, ProxyConfig{})
		addr := serveExplicit(t, p)
		c1, br1 := dialProxy(t, addr)
		if st, _, _ := explicitGet(t, c1, br1, target); st != 200 {
			t.Fatalf("first connection: %d", st)
		}
		if u := p.Usage("sb-c1"); u.Conns != 1 {
			t.Fatalf("usage %+v, want 1 connection", u)
		}
		c2, br2 := dialProxy(t, addr)
		st, why, _ := explicitGet(t, c2, br2, target)
		if st != 403 || why != ReasonCapConns {
			t.Fatalf("second connection: %d %q, want 403 %q", st, why, ReasonCapConns)
		}
		if ev := refusedEvent(t, evs, 2, ReasonCapConns); ev.Sandbox != "sb-c1" {
			t.Fatalf("event %+v", ev)
		}
		c1.Close()
		c2.Close()
		waitUsage(t, p, "sb-c1", 0)
		c3, br3 := dialProxy(t, addr)
		if st, why, _ := explicitGet(t, c3, br3, target); st != 200 {
			t.Fatalf("after close: %d %q", st, why)
		}
	})

	t.Run("transparent", func(t *testing.T) {
		p, evs := e.newProxy(t, Client{ID: "sb-c2", Policy: pol, Limits: Limits{MaxConns: 1}}, ProxyConfig{FirstByteTimeout: 20 * time.Millisecond})
		c1, done1 := transparentConn(t, p, e.rawUpstream)
		io.WriteString(c1, "\x00hi")
		buf := make([]byte, len(rawGreeting)+3)
		if _, err := io.ReadFull(c1, buf); err != nil {
			t.Fatalf("first connection: %v", err)
		}
		c2, _ := transparentConn(t, p, e.rawUpstream)
		expectReset(t, c2)
		if ev := lastEvent(t, evs, 1); ev.Reason != ReasonCapConns || ev.Verdict != VerdictRefused {
			t.Fatalf("event %+v, want %q", ev, ReasonCapConns)
		}
		c1.Close()
		<-done1
		c3, _ := transparentConn(t, p, e.rawUpstream)
		if _, err := io.ReadFull(c3, buf[:len(rawGreeting)]); err != nil {
			t.Fatalf("after close: %v", err)
		}
	})
	e.checkNoViolations(t)
}

// waitUsage waits until id has conns open connections.
func waitUsage(t *testing.T, p *Proxy, id string, conns int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for p.Usage(id).Conns != conns {
		if time.Now().After(deadline) {
			t.Fatalf("usage %+v, want %d connections", p.Usage(id), conns)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCapRequestsPerMinute checks the request-rate cap (threat-model.md #21):
// with 2 requests per minute the third request within the minute is
// refused with "cap: requests per minute", redirected connections count
// too, and a minute later requests pass again. The clock is simulated.
func TestCapRequestsPerMinute(t *testing.T) {
	e := newEgressEnv(t)
	pol, _ := ParsePolicy("allow", []string{"allowed.test", "203.0.113.0/24"})
	p, evs := e.newProxy(t, Client{ID: "sb-r", Policy: pol, Limits: Limits{RequestsPerMinute: 2}}, ProxyConfig{})
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	p.now = clock.now
	addr := serveExplicit(t, p)
	target := "http://allowed.test:" + strconv.Itoa(int(e.port)) + "/rate"

	c, br := dialProxy(t, addr)
	for i := 0; i < 2; i++ {
		if st, why, _ := explicitGet(t, c, br, target); st != 200 {
			t.Fatalf("request %d: %d %q", i, st, why)
		}
		clock.advance(20 * time.Second)
	}
	c, br = dialProxy(t, addr)
	if st, why, _ := explicitGet(t, c, br, target); st != 403 || why != ReasonCapRate {
		t.Fatalf("third request: %d %q, want 403 %q", st, why, ReasonCapRate)
	}
	refusedEvent(t, evs, 3, ReasonCapRate)
	// A redirected connection is a request too.
	tc, _ := transparentConn(t, p, e.rawUpstream)
	expectReset(t, tc)
	if got := waitEvents(t, evs.all, 4); len(got) < 4 || countRefused(got, ReasonCapRate) != 2 {
		t.Fatalf("want 2 events refused with %q after the redirected connection: %+v", ReasonCapRate, got)
	}
	if u := p.Usage("sb-r"); u.Requests != 2 {
		t.Errorf("usage %+v, want 2 requests in the last minute", u)
	}
	// 61 s after the first request, one slot is free again.
	clock.advance(21 * time.Second)
	c, br = dialProxy(t, addr)
	if st, why, _ := explicitGet(t, c, br, target); st != 200 {
		t.Fatalf("a minute later: %d %q", st, why)
	}
	e.checkNoViolations(t)
}

// TestCapBytes checks the lifetime byte cap (threat-model.md #21): a response
// that crosses the cap is cut mid-stream (the client never gets a complete
// body, and exactly MaxBytes are charged) and recorded as "cap: bytes";
// every later attempt is refused with the same reason. Tunnels and raw
// connections are cut the same way, with a reset.
func TestCapBytes(t *testing.T) {
	e := newEgressEnv(t)
	pol, _ := ParsePolicy("allow", []string{"allowed.test", "203.0.113.0/24"})
	const max = 100 << 10
	port := strconv.Itoa(int(e.port))

	t.Run("http", func(t *testing.T) {
		p, evs := e.newProxy(t, Client{ID: "sb-b1", Policy: pol, Limits: Limits{MaxBytes: max}}, ProxyConfig{})
		addr := serveExplicit(t, p)
		c, br := dialProxy(t, addr)
		fmt.Fprintf(c, "GET http://allowed.test:%s/big HTTP/1.1\r\nHost: allowed.test\r\n\r\n", port)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		if err == nil || n >= bigSize {
			t.Fatalf("read %d bytes, err %v: want a cut body", n, err)
		}
		ev := lastEvent(t, evs, 1)
		if ev.Verdict != VerdictRefused || ev.Reason != ReasonCapBytes || ev.BytesUp+ev.BytesDown != max {
			t.Fatalf("event %+v, want refused %q with %d bytes", ev, ReasonCapBytes, max)
		}
		if u := p.Usage("sb-b1"); u.Bytes != max {
			t.Fatalf("usage %+v, want %d bytes", u, max)
		}
		c2, br2 := dialProxy(t, addr)
		if st, why, _ := explicitGet(t, c2, br2, "http://allowed.test:"+port+"/after"); st != 403 || why != ReasonCapBytes {
			t.Fatalf("after the cap: %d %q", st, why)
		}
	})

	t.Run("tunnel", func(t *testing.T) {
		p, evs := e.newProxy(t, Client{ID: "sb-b2", Policy: pol, Limits: Limits{MaxBytes: max}}, ProxyConfig{})
		addr := serveExplicit(t, p)
		c, br := dialProxy(t, addr)
		fmt.Fprintf(c, "CONNECT allowed.test:%s HTTP/1.1\r\nHost: allowed.test:%s\r\n\r\n", port, port)
		resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("CONNECT: %v %v", resp, err)
		}
		fmt.Fprintf(c, "GET /big HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
		n, err := io.Copy(io.Discard, br)
		if err == nil || n >= bigSize {
			t.Fatalf("read %d bytes, err %v: want a reset", n, err)
		}
		ev := lastEvent(t, evs, 1)
		if ev.Reason != ReasonCapBytes || ev.Method != "CONNECT" || ev.BytesUp+ev.BytesDown != max {
			t.Fatalf("event %+v", ev)
		}
	})

	t.Run("raw", func(t *testing.T) {
		p, evs := e.newProxy(t, Client{ID: "sb-b3", Policy: pol, Limits: Limits{MaxBytes: 1000}}, ProxyConfig{})
		c, done := transparentConn(t, p, e.rawUpstream)
		// One write, complete before the cut: the echo brings the total
		// past 1000 bytes on the way down. (A write racing the reset
		// could consume the ECONNRESET the read must see.)
		if _, err := c.Write(make([]byte, 600)); err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, c)
		if !errors.Is(err, syscall.ECONNRESET) || n >= 600+int64(len(rawGreeting)) {
			t.Fatalf("read %d bytes, err %v: want a stream cut with a reset", n, err)
		}
		<-done
		ev := lastEvent(t, evs, 1)
		if ev.Reason != ReasonCapBytes || ev.Mode != EventRaw || ev.BytesUp+ev.BytesDown != 1000 {
			t.Fatalf("event %+v", ev)
		}
	})
	e.checkNoViolations(t)
}

// TestUsageAndForget checks Usage's accounting and that Forget drops a
// sandbox's counters.
func TestUsageAndForget(t *testing.T) {
	p := NewProxy(ProxyConfig{Client: func(netip.Addr) (Client, bool) { return Client{}, false }})
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	p.now = clock.now
	lim := Limits{}
	for i := 0; i < 3; i++ {
		if why := p.caps.admit("sb", lim, clock.now(), true); why != "" {
			t.Fatal(why)
		}
	}
	slot := p.caps.acquireConn("sb", lim)
	m := p.caps.meter("sb", lim)
	m.take(1234)
	if u := p.Usage("sb"); u != (Usage{Conns: 1, Bytes: 1234, Requests: 3}) {
		t.Fatalf("usage %+v", u)
	}
	slot.release()
	slot.release() // idempotent
	clock.advance(time.Minute)
	if u := p.Usage("sb"); u != (Usage{Conns: 0, Bytes: 1234, Requests: 0}) {
		t.Fatalf("usage a minute later %+v", u)
	}
	p.Forget("sb")
	if u := p.Usage("sb"); u != (Usage{}) {
		t.Fatalf("usage after Forget %+v", u)
	}
}

// TestLimitsDefaults checks that zero and negative limits mean the
// documented defaults.
func TestLimitsDefaults(t *testing.T) {
	want := Limits{MaxConns: DefaultMaxConns, MaxBytes: DefaultMaxBytes, RequestsPerMinute: DefaultRequestsPerMinute}
	for _, l := range []Limits{{}, {MaxConns: -1, MaxBytes: -1, RequestsPerMinute: -1}} {
		if got := l.withDefaults(); got != want {
			t.Errorf("%+v.withDefaults() = %+v, want %+v", l, got, want)
		}
	}
	if DefaultMaxBytes != 1<<30 || DefaultMaxConns != 64 || DefaultRequestsPerMinute != 600 {
		t.Errorf("defaults changed")
	}
}

// TestRateWindow checks the sliding window: counts drop out exactly 60 s
// after they were made.
func TestRateWindow(t *testing.T) {
	var w rateWindow
	base := int64(1_800_000_000)
	for i := int64(0); i < 120; i++ {
		w.add(base + i)
	}
	if n := w.count(base + 119); n != 60 {
		t.Fatalf("count %d, want 60", n)
	}
	if n := w.count(base + 150); n != 29 {
		t.Fatalf("count %d, want 29", n)
	}
	if n := w.count(base + 500); n != 0 {
		t.Fatalf("count %d, want 0", n)
	}
}
