package oci

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// initWatch tells when a sandbox's init process (the host process the
// runtime reports: runc's container init, runsc's sandbox) exits, without
// a process per sandbox: a pidfd of the init, parked in Go's netpoller
// (no thread per sandbox), becomes readable when it exits.
type initWatch struct {
	pid int
	f   *os.File
	// done is closed when the init exited (or the watch was stopped).
	done chan struct{}
}

// watchInit opens a pidfd of pid, the init of sandbox id, and closes the
// watch's done when it exits. A pid names a process only while it runs:
// the caller makes sure pid still was the init after the pidfd was
// opened (see watchOf), so that a pid reused by another process after
// the sandbox's init died is never watched in its place.
func (d *Driver) watchInit(id string, pid int) (*initWatch, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("pidfd of %s init %d: %w", id, pid, err)
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	w := &initWatch{pid: pid, f: f, done: make(chan struct{})}
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

// running reports whether the pidfd's process still exists (a zombie
// not yet reaped counts): while it does, its pid names no other process.
func (w *initWatch) running() bool {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return false
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.PidfdSendSignal(int(fd), 0, nil, 0)
	}); err != nil {
		return false
	}
	return serr == nil
}

// stop ends a watch that is not kept: its pidfd is closed.
func (w *initWatch) stop() { w.f.Close() }

// exited reports whether the watched init has exited.
func (w *initWatch) exited() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
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
	rc := d.binary(d.runtimeOf(id))
	alive := func() int {
		st, err := rc.State(ctx, id)
		if err != nil || st.Pid <= 0 || (st.Status != "running" && st.Status != "created" && st.Status != "paused") {
			return 0
		}
		return st.Pid
	}
	pid := alive()
	if pid == 0 {
		return nil
	}
	w, err := d.watchInit(id, pid)
	if err != nil {
		return nil
	}
	// The runtime still reports pid as the running init after the pidfd
	// was opened: the init ran from before the first reading to after
	// this one, so the pidfd is of the init, not of a process that got
	// its pid after it died (the runtime checks the process's start time).
	if alive() != pid {
		w.stop()
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
