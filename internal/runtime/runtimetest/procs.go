package runtimetest

import (
	"errors"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/corralhq/corral/proto/process"
)

// procTable holds one fake agent's processes.
type procTable struct {
	mu sync.Mutex
	// next is the next pid; byPid the processes (ended ones too);
	// hist the commands started. Guarded by mu.
	next  uint32
	byPid map[uint32]*fproc
	hist  []Command
}

func newProcTable() *procTable { return &procTable{next: 2, byPid: map[uint32]*fproc{}} }

func (t *procTable) start(c Command, cfg *pb.ProcessConfig, stdin bool) *fproc {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := &fproc{pid: t.next, cmd: c, config: proto.Clone(cfg).(*pb.ProcessConfig), hasStdin: stdin, wake: make(chan struct{})}
	if !stdin {
		p.inEOF = true
	}
	t.next++
	t.byPid[p.pid] = p
	t.hist = append(t.hist, c)
	return p
}

func (t *procTable) find(sel *pb.ProcessSelector) *fproc {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		return t.byPid[s.Pid]
	case *pb.ProcessSelector_Tag:
		for _, p := range t.byPid {
			if p.cmd.Tag == s.Tag && !p.ended() {
				return p
			}
		}
	}
	return nil
}

// running returns the processes that have not ended, by pid.
func (t *procTable) running() []*fproc {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*fproc
	for pid := uint32(2); pid < t.next; pid++ {
		if p := t.byPid[pid]; p != nil && !p.ended() {
			out = append(out, p)
		}
	}
	return out
}

func (t *procTable) history() []Command {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Command(nil), t.hist...)
}

// killAll ends every running process with SIGKILL and returns how many.
func (t *procTable) killAll() int {
	ps := t.running()
	for _, p := range ps {
		p.terminate(killOOM)
	}
	return len(ps)
}

// kill is why a process is being ended from outside.
type kill int

const (
	killNone    kill = iota
	termSignal       // SendSignal SIGTERM
	killSignal       // SendSignal SIGKILL
	killTimeout      // its lifetime passed
	killOOM          // the memory limit (OOMKillCommands)
)

// fproc is one scripted process.
type fproc struct {
	pid      uint32
	cmd      Command
	config   *pb.ProcessConfig
	hasStdin bool

	mu sync.Mutex
	// out are its data events; in its unread stdin; inEOF that stdin
	// is closed; killed the first kill asked for; end its end event
	// (set once). wake is closed and replaced whenever one changes.
	// Guarded by mu.
	out    []*pb.ProcessEvent
	in     [][]byte
	inEOF  bool
	killed kill
	end    *pb.ProcessEvent_EndEvent
	wake   chan struct{}
}

func (p *fproc) kickLocked() {
	close(p.wake)
	p.wake = make(chan struct{})
}

func (p *fproc) ended() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.end != nil
}

func (p *fproc) emit(stdout bool, data []byte) {
	if len(data) == 0 {
		return
	}
	d := &pb.ProcessEvent_DataEvent{}
	if stdout {
		d.Output = &pb.ProcessEvent_DataEvent_Stdout{Stdout: append([]byte(nil), data...)}
	} else {
		d.Output = &pb.ProcessEvent_DataEvent_Stderr{Stderr: append([]byte(nil), data...)}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.out = append(p.out, &pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: d}})
	p.kickLocked()
}

var errNoStdin = errors.New("process has no stdin")

func (p *fproc) input(data []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.hasStdin || p.inEOF {
		return errNoStdin
	}
	p.in = append(p.in, append([]byte(nil), data...))
	p.kickLocked()
	return nil
}

func (p *fproc) closeStdin() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.hasStdin {
		return errNoStdin
	}
	p.inEOF = true
	p.kickLocked()
	return nil
}

// terminate asks the process to end for k (the first reason wins).
func (p *fproc) terminate(k kill) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil || p.killed != killNone {
		return
	}
	p.killed = k
	p.kickLocked()
}

// finish sets the end event (once).
func (p *fproc) finish(e *pb.ProcessEvent_EndEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end == nil {
		p.end = e
		p.kickLocked()
	}
}

// exitEvent is the end event of a process that exited with code, as the
// real agent words it.
func exitEvent(code int) *pb.ProcessEvent_EndEvent {
	status := "exit status " + strconv.Itoa(code)
	e := &pb.ProcessEvent_EndEvent{ExitCode: int32(code), Exited: true, Status: status}
	if code != 0 {
		e.Error = proto.String(status)
	}
	return e
}

// killEvent is the end event of a process ended by k.
func killEvent(k kill) *pb.ProcessEvent_EndEvent {
	status := "signal: killed"
	if k == termSignal {
		status = "signal: terminated"
	}
	e := &pb.ProcessEvent_EndEvent{ExitCode: -1, Status: status, Error: proto.String(status), EndReason: "killed"}
	if k == killTimeout {
		e.Error, e.TimedOut, e.EndReason = proto.String("command timed out"), true, "timeout"
	}
	return e
}

// run plays res: its output, then (with EchoStdin) stdin to stdout until
// EOF, then a wait (Wait: until killed; For: that long), then its exit.
// A kill ends it at once; the sandbox stopping ends it with no end event.
func (p *fproc) run(res Result, stopped <-chan struct{}) {
	p.emit(true, []byte(res.Stdout))
	p.emit(false, []byte(res.Stderr))
	var timer <-chan time.Time
	switch {
	case res.Wait:
	case res.For > 0:
		t := time.NewTimer(res.For)
		defer t.Stop()
		timer = t.C
	}
	for {
		p.mu.Lock()
		k, in, eof, wake := p.killed, p.in, p.inEOF, p.wake
		p.in = nil
		p.mu.Unlock()
		if k != killNone {
			p.finish(killEvent(k))
			return
		}
		if res.EchoStdin {
			for _, b := range in {
				p.emit(true, b)
			}
			if eof {
				p.finish(exitEvent(res.ExitCode))
				return
			}
		} else if !res.Wait && res.For <= 0 {
			p.finish(exitEvent(res.ExitCode))
			return
		}
		select {
		case <-wake:
		case <-timer:
			p.finish(exitEvent(res.ExitCode))
			return
		case <-stopped:
			return
		}
	}
}
