package egress

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Default per-sandbox caps of the [Proxy], used for every zero (or
// negative) field of [Limits]. They defend against threat-model.md #21 (a
// sandbox flooding the network or the shared proxy): generous for an agent
// that installs packages and calls APIs, far below what would starve the
// other sandboxes of the host.
const (
	// DefaultMaxConns is the most connections a sandbox may have open
	// through the proxy at once: explicit-mode client connections
	// (including CONNECT tunnels) plus redirected (transparent)
	// connections.
	DefaultMaxConns = 64
	// DefaultMaxBytes is the most bytes a sandbox may move through the
	// proxy over its life, upstream and downstream together (1 GiB).
	DefaultMaxBytes int64 = 1 << 30
	// DefaultRequestsPerMinute is the most requests a sandbox may make in
	// any minute: HTTP requests, CONNECTs and redirected connections.
	DefaultRequestsPerMinute = 600
)

// Cap refusal reasons, as they appear in [Event.Reason].
const (
	// ReasonCapConns refuses a connection over [Limits.MaxConns].
	ReasonCapConns = "cap: connections"
	// ReasonCapBytes refuses an attempt (or cuts a stream) over
	// [Limits.MaxBytes].
	ReasonCapBytes = "cap: bytes"
	// ReasonCapRate refuses a request over [Limits.RequestsPerMinute].
	ReasonCapRate = "cap: requests per minute"
)

// Limits are the per-sandbox caps the proxy enforces. A zero (or negative)
// field means the matching default ([DefaultMaxConns], [DefaultMaxBytes],
// [DefaultRequestsPerMinute]); there is no "unlimited".
type Limits struct {
	// MaxConns is the most concurrent connections through the proxy.
	MaxConns int
	// MaxBytes is the most bytes, up and down together, over the
	// sandbox's life. When it is reached in the middle of a stream the
	// stream is cut.
	MaxBytes int64
	// RequestsPerMinute is the most requests (HTTP requests, CONNECTs,
	// redirected connections) in any sliding minute.
	RequestsPerMinute int
}

// withDefaults fills zero fields with the defaults.
func (l Limits) withDefaults() Limits {
	if l.MaxConns <= 0 {
		l.MaxConns = DefaultMaxConns
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.RequestsPerMinute <= 0 {
		l.RequestsPerMinute = DefaultRequestsPerMinute
	}
	return l
}

// Usage is what a sandbox has consumed of its [Limits], as reported by
// [Proxy.Usage].
type Usage struct {
	// Conns is the number of connections open now.
	Conns int
	// Bytes is the total moved up and down over the sandbox's life.
	Bytes int64
	// Requests is the number of requests admitted in the last minute.
	Requests int
}

// errByteCap cuts a stream that reached [Limits.MaxBytes].
var errByteCap = errors.New("egress: " + ReasonCapBytes)

// caps tracks per-sandbox usage. Entries exist only for sandbox ids the
// caller's [ProxyConfig.Client] returned, and are dropped by
// [Proxy.Forget].
type caps struct {
	// mu guards m and the conns and win fields of every entry.
	mu sync.Mutex
	m  map[string]*usage
}

// usage is one sandbox's counters.
type usage struct {
	conns int        // guarded by caps.mu
	win   rateWindow // guarded by caps.mu
	bytes atomic.Int64
}

// rateWindow counts requests per second over the last 60 seconds: a
// sliding window of one-second slots, so the count is exact to the second
// and memory is constant whatever the limit.
type rateWindow struct {
	sec [60]int64
	n   [60]int32
}

func (w *rateWindow) count(now int64) int {
	total := 0
	for i := range w.sec {
		if now-w.sec[i] < 60 && now >= w.sec[i] {
			total += int(w.n[i])
		}
	}
	return total
}

func (w *rateWindow) add(now int64) {
	i := int(((now % 60) + 60) % 60)
	if w.sec[i] != now {
		w.sec[i], w.n[i] = now, 0
	}
	w.n[i]++
}

func (c *caps) get(id string) *usage {
	if c.m == nil {
		c.m = map[string]*usage{}
	}
	u := c.m[id]
	if u == nil {
		u = &usage{}
		c.m[id] = u
	}
	return u
}

// connSlot is one admitted connection; release gives it back once.
type connSlot struct {
	c    *caps
	u    *usage // nil when nothing is held
	over bool   // the connection was over the cap when it was opened
	once sync.Once
}

func (s *connSlot) release() {
	if s == nil || s.u == nil {
		return
	}
	s.once.Do(func() {
		s.c.mu.Lock()
		s.u.conns--
		s.c.mu.Unlock()
	})
}

// acquireConn takes a connection slot for id. Over the cap it returns a
// slot marked over that holds nothing.
func (c *caps) acquireConn(id string, lim Limits) *connSlot {
	lim = lim.withDefaults()
	c.mu.Lock()
	defer c.mu.Unlock()
	u := c.get(id)
	if u.conns >= lim.MaxConns {
		return &connSlot{c: c, over: true}
	}
	u.conns++
	return &connSlot{c: c, u: u}
}

// admit checks the byte cap and, when count is set, the request rate for
// one attempt of id at now, and counts the attempt if it is admitted. It
// returns "" or the refusal reason. Attempts refused by a cap are not
// counted, so a sandbox that backs off is admitted again within a minute.
func (c *caps) admit(id string, lim Limits, now time.Time, count bool) string {
	lim = lim.withDefaults()
	c.mu.Lock()
	defer c.mu.Unlock()
	u := c.get(id)
	if u.bytes.Load() >= lim.MaxBytes {
		return ReasonCapBytes
	}
	if count {
		s := now.Unix()
		if u.win.count(s) >= lim.RequestsPerMinute {
			return ReasonCapRate
		}
		u.win.add(s)
	}
	return ""
}

// meter returns the byte meter for one attempt of id.
func (c *caps) meter(id string, lim Limits) *meter {
	lim = lim.withDefaults()
	c.mu.Lock()
	defer c.mu.Unlock()
	return &meter{total: &c.get(id).bytes, max: lim.MaxBytes}
}

// meter charges the bytes of one attempt to its sandbox's lifetime total
// and refuses every byte past the cap.
type meter struct {
	total *atomic.Int64
	max   int64
	cut   atomic.Bool // the cap was reached during this attempt
}

// take charges up to n bytes and returns how many fit under the cap.
func (m *meter) take(n int64) int64 {
	for {
		cur := m.total.Load()
		fit := min(n, m.max-cur)
		if fit <= 0 {
			if n > 0 {
				m.cut.Store(true)
			}
			return 0
		}
		if m.total.CompareAndSwap(cur, cur+fit) {
			if fit < n {
				m.cut.Store(true)
			}
			return fit
		}
	}
}

// remaining is how many bytes may still move.
func (m *meter) remaining() int64 { return m.max - m.total.Load() }

// Forget drops the counters of sandbox id (call it when the sandbox is
// deleted). Connections still open keep their slot accounting private; a
// new sandbox reusing the id starts from zero.
func (p *Proxy) Forget(id string) {
	p.caps.mu.Lock()
	defer p.caps.mu.Unlock()
	delete(p.caps.m, id)
}

// Usage reports what sandbox id has consumed: open connections, lifetime
// bytes and requests admitted in the last minute. An unknown id reports
// zeros.
func (p *Proxy) Usage(id string) Usage {
	p.caps.mu.Lock()
	defer p.caps.mu.Unlock()
	u := p.caps.m[id]
	if u == nil {
		return Usage{}
	}
	return Usage{Conns: u.conns, Bytes: u.bytes.Load(), Requests: u.win.count(p.now().Unix())}
}

// countConn counts bytes written (up) and read (down) on an upstream
// connection and charges them to the attempt's [meter], if any: past the
// sandbox's byte cap, reads and writes fail with errByteCap and the
// stream is cut.
type countConn struct {
	net.Conn
	up, down *atomic.Int64
	m        *meter
}

// Read reads from upstream, never past the byte cap.
func (c *countConn) Read(b []byte) (int, error) {
	if c.m != nil {
		rem := c.m.remaining()
		if rem <= 0 {
			c.m.cut.Store(true)
			return 0, errByteCap
		}
		if int64(len(b)) > rem {
			b = b[:rem]
		}
	}
	n, err := c.Conn.Read(b)
	if c.m != nil && n > 0 {
		if fit := c.m.take(int64(n)); fit < int64(n) {
			// Bytes past the cap are dropped, never delivered.
			c.down.Add(fit)
			return int(fit), errByteCap
		}
	}
	c.down.Add(int64(n))
	return n, err
}

// Write counts before writing: the upstream may answer, and the proxy read
// that answer, before this goroutine runs again after the write.
func (c *countConn) Write(b []byte) (int, error) {
	want := int64(len(b))
	allowed := want
	if c.m != nil {
		allowed = c.m.take(want)
	}
	c.up.Add(allowed)
	n, err := c.Conn.Write(b[:allowed])
	if int64(n) < allowed {
		c.up.Add(int64(n) - allowed)
		if c.m != nil {
			c.m.total.Add(int64(n) - allowed)
		}
	}
	if err == nil && allowed < want {
		err = errByteCap
	}
	return n, err
}

// CloseWrite half-closes the upstream connection.
func (c *countConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("egress: no half-close")
}
