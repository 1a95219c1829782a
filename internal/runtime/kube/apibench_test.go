package kube

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/store/pgtest"
)

// countingOptions gives the driver an API client whose requests n
// counts.
func countingOptions(b testing.TB, c *cluster, n *atomic.Int64) func(*Options) {
	rc := *c.config
	rc.QPS, rc.Burst = 100, 200 // corral serve's defaults (--kube-qps, --kube-burst)
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return countingRT{next: rt, n: n} }
	client, err := kubernetes.NewForConfig(&rc)
	if err != nil {
		b.Fatal(err)
	}
	return func(o *Options) { o.Client = client }
}

// claimsAtRate sends n creates through the API of url at rate per
// second, each timed from the request to the answer (the sandbox handed
// out, its agent initialised), and kills each sandbox after it is
// made. It returns the sorted latencies.
func claimsAtRate(b *testing.B, r *replica, key string, n, rate int) (lat []time.Duration, fromPool int) {
	lat = make([]time.Duration, n)
	var pooled atomic.Int64
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range n {
		<-tick.C
		wg.Go(func() {
			var sb sandboxJSON
			t0 := time.Now()
			if _, err := r.call(key, http.MethodPost, "/v1/sandboxes", map[string]any{}, &sb); err != nil {
				b.Error(err)
				return
			}
			lat[i] = time.Since(t0)
			if p := r.kd.pod(sb.ID); p != nil && strings.HasPrefix(p.Name, "corral-pool-") {
				pooled.Add(1)
			}
			if _, err := r.call(key, http.MethodDelete, "/v1/sandboxes/"+sb.ID, nil, nil); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
	slices.Sort(lat)
	return lat, int(pooled.Load())
}

func reportLatency(b *testing.B, lat []time.Duration) {
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkClaimAPI: warm-pool claims at 45 per second through the full
// control plane's HTTP API (POST /v1/sandboxes to the answer: admission,
// the record, the claim patch, the cache seeing it, the agent's init over
// TCP, the audit event), on a SQLite store and on a PostgreSQL one,
// with a pool of 60 (refilled while claims drain it: on a busy host some
// claims find it empty and wait for a cold Pod) and with a pool of one
// Pod per claim (every claim a warm one: the claim path alone). Each
// sandbox is killed through the API once made. Reports p50 and p99, the
// share of claims served by the pool and the median of each phase the
// Manager records. The local
// runc driver's baseline is BenchmarkPoolClaimAPI in test/bench, run in
// the same `go test` (docs/kubernetes.md, "Benchmarks").
// Run: go test -run '^$' -bench ClaimAPI -benchtime 300x ./internal/runtime/kube/
func BenchmarkClaimAPI(b *testing.B) {
	for _, bc := range []struct {
		backend  string
		covering bool
	}{{"sqlite", false}, {"postgres", false}, {"sqlite", true}, {"postgres", true}} {
		backend := bc.backend
		name := "store=" + backend + "/pool=60"
		if bc.covering {
			name = "store=" + backend + "/pool=N"
		}
		b.Run(name, func(b *testing.B) {
			c := testCluster(b)
			ns := c.namespace(b)
			ag := startAgents(b, c, ns, "")
			url := filepath.Join(b.TempDir(), "corral.db")
			if backend == "postgres" {
				url = pgtest.Shared(b).NewDatabase(b)
			}
			pool := testPool(60)
			if bc.covering {
				pool.Size = max(60, b.N)
			}
			r := startReplica(b, c, ns, ag, url, "bench", []Pool{pool}, nil)
			key := store.NewKeyValue()
			if err := r.st.AddAPIKey(context.Background(), "admin", key, store.DefaultTeam, store.RoleAdmin); err != nil {
				b.Fatal(err)
			}
			waitPool(b, r.kd, pool.Size)
			b.ResetTimer()
			lat, pooled := claimsAtRate(b, r, key, b.N, 45)
			b.StopTimer()
			reportLatency(b, lat)
			b.ReportMetric(float64(pooled)/float64(b.N)*100, "%-from-pool")
			reportPhases(b, r)
		})
	}
}

// reportPhases reports the median of each create phase the Manager
// recorded (the sandbox.created events' phases_ms and create_ms), where
// a claim's time goes.
func reportPhases(b *testing.B, r *replica) {
	r.al.Sync()
	evs, err := r.st.ListEvents(context.Background(), store.EventFilter{Kind: "sandbox.created"})
	if err != nil {
		b.Fatal(err)
	}
	byPhase := map[string][]float64{}
	for _, ev := range evs {
		var d struct {
			CreateMS float64            `json:"create_ms"`
			Phases   map[string]float64 `json:"phases_ms"`
		}
		if json.Unmarshal(ev.Data, &d) != nil {
			continue
		}
		byPhase["create"] = append(byPhase["create"], d.CreateMS)
		for ph, ms := range d.Phases {
			byPhase[ph] = append(byPhase[ph], ms)
		}
	}
	for ph, v := range byPhase {
		slices.Sort(v)
		b.ReportMetric(v[len(v)/2], ph+"-p50-ms")
	}
}

// initResponder answers every agent's POST /init (204) on one port: the
// stand-in of 1 000 Pods' agents for the tracking benchmark, small
// enough not to weigh on the control plane's memory it measures.
func initResponder(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// rssBytes is this process's resident set (VmRSS).
func rssBytes() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func heapInuse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// BenchmarkTrack1000API: one full control plane (SQLite store, Manager,
// kube driver, HTTP API) with a warm pool of 1 000 ready Pods, first
// idle, then with 1 000 sandboxes claimed through the API and live in
// the Manager (its death check reads every one each second, its reaper
// lists them every 30 s) while the pool refills to 1 000 idle Pods
// again. Reports, over the memory before the control plane started, its
// heap (after GC) and the process's RSS in each phase, and the API
// server requests per second the control plane causes (a counting
// RoundTripper on the driver's client) while filling and while tracking
// (30 s windows, nothing changing). Agents: one /init responder.
// Run: go test -run '^$' -bench Track1000API -benchtime 1x ./internal/runtime/kube/
func BenchmarkTrack1000API(b *testing.B) {
	c := testCluster(b)
	const size = 1000
	const window = 30 * time.Second
	for range b.N {
		ns := c.namespace(b)
		addr := initResponder(b)
		var reqs atomic.Int64
		heap0, rss0 := heapInuse(), rssBytes()
		pool := testPool(size)
		counted := countingOptions(b, c, &reqs)
		t0 := time.Now()
		r := startReplicaWith(b, c, ns, nil, filepath.Join(b.TempDir(), "corral.db"), "bench", func(o *Options) {
			counted(o)
			o.Pools = []Pool{pool}
			o.AgentAddr = func(*corev1.Pod) string { return addr }
		}, nil)
		key := store.NewKeyValue()
		if err := r.st.AddAPIKey(context.Background(), "admin", key, store.DefaultTeam, store.RoleAdmin); err != nil {
			b.Fatal(err)
		}
		waitPool(b, r.kd, size)
		fill := time.Since(t0)
		b.ReportMetric(fill.Seconds(), "fill-s")
		b.ReportMetric(float64(reqs.Load())/fill.Seconds(), "fill-qps")

		track := func(phase string) {
			r0 := reqs.Load()
			time.Sleep(window)
			b.ReportMetric(float64(reqs.Load()-r0)/window.Seconds(), phase+"-qps")
			b.ReportMetric(float64(heapInuse()-heap0)/(1<<20), phase+"-heap-MiB")
			b.ReportMetric(float64(rssBytes()-rss0)/(1<<20), phase+"-rss-MiB")
		}
		track("idle")

		// 1 000 sandboxes through the API, 32 at a time.
		sem := make(chan struct{}, 32)
		var wg sync.WaitGroup
		var failed atomic.Int64
		t1 := time.Now()
		for range size {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				if _, err := r.call(key, http.MethodPost, "/v1/sandboxes", map[string]any{"timeout": 3600}, nil); err != nil {
					if failed.Add(1) == 1 {
						b.Error(err)
					}
				}
			})
		}
		wg.Wait()
		b.ReportMetric(time.Since(t1).Seconds(), "claim1000-s")
		if failed.Load() > 0 {
			b.Fatalf("%d creates failed", failed.Load())
		}
		waitPool(b, r.kd, size)
		track("live")
		n := 0
		for _, id := range mustList(b, r) {
			if r.m.Running(id) {
				n++
			}
		}
		if n != size {
			b.Fatalf("%d sandboxes live in the Manager, want %d", n, size)
		}
		r.close()
	}
}

func mustList(b *testing.B, r *replica) []string {
	recs, err := r.st.ListSandboxes(context.Background(), store.SandboxFilter{States: []string{store.StateRunning}})
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, len(recs))
	for i, rec := range recs {
		ids[i] = rec.ID
	}
	return ids
}
