package kube

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
)

// countingRT counts the requests a client sends.
type countingRT struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (c countingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// countedDriver is newDriver with a client whose requests are counted.
func countedDriver(b *testing.B, c *cluster, ns string, addr func(*corev1.Pod) string, n *atomic.Int64, mod func(*Options)) *Driver {
	rc := *c.config
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return countingRT{next: rt, n: n} }
	client, err := kubernetes.NewForConfig(&rc)
	if err != nil {
		b.Fatal(err)
	}
	o := Options{Client: client, Namespace: ns, DefaultImage: "registry.example/corral/base:bench", Replica: "bench", AgentAddr: addr}
	if mod != nil {
		mod(&o)
	}
	d, err := New(context.Background(), o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	return d
}

// BenchmarkClaim: warm-pool claims at 45 per second, each from the call
// to a sandbox handed out (the claim patch, the cache seeing it, the
// agent's init over TCP), as a create's driver step. Reports p50 and p99.
// Run: go test -run '^$' -bench Claim -benchtime 300x ./internal/runtime/kube/
func BenchmarkClaim(b *testing.B) {
	c := testCluster(b)
	ns := c.namespace(b)
	ag := startAgents(b, c, ns, "")
	var reqs atomic.Int64
	cfg := testConfig("x")
	pool := Pool{Template: cfg.Template, Runtime: cfg.Runtime, Resources: cfg.Resources, DefaultUser: cfg.DefaultUser, Size: 60}
	d := countedDriver(b, c, ns, ag.addr, &reqs, func(o *Options) { o.Pools = []Pool{pool} })
	waitPool(b, d, pool.Size)

	const rate = 45
	lat := make([]time.Duration, b.N)
	var fromPool atomic.Int64
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	b.ResetTimer()
	for i := range b.N {
		<-tick.C
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := testConfig(fmt.Sprintf("bench%06d", i))
			t0 := time.Now()
			if _, err := d.Start(context.Background(), cfg); err != nil {
				b.Error(err)
				return
			}
			lat[i] = time.Since(t0)
			if p := d.pod(cfg.ID); p != nil && len(p.Name) > 12 && p.Name[:12] == "corral-pool-" {
				fromPool.Add(1)
			}
			go d.Stop(context.Background(), cfg.ID, 0)
		}()
	}
	wg.Wait()
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(fromPool.Load())/float64(b.N)*100, "%-from-pool")
}

// BenchmarkTrack1000: one control plane (driver) keeping a warm pool of
// 1 000 ready Pods and watching them for 30 s as the manager's death
// check does (Alive of each every second). Reports the driver's heap
// (after GC, over the baseline before it started), its API requests per
// second while filling the pool and while tracking it.
// Run: go test -run '^$' -bench Track1000 -benchtime 1x ./internal/runtime/kube/
func BenchmarkTrack1000(b *testing.B) {
	c := testCluster(b)
	for range b.N {
		ns := c.namespace(b)
		var reqs atomic.Int64
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		cfg := testConfig("x")
		pool := Pool{Template: cfg.Template, Runtime: cfg.Runtime, Resources: cfg.Resources, DefaultUser: cfg.DefaultUser, Size: 1000}
		t0 := time.Now()
		d := countedDriver(b, c, ns, func(*corev1.Pod) string { return "127.0.0.1:1" }, &reqs, func(o *Options) { o.Pools = []Pool{pool} })
		waitPool(b, d, pool.Size)
		fill := time.Since(t0)
		fillReqs := reqs.Load()

		// Tracking: nothing changes; Alive of every Pod once a second.
		ids := make([]string, 0, pool.Size)
		for _, p := range d.idlePods(pool.spec().key()) {
			ids = append(ids, p.Name)
		}
		r0 := reqs.Load()
		const window = 30 * time.Second
		end := time.Now().Add(window)
		for time.Now().Before(end) {
			for _, id := range ids {
				d.Alive(id)
			}
			_, _ = d.List(context.Background())
			time.Sleep(time.Second)
		}
		trackQPS := float64(reqs.Load()-r0) / window.Seconds()
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		b.ReportMetric(fill.Seconds(), "fill-s")
		b.ReportMetric(float64(fillReqs)/fill.Seconds(), "fill-qps")
		b.ReportMetric(trackQPS, "track-qps")
		b.ReportMetric(float64(int64(after.HeapInuse)-int64(before.HeapInuse))/(1<<20), "heap-MiB")
	}
}
