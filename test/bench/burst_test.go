package bench

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	corral "github.com/corralhq/corral/sdk/go"
	"github.com/corralhq/corral/test/bench/results"
)

// probeInterval is the pause between two probe requests.
const probeInterval = 20 * time.Millisecond

// BenchmarkBurst creates CORRAL_BENCH_BURST (default 50) sandboxes at
// once, then kills them all at once, and reports each create's and each
// kill's latency (p50, p95) and the throughput, while a probe calls the
// control plane's GET /healthz and GET /v1/sandboxes in turn (one request
// every 20 ms) and reports their p50 and p99: whether the control plane
// stays responsive under a burst. It runs once per process whatever b.N.
func BenchmarkBurst(b *testing.B) {
	c := client(b)
	if r := store.burst; r != nil {
		reportBurst(b, r)
		return
	}
	b.StopTimer()
	ctx := context.Background()
	n := burstN
	pr := startProbe(c)
	creates := make([]time.Duration, n)
	sbs := make([]*corral.Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.Now()
			sbs[i], errs[i] = c.Create(ctx, corral.CreateOptions{Timeout: 10 * time.Minute})
			creates[i] = time.Since(t)
		}()
	}
	wg.Wait()
	createWall := time.Since(t0)
	kills := make([]time.Duration, 0, n)
	var mu sync.Mutex
	var killErr error
	t0 = time.Now()
	for _, sb := range sbs {
		if sb == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.Now()
			err := sb.Kill(context.WithoutCancel(ctx))
			d := time.Since(t)
			mu.Lock()
			defer mu.Unlock()
			kills = append(kills, d)
			if err != nil && killErr == nil {
				killErr = err
			}
		}()
	}
	wg.Wait()
	killWall := time.Since(t0)
	health, list, perr := pr.stop()
	for _, err := range errs {
		if err != nil {
			b.Fatalf("create in the burst: %v", err)
		}
	}
	if killErr != nil {
		b.Fatalf("kill in the burst: %v", killErr)
	}
	cs, ks := slices.Sorted(slices.Values(creates)), slices.Sorted(slices.Values(kills))
	r := &results.Burst{
		Sandboxes: n,
		CreateP50: ms(percentile(cs, 50)), CreateP95: ms(percentile(cs, 95)), CreateWallMS: ms(createWall),
		CreatesPerSec: float64(n) / createWall.Seconds(),
		KillP50:       ms(percentile(ks, 50)), KillP95: ms(percentile(ks, 95)), KillWallMS: ms(killWall),
		HealthzN: len(health), HealthzP50: ms(percentile(health, 50)), HealthzP99: ms(percentile(health, 99)), HealthzMax: ms(percentile(health, 100)),
		ListN: len(list), ListP50: ms(percentile(list, 50)), ListP99: ms(percentile(list, 99)), ListMax: ms(percentile(list, 100)),
		ProbeErrors: perr, ProbeIntervalM: ms(probeInterval),
	}
	store.Lock()
	store.burst = r
	store.Unlock()
	reportBurst(b, r)
}

func reportBurst(b *testing.B, r *results.Burst) {
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(r.CreateP50, "create-p50-ms")
	b.ReportMetric(r.CreateP95, "create-p95-ms")
	b.ReportMetric(r.CreatesPerSec, "creates/s")
	b.ReportMetric(r.KillP50, "kill-p50-ms")
	b.ReportMetric(r.KillP95, "kill-p95-ms")
	b.ReportMetric(r.HealthzP99, "healthz-p99-ms")
	b.ReportMetric(r.ListP99, "list-p99-ms")
}

// probe calls GET /healthz and GET /v1/sandboxes in turn until stopped.
type probe struct {
	quit         chan struct{}
	done         chan struct{}
	health, list []time.Duration
	errs         int
}

func startProbe(c *corral.Client) *probe {
	p := &probe{quit: make(chan struct{}), done: make(chan struct{})}
	hc := &http.Client{Timeout: time.Minute}
	go func() {
		defer close(p.done)
		ctx := context.Background()
		for i := 0; ; i++ {
			select {
			case <-p.quit:
				return
			case <-time.After(probeInterval):
			}
			t := time.Now()
			if i%2 == 0 {
				resp, err := hc.Get(env.url + "/healthz")
				d := time.Since(t)
				if err != nil || resp.StatusCode != http.StatusOK {
					p.errs++
				} else {
					p.health = append(p.health, d)
				}
				if err == nil {
					resp.Body.Close()
				}
			} else {
				_, err := c.List(ctx, corral.ListOptions{})
				d := time.Since(t)
				if err != nil {
					p.errs++
				} else {
					p.list = append(p.list, d)
				}
			}
		}
	}()
	return p
}

// stop ends the probe and returns its sorted latencies and error count.
func (p *probe) stop() (health, list []time.Duration, errs int) {
	close(p.quit)
	<-p.done
	slices.Sort(p.health)
	slices.Sort(p.list)
	return p.health, p.list, p.errs
}
