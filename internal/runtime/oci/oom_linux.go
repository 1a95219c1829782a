package oci

import (
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/corralhq/corral/internal/cgroups"
	"golang.org/x/sys/unix"
)

// watchOOM keeps the sandbox's OOM-kill count in d.oom[id] as it
// changes. The runtime removes the sandbox's cgroup when its init dies,
// taking the counter with it; a sandbox whose init was OOM-killed would
// otherwise be recorded as a plain error. On cgroup v1 it waits on a
// memory.oom_control eventfd, so the count is read while the cgroup still
// exists; on v2 it polls memory.events.
func (d *Driver) watchOOM(id string, exited <-chan struct{}) {
	g := cgroups.Open(d.cgroupPath(id))
	// record stores the counter; with event set, an OOM event was just
	// signalled, which counts even before the kernel's counter moves (the
	// event fires when the limit is hit, ahead of the kill).
	record := func(event bool) bool {
		n, err := g.OOMKills()
		if err != nil {
			return false
		}
		d.mu.Lock()
		if _, ok := d.oom[id]; !ok {
			d.mu.Unlock()
			return false // stopped
		}
		if event && n <= d.oom[id] {
			n = d.oom[id] + 1
		}
		if n > d.oom[id] {
			d.oom[id] = n
		}
		d.mu.Unlock()
		return true
	}
	if !cgroups.Unified() {
		if efd, ok := registerOOMEvent(g); ok {
			// Non-blocking, so the read waits in Go's netpoller: no
			// thread per sandbox in the control plane.
			f := os.NewFile(uintptr(efd), "oom-eventfd")
			defer f.Close()
			buf := make([]byte, 8)
			for {
				if _, err := f.Read(buf); err != nil {
					return
				}
				if !record(true) {
					return // the cgroup is gone
				}
			}
		}
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-exited:
			record(false) // a kill just before the exit still counts
			return
		case <-t.C:
			if !record(false) {
				return
			}
		}
	}
}

// adoptOOM starts watching the OOM kills of a sandbox this instance did
// not start (it was adopted after a control-plane restart), from its first
// Stats, which read n. Without it, a gVisor sandbox the OOM killer ended
// would take its counter with its cgroup, and the control plane would
// record the death as an error: TestConformance's AdoptOOM is the
// regression test. The sandbox must still be held (checked under mu:
// Stop removes the directory before it drops the entry), so a Stats
// racing Stop leaves no watch behind.
func (d *Driver) adoptOOM(id string, n uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.oom[id]; ok || d.held(id) != nil {
		return
	}
	d.oom[id] = n
	// No exit channel: the watch ends when the cgroup is gone.
	go d.watchOOM(id, nil)
}

// registerOOMEvent asks cgroup v1 to signal an eventfd on OOM events of g.
func registerOOMEvent(g cgroups.Group) (int, bool) {
	dir := filepath.Join(cgroups.Root, "memory", g.Path)
	ctl, err := os.Open(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		return -1, false
	}
	defer ctl.Close()
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return -1, false
	}
	line := strconv.Itoa(efd) + " " + strconv.Itoa(int(ctl.Fd()))
	if err := os.WriteFile(filepath.Join(dir, "cgroup.event_control"), []byte(line), 0); err != nil {
		unix.Close(efd)
		return -1, false
	}
	return efd, true
}
