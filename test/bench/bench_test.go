package bench

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/runtime/oci"
	corral "github.com/corralhq/corral/sdk/go"
)

// trueArgv runs the command as a program without a shell.
var trueArgv = corral.RunOptions{Args: []string{}}

// BenchmarkCreateFirstExec times SDK Create (base template, runc) until the
// first `true` run in the new sandbox returns.
func BenchmarkCreateFirstExec(b *testing.B) { benchCreateFirstExec(b, "runc") }

// BenchmarkGVisorCreateFirstExec is BenchmarkCreateFirstExec under gVisor
// (the runsc the driver picks: the pinned build when cached).
func BenchmarkGVisorCreateFirstExec(b *testing.B) {
	need(b)
	if _, err := oci.FindRunsc("", ""); err != nil {
		skip(b, "no runsc (gVisor): "+err.Error())
	}
	benchCreateFirstExec(b, "gvisor")
}

// BenchmarkCreateFirstExecNetwork is BenchmarkCreateFirstExec for a
// sandbox with an egress policy: it also gets a veth pair, addresses, its
// rule in the nftables table and its entry in the proxy's client table.
func BenchmarkCreateFirstExecNetwork(b *testing.B) {
	benchCreate(b, corral.CreateOptions{Network: "allow", Allow: []string{"pypi.org"}}, nil)
}

// BenchmarkCreateFirstExecSnapshot is BenchmarkCreateFirstExec for
// sandboxes started from a snapshot (a layer with a few files on top of
// the base template).
func BenchmarkCreateFirstExecSnapshot(b *testing.B) {
	c := client(b)
	ctx := context.Background()
	src, err := c.Create(ctx, corral.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Kill(context.Background())
	if _, err := src.Run(ctx, "mkdir -p /home/user/proj && seq 1000 > /home/user/proj/data.txt", corral.RunOptions{}); err != nil {
		b.Fatal(err)
	}
	sn, err := c.Snapshot(ctx, src.ID, "bench")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.DeleteSnapshot(context.Background(), sn.ID) })
	benchCreate(b, corral.CreateOptions{Snapshot: sn.ID}, nil)
}

// BenchmarkCreateFirstExecPooled is BenchmarkCreateFirstExec with a warm
// pool of the base template: each create takes a sandbox the pool started
// ahead of time (waiting, outside the timer, for the pool to refill).
func BenchmarkCreateFirstExecPooled(b *testing.B) {
	c := client(b)
	ctx := context.Background()
	if _, err := c.SetPool(ctx, "base", 2, 2, 0); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _, _ = c.SetPool(context.Background(), "base", 0, 0, 0) })
	waitIdle := func() {
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			ps, err := c.Pools(ctx)
			if err == nil && len(ps) == 1 && ps[0].Idle >= 1 {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		b.Fatal("the pool did not refill within a minute")
	}
	benchCreate(b, corral.CreateOptions{}, waitIdle)
	if ps, err := c.Pools(ctx); err == nil && len(ps) == 1 {
		b.ReportMetric(float64(ps[0].Hits), "pool-hits")
		b.ReportMetric(ps[0].RefillMSAvg, "refill-ms")
	}
}

// BenchmarkCreateFirstExecVolume is BenchmarkCreateFirstExec for
// sandboxes that mount a volume (one more bind mount).
func BenchmarkCreateFirstExecVolume(b *testing.B) {
	c := client(b)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		skip(b, "volumes need loop devices")
	}
	v, err := c.CreateVolume(context.Background(), fmt.Sprintf("bench-%d", time.Now().UnixNano()), 64)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.DeleteVolume(context.Background(), v.ID) })
	benchCreate(b, corral.CreateOptions{Volumes: []corral.VolumeMount{{Volume: v.ID, Path: "/data"}}}, nil)
}

// BenchmarkVolumeCreateDelete times making a 1 GiB volume (sparse image,
// mkfs.ext4, loop mount) and deleting it.
func BenchmarkVolumeCreateDelete(b *testing.B) {
	c := client(b)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		skip(b, "volumes need loop devices")
	}
	ctx := context.Background()
	s := newSamples(b)
	for i := 0; i < b.N; i++ {
		s.start()
		v, err := c.CreateVolume(ctx, fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), i), 1024)
		if err != nil {
			b.Fatal(err)
		}
		err = c.DeleteVolume(ctx, v.ID)
		s.stop()
		if err != nil {
			b.Fatal(err)
		}
	}
	s.report()
}

func benchCreateFirstExec(b *testing.B, rt string) {
	benchCreate(b, corral.CreateOptions{Runtime: rt}, nil)
}

// benchCreate times create → first `true`; before, when set, runs ahead
// of each iteration outside the measurement.
func benchCreate(b *testing.B, opts corral.CreateOptions, before func()) {
	c := client(b)
	ctx := context.Background()
	s := newSamples(b)
	// The two halves of each iteration: Create's call, and the first
	// command after it.
	call, first := newSamples(b), newSamples(b)
	// CreateFirstExec also times a second command in the same sandbox
	// (after the timed section): what the first one pays for being first.
	var second *samples
	if benchName(b) == "CreateFirstExec" {
		second = newSamples(b)
	}
	since := time.Now()
	ids := make(map[string]bool, b.N)
	for i := 0; i < b.N; i++ {
		if before != nil {
			before()
		}
		sb, res, err := timedCreateFirstExec(b, c, opts, s, call, first)
		ids[sb.ID] = true
		checkTrue(b, res, err)
		if second != nil {
			t0 := time.Now()
			res, err = sb.Run(ctx, "true", trueArgv)
			second.add(time.Since(t0))
		}
		kerr := sb.Kill(ctx)
		checkTrue(b, res, err)
		if kerr != nil {
			b.Fatalf("kill: %v", kerr)
		}
	}
	s.report()
	if benchName(b) == "CreateFirstExec" {
		call.reportAs("CreateCall")
		first.reportAs("CreateFirstCommand")
		second.reportAs("CreateSecondCommand")
		reportCreateTrace(b, c, since, ids, "")
	}
}

// BenchmarkExecRoundTrip times one `true` run (SDK → server → agent and
// back) in a running sandbox.
func BenchmarkExecRoundTrip(b *testing.B) {
	c := client(b)
	ctx := context.Background()
	// The same call on purpose: a task without loop detection and with a
	// call budget for every iteration.
	task, err := c.CreateTask(ctx, corral.TaskOptions{Agent: "bench", MaxCalls: int64(b.N) + 10, NoLoopCheck: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _, _ = c.EndTask(context.Background(), task.ID) })
	sb, err := c.Create(ctx, corral.CreateOptions{Task: task.ID})
	if err != nil {
		b.Fatalf("create: %v", err)
	}
	b.Cleanup(func() { _ = sb.Kill(context.Background()) })
	res, err := sb.Run(ctx, "true", trueArgv) // warm up connections
	checkTrue(b, res, err)
	s := newSamples(b)
	for i := 0; i < b.N; i++ {
		s.start()
		res, err := sb.Run(ctx, "true", trueArgv)
		s.stop()
		checkTrue(b, res, err)
	}
	s.report()
}

// BenchmarkKill times Sandbox.Kill of an idle sandbox.
func BenchmarkKill(b *testing.B) {
	c := client(b)
	ctx := context.Background()
	s := newSamples(b)
	for i := 0; i < b.N; i++ {
		sb, err := c.Create(ctx, corral.CreateOptions{})
		if err != nil {
			b.Fatalf("create: %v", err)
		}
		s.start()
		err = sb.Kill(ctx)
		s.stop()
		if err != nil {
			b.Fatalf("kill: %v", err)
		}
	}
	s.report()
}

// client returns an SDK client of the shared server, or skips b.
func client(b *testing.B) *corral.Client {
	b.Helper()
	need(b)
	return corral.New(env.url, env.key)
}

// checkTrue fails b unless a `true` run succeeded.
func checkTrue(b *testing.B, res *corral.CommandResult, err error) {
	b.Helper()
	if err != nil {
		b.Fatalf("run true: %v", err)
	}
	if res.ExitCode != 0 {
		b.Fatalf("run true: exit %d (%s), stderr %q", res.ExitCode, res.Status, res.Stderr)
	}
}

// timedCreateFirstExec creates a sandbox with opts and runs `true` in
// it, as one timed section of s (create → first exec); call gets the
// Create call's share and first the first command's. It fails b when
// the create fails and returns the command's result for the caller to
// check (after its kill, so that a failed check leaves no sandbox).
func timedCreateFirstExec(b *testing.B, c *corral.Client, opts corral.CreateOptions, s, call, first *samples) (*corral.Sandbox, *corral.CommandResult, error) {
	b.Helper()
	ctx := context.Background()
	s.start()
	sb, err := c.Create(ctx, opts)
	created := time.Now()
	if err != nil {
		b.Fatalf("create: %v", err)
	}
	res, err := sb.Run(ctx, "true", trueArgv)
	s.stop()
	call.add(created.Sub(s.t0))
	first.add(time.Since(created))
	return sb, res, err
}
