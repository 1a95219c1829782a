package cgroups

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
)

// RunDelay returns how long, in nanoseconds, thread tid has been runnable
// but not running since it started: the second field of
// /proc/<tid>/schedstat (sched_info run_delay). It counts time spent
// waiting on a run queue for a CPU and time the thread's cgroup was
// throttled at its CFS quota; it does not count sleeping or waiting for
// I/O. It is kept by every kernel with CONFIG_SCHED_INFO (schedstats
// need not be enabled) and does not depend on the cgroup version.
func RunDelay(tid int) (uint64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(tid) + "/schedstat")
	if err != nil {
		return 0, err
	}
	return parseSchedstat(data)
}

// parseSchedstat returns the run delay of a /proc/<tid>/schedstat line
// ("<run ns> <run delay ns> <timeslices>").
func parseSchedstat(data []byte) (uint64, error) {
	f := strings.Fields(string(data))
	if len(f) < 2 {
		return 0, fmt.Errorf("schedstat %q: too few fields", data)
	}
	v, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("schedstat %q: %w", data, err)
	}
	return v, nil
}

// WaitCounter accumulates the run delay of a group's threads into one
// counter that only grows, as cpuacct does for CPU time. Per-thread run
// delays vanish when a thread exits; the counter keeps what each thread
// had accumulated by the last Update that saw it, and adds a thread first
// seen (or whose delay went backwards: its id was reused) with all of its
// delay. What a thread accumulated after the last Update before it
// exited is lost. It is safe for concurrent use.
type WaitCounter struct {
	mu    sync.Mutex
	last  map[int]uint64
	total uint64
	read  func(tid int) (uint64, error) // RunDelay; replaced in tests
}

// NewWaitCounter returns a counter at zero.
func NewWaitCounter() *WaitCounter {
	return &WaitCounter{last: map[int]uint64{}, read: RunDelay}
}

// Update reads the run delay of tids (the group's current threads) and
// returns the counter in seconds. A thread that cannot be read (it has
// exited) is skipped.
func (c *WaitCounter) Update(tids []int) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := make(map[int]uint64, len(tids))
	for _, tid := range tids {
		d, err := c.read(tid)
		if err != nil {
			continue
		}
		if prev, ok := c.last[tid]; ok && d >= prev {
			c.total += d - prev
		} else {
			c.total += d
		}
		next[tid] = d
	}
	c.last = next
	return float64(c.total) / 1e9
}

// Total returns the counter in seconds without reading any thread.
func (c *WaitCounter) Total() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return float64(c.total) / 1e9
}
