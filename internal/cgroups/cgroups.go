// Package cgroups reads the counters corral needs from a sandbox's cgroup,
// on both cgroup v1 (one hierarchy per controller) and cgroup v2 (unified).
// It reads, and freezes a group (SetFrozen); runc and runsc create and
// remove the cgroups.
package cgroups

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Root is where cgroup file systems are mounted.
const Root = "/sys/fs/cgroup"

// Unified reports whether the host uses cgroup v2 only. It is looked up
// once: every command's OOM-kill count opens a group, and the host's
// hierarchy does not change under a running control plane.
func Unified() bool { return unified() }

var unified = sync.OnceValue(func() bool {
	_, err := os.Stat(filepath.Join(Root, "cgroup.controllers"))
	return err == nil
})

// Group is one cgroup, named by its path below the hierarchy root
// (for example "/corral/abc").
type Group struct {
	// Path is the cgroup path as written in the OCI spec's cgroupsPath.
	Path string
	v2   bool
}

// Open returns the group at path for the host's cgroup version.
func Open(path string) Group { return Group{Path: path, v2: Unified()} }

func (g Group) file(controller, name string) string {
	if g.v2 {
		return filepath.Join(Root, g.Path, name)
	}
	return filepath.Join(Root, controller, g.Path, name)
}

// Dirs returns every directory the group occupies on the host (one per
// controller on v1), whether or not it exists.
func (g Group) Dirs() []string {
	if g.v2 {
		return []string{filepath.Join(Root, g.Path)}
	}
	var dirs []string
	ents, err := os.ReadDir(Root)
	if err != nil {
		return nil
	}
	for _, e := range ents {
		if e.Name() == "unified" {
			continue
		}
		if e.IsDir() {
			dirs = append(dirs, filepath.Join(Root, e.Name(), g.Path))
		}
	}
	return dirs
}

// Exists reports whether any directory of the group still exists.
func (g Group) Exists() bool {
	for _, d := range g.Dirs() {
		if _, err := os.Stat(d); err == nil {
			return true
		}
	}
	return false
}

// Procs returns the pids in the group (the pids controller on v1).
func (g Group) Procs() ([]int, error) {
	data, err := os.ReadFile(g.file("pids", "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		p, err := strconv.Atoi(f)
		if err == nil {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

// Threads returns the ids of every thread in the group (the pids
// controller's tasks file on v1, cgroup.threads on v2), for per-thread
// scheduler statistics.
func (g Group) Threads() ([]int, error) {
	data, err := os.ReadFile(g.threadsFile())
	if err != nil {
		return nil, err
	}
	var tids []int
	for _, f := range strings.Fields(string(data)) {
		t, err := strconv.Atoi(f)
		if err == nil {
			tids = append(tids, t)
		}
	}
	return tids, nil
}

func (g Group) threadsFile() string {
	if g.v2 {
		return g.file("", "cgroup.threads")
	}
	return g.file("pids", "tasks")
}

// OOMKills returns how many processes the kernel killed at the group's
// memory limit.
func (g Group) OOMKills() (uint64, error) {
	name := "memory.oom_control"
	if g.v2 {
		name = "memory.events"
	}
	v, err := keyed(g.file("memory", name), "oom_kill")
	if err != nil {
		return 0, err
	}
	return uint64(v), nil
}

// MemoryBytes returns current memory use.
func (g Group) MemoryBytes() (int64, error) {
	name := "memory.usage_in_bytes"
	if g.v2 {
		name = "memory.current"
	}
	return single(g.file("memory", name))
}

// Pids returns the current number of tasks.
func (g Group) Pids() (int64, error) { return single(g.file("pids", "pids.current")) }

// CPUSeconds returns the CPU time used by the group.
func (g Group) CPUSeconds() (float64, error) {
	if g.v2 {
		us, err := keyed(g.file("", "cpu.stat"), "usage_usec")
		return float64(us) / 1e6, err
	}
	ns, err := single(g.file("cpuacct", "cpuacct.usage"))
	return float64(ns) / 1e9, err
}

func single(path string) (int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return v, nil
}

func keyed(path, key string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New(key + " not found in " + path)
}

// SetFrozen freezes (true) or thaws (false) every task of the group with
// the freezer (v1: freezer.state, v2: cgroup.freeze) and waits until the
// kernel reports the new state, at most timeout. It is the one write this
// package makes: gVisor's own pause stops the sandbox's tasks but not its
// kernel, which would keep using the host's CPU while paused.
func (g Group) SetFrozen(frozen bool, timeout time.Duration) error {
	var path, val, done string
	switch {
	case g.v2:
		path, val, done = filepath.Join(Root, g.Path, "cgroup.freeze"), "0", "frozen 0"
		if frozen {
			val, done = "1", "frozen 1"
		}
	default:
		path, val = g.file("freezer", "freezer.state"), "THAWED"
		if frozen {
			val = "FROZEN"
		}
		done = val
	}
	if err := os.WriteFile(path, []byte(val), 0); err != nil {
		return fmt.Errorf("cgroup %s: set %s: %w", g.Path, val, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		var got string
		if g.v2 {
			b, err := os.ReadFile(filepath.Join(Root, g.Path, "cgroup.events"))
			if err != nil {
				return fmt.Errorf("cgroup %s: %w", g.Path, err)
			}
			for _, line := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(line, "frozen ") {
					got = line
				}
			}
		} else {
			b, err := os.ReadFile(path)
			if err != nil {
				return fmt.Errorf("cgroup %s: %w", g.Path, err)
			}
			got = strings.TrimSpace(string(b))
		}
		if got == done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: still %q, not %q, after %s", g.Path, got, done, timeout)
		}
		if !frozen && !g.v2 {
			// A v1 thaw that raced a freeze in progress is retried.
			_ = os.WriteFile(path, []byte(val), 0)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
