package egress

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"
)

// benchEnv is an upstream HTTP server in a test network namespace (a
// documentation address routed to a veth, so the proxy's policy lets it
// through) and an explicit proxy on 127.0.0.1 whose resolver names it.
type benchEnv struct {
	upstream string // "203.0.113.x:80"
	proxy    string // "127.0.0.1:port"
}

const benchBlob = 64 << 20

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	n := newTestNetns(b)
	ln := n.listen(b, n.upstream.String()+":80")
	blob := strings.Repeat("x", 1<<20)
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/blob", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(benchBlob))
		for i := 0; i < benchBlob/len(blob); i++ {
			if _, err := io.WriteString(w, blob); err != nil {
				return
			}
		}
	})
	us := &http.Server{Handler: mux}
	go us.Serve(ln)
	b.Cleanup(func() { us.Close() })

	pol, err := ParsePolicy("allow", []string{"bench.test"})
	if err != nil {
		b.Fatal(err)
	}
	p := NewProxy(ProxyConfig{
		Client: func(netip.Addr) (Client, bool) {
			return Client{ID: "bench", Policy: pol, Limits: Limits{MaxConns: 1 << 20, MaxBytes: 1 << 62, RequestsPerMinute: 1 << 30}}, true
		},
		Resolver: &fakeResolver{names: map[string][][]netip.Addr{"bench.test": {{n.upstream}}}, calls: map[string]int{}},
	})
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ps := p.Server("")
	go ps.Serve(pl)
	b.Cleanup(func() { ps.Close() })
	return &benchEnv{upstream: n.upstream.String() + ":80", proxy: pl.Addr().String()}
}

// client returns an HTTP client that opens a new connection per request
// (as a sandboxed curl does), directly or through the proxy.
func (e *benchEnv) client(viaProxy bool) *http.Client {
	tr := &http.Transport{DisableKeepAlives: true}
	if viaProxy {
		tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: e.proxy})
	}
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

func get(b *testing.B, c *http.Client, url string) int64 {
	resp, err := c.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		b.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return n
}

// BenchmarkProxyRequest measures one small HTTP request on a new
// connection, directly and through the explicit proxy (which dials a new
// upstream connection per request after its policy checks), alternating
// in the same run; it reports both latencies and their ratio.
func BenchmarkProxyRequest(b *testing.B) {
	e := newBenchEnv(b)
	direct, proxied := e.client(false), e.client(true)
	small := func(host string) string { return "http://" + host + "/small" }
	get(b, direct, small(e.upstream))
	get(b, proxied, small("bench.test"))
	var dt, pt time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		get(b, direct, small(e.upstream))
		t1 := time.Now()
		get(b, proxied, small("bench.test"))
		dt += t1.Sub(t0)
		pt += time.Since(t1)
	}
	b.ReportMetric(float64(dt.Microseconds())/float64(b.N), "direct-us/req")
	b.ReportMetric(float64(pt.Microseconds())/float64(b.N), "proxied-us/req")
	b.ReportMetric(float64(pt)/float64(dt), "ratio")
}

// BenchmarkProxyThroughput downloads 64 MiB directly and through a CONNECT
// tunnel of the proxy, alternating, and reports both rates and their ratio.
func BenchmarkProxyThroughput(b *testing.B) {
	e := newBenchEnv(b)
	direct := e.client(false)
	var dt, pt time.Duration
	b.SetBytes(benchBlob)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		get(b, direct, "http://"+e.upstream+"/blob")
		t1 := time.Now()
		tunnelGet(b, e.proxy, "bench.test:80", "/blob")
		dt += t1.Sub(t0)
		pt += time.Since(t1)
	}
	mb := float64(benchBlob) * float64(b.N) / (1 << 20)
	b.ReportMetric(mb/dt.Seconds(), "direct-MiB/s")
	b.ReportMetric(mb/pt.Seconds(), "tunnel-MiB/s")
	b.ReportMetric(float64(dt)/float64(pt), "ratio")
}

// tunnelGet fetches path from hostport through a CONNECT tunnel.
func tunnelGet(b *testing.B, proxy, hostport, path string) {
	d := net.Dialer{}
	c, err := d.DialContext(context.Background(), "tcp", proxy)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", hostport, hostport)
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return c, nil }, DisableKeepAlives: true}
	// Read the CONNECT reply before handing the conn to the transport.
	buf := make([]byte, 0, 256)
	one := make([]byte, 1)
	for !strings.HasSuffix(string(buf), "\r\n\r\n") {
		if _, err := c.Read(one); err != nil {
			b.Fatal(err)
		}
		buf = append(buf, one[0])
	}
	if !strings.HasPrefix(string(buf), "HTTP/1.1 200") {
		b.Fatalf("CONNECT: %q", buf)
	}
	get(b, &http.Client{Transport: tr}, "http://"+hostport+path)
}
