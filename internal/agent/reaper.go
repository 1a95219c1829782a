package agent

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// reaper is the single place where the agent waits for children. As PID 1 of
// the sandbox (or a child subreaper) the agent inherits every orphan, so it
// must reap all of them (threat-model.md #13); mixing exec.Cmd.Wait with a wait4(-1)
// loop would race, so every child is started with syscall.ForkExec and its
// exit status is delivered here.
//
// In global mode the reaper calls wait4(-1, WNOHANG) on every SIGCHLD and
// hands each status to the waiter registered for that pid; statuses of pids
// nobody registered (orphans) are kept for a short while and then dropped.
// Without global mode it only waits for the pids it was asked about, so it
// never steals children from other code in the same process.
type reaper struct {
	mu       sync.Mutex
	global   bool
	waiters  map[int]chan syscall.WaitStatus
	unowned  map[int]unownedStatus
	wake     chan os.Signal
	started  bool
	reapedCh chan struct{} // test hook: signalled after each reap pass
}

type unownedStatus struct {
	ws syscall.WaitStatus
	at time.Time
}

// unownedTTL is how long the status of an unregistered pid is kept.
const unownedTTL = time.Minute

// maxUnowned bounds the kept statuses, so an orphan flood costs no memory.
const maxUnowned = 1024

// theReaper is process-wide: wait4(-1) concerns all children of the process,
// so there can only be one.
var theReaper = &reaper{
	waiters: map[int]chan syscall.WaitStatus{},
	unowned: map[int]unownedStatus{},
	wake:    make(chan os.Signal, 1),
}

// start launches the reaper goroutine once. global enables reaping of every
// child (PID 1 or subreaper mode); once enabled it stays on.
func (r *reaper) start(global bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if global {
		r.global = true
	}
	if r.started {
		return
	}
	r.started = true
	signal.Notify(r.wake, syscall.SIGCHLD)
	go r.loop()
}

func (r *reaper) loop() {
	// The ticker is a safety net for a SIGCHLD coalesced while the loop was
	// between wait4 calls.
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-r.wake:
		case <-t.C:
		}
		r.reap()
	}
}

// reap collects every exited child it may collect and delivers statuses.
func (r *reaper) reap() {
	r.mu.Lock()
	global := r.global
	var pids []int
	if !global {
		for pid := range r.waiters {
			pids = append(pids, pid)
		}
	}
	r.mu.Unlock()

	if global {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if err == syscall.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				break
			}
			r.deliver(pid, ws)
		}
	} else {
		for _, pid := range pids {
			var ws syscall.WaitStatus
			got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
			for err == syscall.EINTR {
				got, err = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
			}
			if err == nil && got == pid {
				r.deliver(pid, ws)
			} else if err == syscall.ECHILD {
				// Someone else reaped it; report it as killed so the
				// waiter does not hang forever.
				r.deliver(pid, syscall.WaitStatus(syscall.SIGKILL))
			}
		}
	}

	r.mu.Lock()
	now := time.Now()
	for pid, u := range r.unowned {
		if now.Sub(u.at) > unownedTTL {
			delete(r.unowned, pid)
		}
	}
	hook := r.reapedCh
	r.mu.Unlock()
	if hook != nil {
		select {
		case hook <- struct{}{}:
		default:
		}
	}
}

func (r *reaper) deliver(pid int, ws syscall.WaitStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ch, ok := r.waiters[pid]; ok {
		delete(r.waiters, pid)
		ch <- ws // buffered, capacity 1
		return
	}
	if len(r.unowned) < maxUnowned {
		r.unowned[pid] = unownedStatus{ws: ws, at: time.Now()}
	}
}

// forkExec starts a child and registers a waiter for it atomically with
// respect to delivery: the lock is held across fork and registration, so the
// status of a child that exits immediately is still routed to its waiter.
func (r *reaper) forkExec(argv0 string, argv []string, attr *syscall.ProcAttr) (int, <-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(argv0, argv, attr)
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	// A kept status under this pid belongs to an earlier process that had
	// the same pid: the reaper only delivers after taking r.mu, so the new
	// child's status cannot have been recorded yet.
	delete(r.unowned, pid)
	r.waiters[pid] = ch
	// Nudge the loop in case SIGCHLD for this child was already consumed.
	select {
	case r.wake <- syscall.SIGCHLD:
	default:
	}
	return pid, ch, nil
}

// setSubreaper makes the calling process a child subreaper, so orphans of
// its descendants are re-parented to it instead of to the real PID 1.
func setSubreaper() error {
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}
