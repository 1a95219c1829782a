package agent

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/corralhq/corral/proto/process"
)

const (
	pipeChunk = 32 << 10 // envd's data chunk size for pipes
	ptyChunk  = 16 << 10 // and for PTYs
	// subBuffer bounds each subscriber's queue (at most 16 chunks, 512 KiB).
	// When it is full the output reader blocks, which in turn blocks the
	// process on its pipe: a slow consumer slows the producer, memory stays
	// bounded.
	subBuffer = 16
	// retainExited is how long an exited process stays connectable.
	retainExited = 30 * time.Second
	// drainGrace is how long, once the process has exited, its output
	// pipes may stay empty before they are closed: descendants that
	// inherited them may still write. It counts only time spent waiting
	// for output, never time spent handing output to a slow consumer, so
	// what the process wrote before it exited is always delivered whole.
	drainGrace = 500 * time.Millisecond
	// drainMax bounds what is still read from each pipe once the process
	// has exited (descendants that keep writing): 1 MiB, the most an
	// unprivileged writer can make a pipe hold (fs.pipe-max-size).
	drainMax = 1 << 20
)

// proc is one process started by the agent.
type proc struct {
	pid    int
	tag    string
	config *pb.ProcessConfig
	isPTY  bool

	stdinMu sync.Mutex
	stdin   *os.File // pipe to the process's stdin; nil if none or closed
	ptmx    *os.File // PTY master, for PTY processes

	mu       sync.Mutex
	subs     map[*subscriber]struct{}
	end      *pb.ProcessEvent_EndEvent // set once, before finished closes
	finished chan struct{}

	timedOut  atomic.Bool
	signalled atomic.Bool
	exited    atomic.Bool // the process has exited; its pipes drain (drainGrace)
	timer     *time.Timer
	oomBefore int64
}

// subscriber is one attached stream. Output is delivered only to attached
// streams, through a bounded queue.
type subscriber struct {
	ch   chan *pb.ProcessEvent
	done chan struct{}
	once sync.Once
}

func newSubscriber() *subscriber {
	return &subscriber{ch: make(chan *pb.ProcessEvent, subBuffer), done: make(chan struct{})}
}

func (s *subscriber) close() { s.once.Do(func() { close(s.done) }) }

// subscribe attaches sub. It reports false if the process already ended.
func (p *proc) subscribe(sub *subscriber) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		return false
	}
	p.subs[sub] = struct{}{}
	return true
}

func (p *proc) unsubscribe(sub *subscriber) {
	sub.close()
	p.mu.Lock()
	delete(p.subs, sub)
	p.mu.Unlock()
}

// broadcast hands ev to every attached subscriber, blocking on full queues
// until the subscriber reads or detaches.
func (p *proc) broadcast(ev *pb.ProcessEvent) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.done:
		}
	}
}

// readBufs holds the pumps' read buffers (pipeChunk bytes, the larger
// chunk): a command that writes little would otherwise allocate two
// 32 KiB buffers it hardly uses, and the agent's small heap goal
// (idleGCPercent) turns that garbage into a collection every few
// commands.
var readBufs = sync.Pool{New: func() any { b := make([]byte, pipeChunk); return &b }}

// pump reads r in chunks of size (at most pipeChunk) and broadcasts them
// as data events, until EOF or, once the process has exited, until r
// stays empty for drainGrace or drainMax more bytes have come. r must
// support read deadlines (a pipe or a non-blocking PTY master).
func (p *proc) pump(r *os.File, size int, wrap func([]byte) *pb.ProcessEvent_DataEvent) {
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	buf := (*bp)[:size]
	afterExit := 0
	for {
		if p.exited.Load() {
			// Re-armed before every read: the time this pump spent in
			// broadcast, waiting for a slow consumer, is not idle time.
			if afterExit >= drainMax || r.SetReadDeadline(time.Now().Add(drainGrace)) != nil {
				return
			}
		}
		n, err := r.Read(buf)
		if p.exited.Load() {
			afterExit += n
		}
		if n > 0 {
			chunk := make([]byte, n)
			copy(chunk, buf[:n])
			p.broadcast(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: wrap(chunk)}})
		}
		if err != nil {
			return
		}
	}
}

// kill sends sig to the process's whole process group (it is the leader of
// its own session), falling back to the process itself while it has not
// exited: once it is reaped its pid may be another process's (its group's
// id is not reused while the group has members).
func (p *proc) kill(sig syscall.Signal) error {
	err := syscall.Kill(-p.pid, sig)
	if err == syscall.ESRCH && !p.exited.Load() {
		err = syscall.Kill(p.pid, sig)
	}
	return err
}

// timeout is called when the process's lifetime elapses.
func (p *proc) timeout() {
	p.timedOut.Store(true)
	_ = p.kill(syscall.SIGKILL)
}

// finish records the end event and wakes every attached stream.
func (p *proc) finish(end *pb.ProcessEvent_EndEvent) {
	p.mu.Lock()
	p.end = end
	p.subs = map[*subscriber]struct{}{}
	p.mu.Unlock()
	close(p.finished)
}

func (p *proc) endEvent() *pb.ProcessEvent_EndEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.end
}

// statusString renders a wait status the way os.ProcessState.String does,
// which is what envd reports.
func statusString(ws syscall.WaitStatus) string {
	var res string
	switch {
	case ws.Exited():
		res = "exit status " + strconv.Itoa(ws.ExitStatus())
	case ws.Signaled():
		res = "signal: " + ws.Signal().String()
	case ws.Stopped():
		res = "stop signal: " + ws.StopSignal().String()
	case ws.Continued():
		res = "continued"
	}
	if ws.CoreDump() {
		res += " (core dumped)"
	}
	return res
}

// buildEnd turns a wait status into envd's end event plus corral's
// extension fields.
func (p *proc) buildEnd(ws syscall.WaitStatus) *pb.ProcessEvent_EndEvent {
	status := statusString(ws)
	e := &pb.ProcessEvent_EndEvent{ExitCode: int32(ws.ExitStatus()), Exited: ws.Exited(), Status: status}
	if status != "exit status 0" {
		e.Error = proto.String(status)
	}
	switch {
	case p.timedOut.Load():
		e.Error = proto.String("command timed out")
		e.TimedOut = true
		e.EndReason = "timeout"
	case ws.Signaled() && ws.Signal() == syscall.SIGKILL:
		if !p.signalled.Load() && p.oomBefore >= 0 && oomKills() > p.oomBefore {
			e.EndReason = "oom"
		} else {
			e.EndReason = "killed"
		}
	case ws.Signaled():
		e.EndReason = "killed"
	}
	return e
}

// oomKills reads the oom_kill counter of the agent's cgroup (the sandbox's),
// or -1 if unavailable.
func oomKills() int64 {
	b, err := os.ReadFile("/sys/fs/cgroup/memory.events")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}

// writeInput writes data to the process's stdin pipe or PTY.
// A write blocked past deadline fails with os.ErrDeadlineExceeded.
func (p *proc) writeInput(data []byte, toPTY bool, deadline time.Time) error {
	if p.isPTY != toPTY {
		if p.isPTY {
			return errors.New("process is a PTY: send input as pty")
		}
		return errors.New("process has no PTY: send input as stdin")
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	f := p.stdin
	if p.isPTY {
		f = p.ptmx
	}
	if f == nil {
		return errors.New("stdin is not open")
	}
	_ = f.SetWriteDeadline(deadline)
	_, err := f.Write(data)
	return err
}

// closeStdin closes the stdin pipe, so the process reads EOF.
func (p *proc) closeStdin() error {
	if p.isPTY {
		return errors.New("cannot close stdin of a PTY process")
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return nil
	}
	err := p.stdin.Close()
	p.stdin = nil
	return err
}

// procTable holds live processes and, for retainExited, ended ones.
type procTable struct {
	mu     sync.Mutex
	live   map[int]*proc
	exited map[int]*proc
}

func newProcTable() *procTable {
	return &procTable{live: map[int]*proc{}, exited: map[int]*proc{}}
}

func (t *procTable) add(p *proc) {
	t.mu.Lock()
	t.live[p.pid] = p
	t.mu.Unlock()
}

// retire moves p from live to exited and forgets it after retainExited.
func (t *procTable) retire(p *proc) {
	t.mu.Lock()
	if t.live[p.pid] == p {
		delete(t.live, p.pid)
	}
	t.exited[p.pid] = p
	t.mu.Unlock()
	time.AfterFunc(retainExited, func() {
		t.mu.Lock()
		if t.exited[p.pid] == p {
			delete(t.exited, p.pid)
		}
		t.mu.Unlock()
	})
}

// find returns the process selected by pid or tag; with exited it also
// returns recently ended ones.
func (t *procTable) find(sel *pb.ProcessSelector, exited bool) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		if p, ok := t.live[int(s.Pid)]; ok {
			return p, nil
		}
		if p, ok := t.exited[int(s.Pid)]; ok && exited {
			return p, nil
		}
		return nil, fmt.Errorf("process with pid %d not found", s.Pid)
	case *pb.ProcessSelector_Tag:
		for _, p := range t.live {
			if p.tag == s.Tag {
				return p, nil
			}
		}
		if exited {
			for _, p := range t.exited {
				if p.tag == s.Tag {
					return p, nil
				}
			}
		}
		return nil, fmt.Errorf("process with tag %s not found", s.Tag)
	default:
		return nil, errors.New("process selector is missing")
	}
}

func (t *procTable) list() []*proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*proc, 0, len(t.live))
	for _, p := range t.live {
		out = append(out, p)
	}
	return out
}
