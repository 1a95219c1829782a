package integration

import (
	"context"
	"fmt"
	"math"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/server"
	"github.com/corralhq/corral/internal/watchdog"
	corral "github.com/corralhq/corral/sdk/go"
)

// TestWatchdogKillsCommand: with the runaway action "command", a command
// that burns its CPU quota is killed and the sandbox lives on (its files,
// later commands), with a watchdog.runaway_action event naming the pid.
func TestWatchdogKillsCommand(t *testing.T) {
	need(t)
	s := startGovServer(t, "runaway-command", func(c *server.Config) {
		c.Watchdog = watchdog.Config{CPURunawayFor: 3 * time.Second}
		c.RunawayAction = "command"
	})
	ctx := context.Background()
	sb := newTaskSandbox(t, s.c, corral.CreateOptions{Resources: corral.Resources{CPU: 0.5}})
	if _, err := sb.Run(ctx, "echo kept > /home/user/k.txt", corral.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	h, err := sb.Start(ctx, "while :; do :; done", corral.RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := h.Wait()
	if err != nil {
		t.Fatalf("the busy command's end: %v", err)
	}
	if res.ExitCode != 137 {
		t.Fatalf("busy command exit %d, want 137 (SIGKILL)", res.ExitCode)
	}
	waitFor(t, "the runaway event", 30*time.Second, func() bool {
		return findEvent(audit(t, s.c, corral.AuditQuery{Sandbox: sb.ID}), "watchdog.runaway_action", sb.ID) != nil
	})
	got, err := s.c.Get(ctx, sb.ID)
	if err != nil || got.State != corral.StateRunning {
		t.Fatalf("the sandbox did not live on: %+v %v", got, err)
	}
	out, err := sb.Run(ctx, "cat /home/user/k.txt", corral.RunOptions{})
	if err != nil || strings.TrimSpace(out.Stdout) != "kept" {
		t.Fatalf("after the runaway: %q %v", out.Stdout, err)
	}
}

// TestCPURunawayBusyHost defends against the busy-host CPU runaway: a
// batch job starts more sandboxes than the host has cores, each running
// a `while true` retry with no command timeout (E2B's timeoutMs: 0). Each
// then gets well below its quota, so a rule on CPU use alone never fired
// and the loops burned the host until their sandboxes expired. On a
// server whose runaway period is 5 s, 2×cores+1 light (0.5-core)
// sandboxes each spinning with no timeout must all end with end reason
// cpu_runaway and a watchdog.cpu_runaway event, while three bystanders
// sampled under the same contention for longer than the period stay
// running with no runaway event: one doing bursty work (busy 100 ms,
// asleep 100 ms), one idle (sleep) and one mostly blocked reading a pipe.
// Each bystander must have been sampled beside the loops at least as
// often as the quickest loop was before the rule stopped it.
func TestCPURunawayBusyHost(t *testing.T) {
	need(t)
	const period = 5 * time.Second
	spinners := 2*goruntime.NumCPU() + 1
	s := startGovServer(t, "runaway-busy", func(c *server.Config) {
		c.Watchdog = watchdog.Config{CPURunawayFor: period}
		c.Admission.MaxConcurrent = spinners + 10
	})
	wd := s.ts.Srv.Manager.Watchdog()
	ctx := context.Background()
	light := corral.CreateOptions{Tier: "light"}

	bystanders := []struct{ name, cmd string }{
		{"bursty", `python3 -c '
import time
while True:
    end = time.monotonic() + 0.1
    while time.monotonic() < end:
        pass
    time.sleep(0.1)
'`},
		{"idle", "sleep 600"},
		{"pipe", "while :; do echo line; sleep 0.02; done | cat > /dev/null"},
	}
	var by, spin []*corral.Sandbox
	for range bystanders {
		by = append(by, newTaskSandbox(t, s.c, light))
	}
	for range spinners {
		spin = append(spin, newTaskSandbox(t, s.c, light))
	}
	for i, b := range bystanders {
		if _, err := by[i].Start(ctx, b.cmd, corral.RunOptions{}); err != nil {
			t.Fatalf("start %s: %v", b.name, err)
		}
	}
	// Start the loops together so that they compete for the whole period.
	started := time.Now()
	errs := make(chan error, spinners)
	for _, sb := range spin {
		go func() {
			_, err := sb.Start(ctx, "while true; do :; done", corral.RunOptions{Timeout: 0})
			errs <- err
		}()
	}
	for range spinners {
		if err := <-errs; err != nil {
			t.Fatalf("start a busy loop: %v", err)
		}
	}

	// Poll until every loop's sandbox has ended, keeping the watchdog's
	// last samples of each for the log.
	last := map[string][]watchdog.Sample{}
	keep := func(id string) {
		if ss := wd.Series(id, started); len(ss) > 0 {
			last[id] = ss
		}
	}
	ended := map[string]*corral.Sandbox{}
	waitFor(t, "every busy loop's sandbox to end", 2*time.Minute, func() bool {
		for _, sb := range append(slices.Clone(by), spin...) {
			keep(sb.ID)
		}
		for _, sb := range spin {
			if ended[sb.ID] != nil {
				continue
			}
			if got, err := s.c.Get(ctx, sb.ID); err == nil && got.State == corral.StateEnded {
				ended[sb.ID] = got
				t.Logf("busy loop %s ended %s after its start: %s", sb.ID, got.EndReason, time.Since(started).Round(100*time.Millisecond))
			}
		}
		return len(ended) == len(spin)
	})
	lastEnd := time.Now()
	judged := math.MaxInt // samples the rule took to stop the quickest loop
	for _, sb := range spin {
		logSamples(t, "busy loop "+sb.ID, last[sb.ID])
		if r := ended[sb.ID].EndReason; r != "cpu_runaway" {
			t.Errorf("busy loop %s ended %q, want cpu_runaway", sb.ID, r)
		}
		ev := findEvent(audit(t, s.c, corral.AuditQuery{Sandbox: sb.ID}), "watchdog.cpu_runaway", sb.ID)
		if ev == nil {
			t.Errorf("busy loop %s: no watchdog.cpu_runaway event", sb.ID)
			continue
		}
		// The samples that stopped it: those up to the event (the final
		// reading taken as it ends comes after).
		n := 0
		for _, x := range last[sb.ID] {
			if !x.Time.After(ev.Time) {
				n++
			}
		}
		judged = min(judged, n)
	}
	for i, b := range bystanders {
		sb := by[i]
		keep(sb.ID)
		logSamples(t, b.name+" "+sb.ID, last[sb.ID])
		var during []watchdog.Sample
		for _, x := range last[sb.ID] {
			if !x.Time.After(lastEnd) {
				during = append(during, x)
			}
		}
		if len(during) < judged {
			t.Fatalf("%s was sampled %d times beside the busy loops, fewer than the %d that stopped them; the test proves nothing", b.name, len(during), judged)
		}
		got, err := s.c.Get(ctx, sb.ID)
		if err != nil || got.State != corral.StateRunning {
			t.Errorf("%s sandbox: %+v %v; want it running", b.name, got, err)
		}
		if ev := findEvent(audit(t, s.c, corral.AuditQuery{Sandbox: sb.ID}), "watchdog.cpu_runaway", sb.ID); ev != nil {
			t.Errorf("%s sandbox got a runaway event: %s", b.name, ev.Data)
		}
	}
}

// logSamples logs a sandbox's CPU use and demand per watchdog sample.
func logSamples(t *testing.T, what string, ss []watchdog.Sample) {
	t.Helper()
	var b strings.Builder
	for _, s := range ss {
		fmt.Fprintf(&b, " %.0f/%.0f", s.CPUPercent, s.DemandPercent)
	}
	t.Logf("%s: CPU/demand %% of one core per sample:%s", what, b.String())
}
