package bench

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	corral "github.com/corralhq/corral/sdk/go"
)

// BenchmarkPoolClaimAPI: warm-pool creates at 45 per second through the
// API with the local runc driver, the baseline of the kube driver's
// BenchmarkClaimAPI (internal/runtime/kube; run both in one `go test`,
// docs/kubernetes.md "Benchmarks"): each create is timed from the SDK's
// call to the answer (the pooled sandbox handed out, its record and
// audit event made) and killed after. The pool holds one idle sandbox
// per create (up to the pool limit, 100): runc sandboxes cannot be
// refilled at 45 per second on this host, so this measures the claim
// itself. Reports p50, p99 and the share served by the pool.
// Run: go test -run '^$' -bench PoolClaimAPI -benchtime 40x ./test/bench/
func BenchmarkPoolClaimAPI(b *testing.B) {
	c := client(b)
	ctx := context.Background()
	size := min(b.N, 100)
	if _, err := c.SetPool(ctx, "base", size, size, 0); err != nil {
		b.Fatal(err)
	}
	// The pool is removed only once it is full again: with no refill in
	// flight, removing it stops every sandbox it started (a refill still
	// starting one when the server closes would leave it half made).
	full := func() *corral.Pool {
		deadline := time.Now().Add(5 * time.Minute)
		for {
			ps, err := c.Pools(ctx)
			if err == nil && len(ps) == 1 && ps[0].Idle >= size {
				return &ps[0]
			}
			if time.Now().After(deadline) {
				b.Fatalf("the pool did not fill within 5 min: %+v, %v", ps, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	b.Cleanup(func() {
		full()
		_, _ = c.SetPool(context.Background(), "base", 0, 0, 0)
	})
	hits0 := full().Hits
	lat := make([]time.Duration, b.N)
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / 45)
	defer tick.Stop()
	b.ResetTimer()
	for i := range b.N {
		<-tick.C
		wg.Go(func() {
			t0 := time.Now()
			sb, err := c.Create(ctx, corral.CreateOptions{})
			if err != nil {
				b.Error(err)
				return
			}
			lat[i] = time.Since(t0)
			if err := sb.Kill(ctx); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	if ps, err := c.Pools(ctx); err == nil && len(ps) == 1 {
		b.ReportMetric(float64(ps[0].Hits-hits0)/float64(b.N)*100, "%-from-pool")
	}
}
