package supervisor

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// BenchmarkRunOverhead times one short command (/bin/true) run under the
// supervisor (Client.Run: dial, request, start, reap, reply) and, in the
// same iterations, started directly with os/exec: the supervisor's own
// share of every sandbox create's runtime phase. It reports p50 of both.
func BenchmarkRunOverhead(b *testing.B) {
	dir := b.TempDir()
	c := &Client{Socket: filepath.Join(dir, "sup", "supervisor.sock"), Binary: os.Args[0]}
	b.Cleanup(func() { _ = c.CloseWait(time.Minute) })
	out, err := os.Create(filepath.Join(dir, "out"))
	if err != nil {
		b.Fatal(err)
	}
	defer out.Close()
	if _, err := c.Run(context.Background(), []string{"/bin/true"}, out); err != nil {
		b.Fatal(err)
	}
	var sup, direct []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := c.Run(context.Background(), []string{"/bin/true"}, out); err != nil {
			b.Fatal(err)
		}
		sup = append(sup, time.Since(t0))
		t0 = time.Now()
		cmd := exec.Command("/bin/true")
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Run(); err != nil {
			b.Fatal(err)
		}
		direct = append(direct, time.Since(t0))
	}
	b.StopTimer()
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(p50ms(sup), "p50-ms-supervisor")
	b.ReportMetric(p50ms(direct), "p50-ms-direct")
}

func p50ms(d []time.Duration) float64 {
	s := slices.Sorted(slices.Values(d))
	return float64(s[len(s)/2]) / float64(time.Millisecond)
}
