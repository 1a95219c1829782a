package sandbox_test

import (
	"context"
	"sync"
	"testing"

	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/watchdog"
)

// TestUsageFeeds checks the Manager's two feeds of the usage meter: every
// command started is reported to OnCommand, and a sandbox that ends gets
// a final watchdog reading taken before it stops, so CPU used after the
// last sampling round reaches OnSample. Without the final reading, a
// sandbox killed within a second of heavy work is billed for less than it
// used.
func TestUsageFeeds(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	var mu sync.Mutex
	commands := map[string]int{}
	cfg.OnCommand = func(id string) { mu.Lock(); commands[id]++; mu.Unlock() }
	h := newHarness(t, cfg)
	var last watchdog.Sample
	wd := watchdog.New(watchdog.Config{OnSample: func(_ string, s watchdog.Sample) { last = s }}, h.m, nil, nil)
	h.m.SetWatchdog(wd)
	sb := h.create(sandbox.CreateRequest{})
	h.d.SetStats(sb.ID, runtime.Stats{CPUSeconds: 1})
	wd.Tick()
	for range 3 {
		execOut(t, h, sb.ID, "echo", "x")
	}
	h.d.SetStats(sb.ID, runtime.Stats{CPUSeconds: 4.5}) // used after the last round
	if _, err := h.m.Kill(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if last.CPUSeconds != 4.5 {
		t.Errorf("last sample's CPU %v, want the final reading's 4.5", last.CPUSeconds)
	}
	mu.Lock()
	defer mu.Unlock()
	if commands[sb.ID] != 3 {
		t.Errorf("OnCommand counted %d commands, want 3", commands[sb.ID])
	}
}
