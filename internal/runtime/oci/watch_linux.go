package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// initWatch tells when a sandbox's init process (the host process the
// runtime reports: runc's container init, runsc's sandbox) exits, without
// a process per sandbox: a pidfd of the init, parked in Go's netpoller
// (no thread per sandbox), becomes readable when it exits.
type initWatch struct {
	pid int
	// done is closed when the init exited.
	done chan struct{}
}

// watchInit opens a pidfd of pid, the init of sandbox id, and closes the
// watch's done when it exits. A pid names a process only while it runs:
// the pidfd is checked, after it was opened, to refer to a process in
// the sandbox's cgroup, so a pid reused by another process after the
// sandbox's init died is never watched in its place.
func (d *Driver) watchInit(id string, pid int) (*initWatch, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("pidfd of %s init %d: %w", id, pid, err)
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	if !inCgroup(pid, d.cgroupPath(id)) {
		f.Close()
		return nil, fmt.Errorf("pid %d is not in the cgroup of %s", pid, id)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	w := &initWatch{pid: pid, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer f.Close()
		// Read returns once the callback reports the pidfd readable,
		// waiting on the netpoller in between.
		_ = rc.Read(func(fd uintptr) bool {
			p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(p, 0)
			return err == nil && n > 0 && p[0].Revents != 0
		})
	}()
	return w, nil
}

// exited reports whether the watched init has exited.
func (w *initWatch) exited() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// inCgroup reports whether process pid is in cgroup path (in the memory
// or, on cgroup v2, the unified hierarchy).
func inCgroup(pid int, path string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "memory" || parts[1] == "" {
			if p := parts[2]; p == path || strings.HasPrefix(p, path+"/") {
				return true
			}
		}
	}
	return false
}

// watchOf returns the init watch of sandbox id, making one for a
// sandbox this instance did not start (adopted after a restart) from the
// runtime's state. It returns nil when the sandbox has no running (or
// paused) init: never started, dead or stopped.
func (d *Driver) watchOf(ctx context.Context, id string) *initWatch {
	d.mu.Lock()
	w := d.watches[id]
	d.mu.Unlock()
	if w != nil {
		return w
	}
	if d.held(id) != nil {
		return nil
	}
	st, err := d.binary(d.runtimeOf(id)).State(ctx, id)
	if err != nil || st.Pid <= 0 || (st.Status != "running" && st.Status != "created" && st.Status != "paused") {
		return nil
	}
	w, err = d.watchInit(id, st.Pid)
	if err != nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if cur := d.watches[id]; cur != nil {
		return cur
	}
	// Kept only while the sandbox is held (checked under mu: Stop
	// removes the directory before it drops the entry), so an Alive
	// racing Stop leaves no entry behind.
	if d.held(id) != nil {
		return w
	}
	d.watches[id] = w
	return w
}

// errInitExited is returned by waitAgent when the sandbox's init exits.
var errInitExited = errors.New("sandbox init exited")
