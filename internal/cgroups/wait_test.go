package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestParseSchedstat(t *testing.T) {
	tests := []struct {
		in      string
		want    uint64
		wantErr bool
	}{
		{"902808812 629332498 196\n", 629332498, false},
		{"0 0 0", 0, false},
		{"12", 0, true},
		{"1 x 2", 0, true},
		{"", 0, true},
	}
	for _, tt := range tests {
		got, err := parseSchedstat([]byte(tt.in))
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseSchedstat(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

// TestRunDelayReal reads this process's threads: every one has a
// schedstat line the parser accepts (the kernel keeps run delay without
// schedstats enabled), and an unknown thread is an error.
func TestRunDelayReal(t *testing.T) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Skip("no /proc:", err)
	}
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := RunDelay(tid); err != nil {
			t.Errorf("RunDelay(%d): %v", tid, err)
		}
	}
	if _, err := RunDelay(1 << 30); err == nil {
		t.Error("RunDelay of a thread that does not exist: no error")
	}
}

// TestWaitCounter: the counter only grows although per-thread delays
// vanish when threads exit, a new thread counts with all its delay, and a
// reused thread id (its delay went backwards) counts as a new thread.
func TestWaitCounter(t *testing.T) {
	delays := map[int]uint64{}
	c := NewWaitCounter()
	c.read = func(tid int) (uint64, error) {
		d, ok := delays[tid]
		if !ok {
			return 0, errors.New("exited")
		}
		return d, nil
	}
	steps := []struct {
		name   string
		delays map[int]uint64 // ns
		tids   []int
		want   float64 // s
	}{
		{"first read counts what the threads hold", map[int]uint64{1: 1e9, 2: 2e9}, []int{1, 2}, 3},
		{"growth is added", map[int]uint64{1: 1.5e9, 2: 2e9}, []int{1, 2}, 3.5},
		{"an exited thread keeps its share", map[int]uint64{1: 2e9}, []int{1, 2}, 4},
		{"a new thread counts in full", map[int]uint64{1: 2e9, 3: 0.25e9}, []int{1, 3}, 4.25},
		{"a reused id counts as new", map[int]uint64{1: 2e9, 3: 0.1e9}, []int{1, 3}, 4.35},
		{"no threads", map[int]uint64{}, nil, 4.35},
	}
	for _, st := range steps {
		clear(delays)
		for k, v := range st.delays {
			delays[k] = v
		}
		if got := c.Update(st.tids); got < st.want-1e-9 || got > st.want+1e-9 || got != c.Total() {
			t.Errorf("%s: counter %v s (Total %v), want %v", st.name, got, c.Total(), st.want)
		}
	}
}

// TestThreadsFile: v1 lists threads in the pids controller's tasks file,
// v2 in cgroup.threads of the unified group.
func TestThreadsFile(t *testing.T) {
	if got, want := (Group{Path: "/corral/x"}).threadsFile(), filepath.Join(Root, "pids/corral/x/tasks"); got != want {
		t.Errorf("v1 = %s, want %s", got, want)
	}
	if got, want := (Group{Path: "/corral/x", v2: true}).threadsFile(), filepath.Join(Root, "corral/x/cgroup.threads"); got != want {
		t.Errorf("v2 = %s, want %s", got, want)
	}
}
