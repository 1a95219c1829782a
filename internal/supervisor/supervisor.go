// Package supervisor is the one process corral keeps beside all the
// sandboxes of a data directory, in place of a resident supervisor per
// sandbox. It is a child subreaper: the OCI runtime's command that makes
// a sandbox (`runc run --detach`, `runsc create`) runs as its child, so
// the sandbox's processes that the runtime leaves behind when it exits
// (the container's init under runc; the sandbox, gofer and stub
// processes under gVisor, whose parents may die first) are reparented
// to it, and it reaps every one of them. Without it they
// would be left to the host's init, which may not reap them (a container
// or microVM init often does not), and accumulate as zombies.
//
// The control plane starts it on first use and talks to it over a unix
// socket that only the supervisor's own user may use. It outlives the
// control plane (its own session, no parent-death signal), so sandboxes
// keep being reaped across a control-plane restart, and the restarted
// control plane uses the same supervisor. It exits once no process is
// left to reap and no client is connected, but only while the process
// that started it is still its parent (which then reaps it): orphaned by
// a control plane that died, it stays, idle, for the next one, since its
// own exit would leave a zombie to the host's init.
package supervisor

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// request is one command for the supervisor to run. Its stdout and
// stderr are the one descriptor passed with the request (SCM_RIGHTS);
// its stdin is /dev/null.
type request struct {
	// ExitIfIdle, instead of a command, asks the supervisor to exit now
	// if it has nothing to reap and no other client (a control plane
	// that closes, so that an idle supervisor does not outlive it).
	ExitIfIdle bool `json:"exit_if_idle,omitempty"`

	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
}

// reply is sent twice per request: once the command started (empty, or
// Error), and once it exited (Exited set, with Code).
type reply struct {
	Exited bool   `json:"exited,omitempty"`
	Code   int    `json:"code"`
	Error  string `json:"error,omitempty"`
	// RanUS is, in the exit reply, how long the command ran in
	// microseconds: from its start to its reaping, as the supervisor saw
	// it (so that its client can tell the command's time from the
	// supervisor's own).
	RanUS int64 `json:"ran_us,omitempty"`
}

// maxRequest bounds a request's size (argv and environment).
const maxRequest = 1 << 20

// DefaultIdleExit is how long the supervisor waits, with nothing to reap
// and no client, before it exits.
const DefaultIdleExit = 5 * time.Second

// server is the supervisor's state.
type server struct {
	ln       *net.UnixListener
	idleExit time.Duration
	ppid     int

	mu sync.Mutex
	// waiters holds the exit channel of each command being run, by pid.
	// Guarded by mu; the reaper takes mu around wait4, so that a command
	// cannot be reaped before its waiter is registered.
	waiters map[int]chan exit
	// conns counts open client connections. Guarded by mu.
	conns int
	// children is false once wait4 said no child is left. Guarded by mu.
	children bool
	// closing is set once the supervisor decided to exit. Guarded by mu.
	closing bool
	// exit is closed to make Serve return, once closing is set, by the
	// one that set it.
	exit chan struct{}
}

// Serve runs the supervisor on the unix socket sock and returns the
// process's exit code. A supervisor already serving sock is left alone
// (Serve returns 0); a stale socket file is replaced.
func Serve(sock string, idleExit time.Duration) int {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "supervisor: set subreaper:", err)
		return 1
	}
	// A terminal's signals and a closed pipe must not end it: sandboxes
	// depend on it. SIGTERM and SIGKILL still do.
	signal.Ignore(syscall.SIGHUP, syscall.SIGINT, syscall.SIGPIPE)
	// One process for all sandboxes, idle most of the time: a small heap goal.
	debug.SetGCPercent(50)
	protectFromOOM()
	_ = os.Chdir("/")
	syscall.Umask(0o077)
	ln, err := listen(sock)
	if err != nil {
		if errors.Is(err, errRunning) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "supervisor:", err)
		return 1
	}
	s := &server{ln: ln, idleExit: idleExit, ppid: os.Getppid(), waiters: map[int]chan exit{}, children: true, exit: make(chan struct{})}
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	go func() {
		for range chld {
			s.reap()
		}
	}()
	s.reap() // children may have been reparented before Notify
	go s.idleLoop()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				<-s.exit
				return 0
			}
			if errors.Is(err, net.ErrClosed) {
				return 1
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.conns++
		s.mu.Unlock()
		go func() {
			s.handle(c)
			c.Close()
			s.mu.Lock()
			s.conns--
			s.mu.Unlock()
		}()
	}
}

var errRunning = errors.New("a supervisor already serves this socket")

// OOMScoreAdj is the supervisor's oom_score_adj. Under memory pressure
// the kernel's OOM killer must pick a sandbox's processes, not the one
// process that reaps them all: killed, every sandbox's init would be
// left to the host's init (which may not reap) and a restarted control
// plane would need a new supervisor. -500 keeps it well behind any
// process of default score (0; a sandbox's commands run at +100),
// without making it unkillable (-1000). Its children inherit it: the
// runtime is short-lived, and corral's spec gives each sandbox's own
// processes oom_score_adj 0 (oci.buildSpec).
const OOMScoreAdj = -500

// protectFromOOM sets the supervisor's oom_score_adj to OOMScoreAdj.
// Lowering it needs CAP_SYS_RESOURCE: without it (a root whose bounding
// set lacks it, as in some containers) the supervisor keeps its score
// and says so on its stderr.
func protectFromOOM() {
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(OOMScoreAdj)), 0); err != nil {
		fmt.Fprintln(os.Stderr, "supervisor: set oom_score_adj:", err)
	}
}

// listen binds sock, replacing a socket file no process serves.
func listen(sock string) (*net.UnixListener, error) {
	addr := &net.UnixAddr{Name: sock, Net: "unix"}
	ln, err := net.ListenUnix("unix", addr)
	if err == nil {
		return ln, nil
	}
	if c, derr := net.Dial("unix", sock); derr == nil {
		c.Close()
		return nil, errRunning
	}
	if fi, serr := os.Lstat(sock); serr == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(sock)
		return net.ListenUnix("unix", addr)
	}
	return nil, fmt.Errorf("listen %s: %w", sock, err)
}

// reap collects every child that has exited, orphans reparented to the
// supervisor included, and hands a command's status to its waiter.
func (s *server) reap() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil { // ECHILD: nothing left
			s.children = false
			return
		}
		if pid == 0 {
			s.children = true
			return
		}
		if ch, ok := s.waiters[pid]; ok {
			delete(s.waiters, pid)
			code := ws.ExitStatus()
			if ws.Signaled() {
				code = 128 + int(ws.Signal())
			}
			ch <- exit{code: code, at: time.Now()}
		}
	}
}

// idleLoop ends the supervisor once it has had nothing to reap and no
// client for idleExit, if the process that started it is still its
// parent.
func (s *server) idleLoop() {
	idleSince := time.Time{}
	for {
		time.Sleep(s.idleExit / 4)
		s.reap()
		s.mu.Lock()
		idle := !s.children && s.conns == 0 && len(s.waiters) == 0
		switch {
		case !idle:
			idleSince = time.Time{}
		case idleSince.IsZero():
			idleSince = time.Now()
		case time.Since(idleSince) >= s.idleExit && os.Getppid() == s.ppid:
			if s.closeLocked(0) {
				close(s.exit)
				s.mu.Unlock()
				return
			}
		}
		s.mu.Unlock()
	}
}

// closeLocked, with s.mu held, makes the supervisor exit if it is idle
// but for busy connections: under the starters' lock, so that no client
// starts a new supervisor whose socket this one's exit would remove. It
// reports whether it decided so now (the caller then closes s.exit).
func (s *server) closeLocked(busy int) bool {
	if s.closing || s.children || s.conns > busy || len(s.waiters) > 0 {
		return false
	}
	dir := filepath.Dir(s.ln.Addr().String())
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false
	}
	if unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		lock.Close()
		return false
	}
	s.closing = true
	s.ln.Close() // removes the socket file
	_ = os.Remove(lock.Name())
	_ = os.Remove(dir)
	removeEmptyRoot(filepath.Dir(dir))
	return true // the lock goes with the process
}

// removeEmptyRoot removes root, the directory the supervisor's socket
// directory is in, with every empty directory in it (the runtimes'
// state roots of the same data directory, left empty once their
// sandboxes are gone), if nothing else is left in it. Without it one
// such root per data directory ever used accumulated under /run/corral
// (over a thousand on a test host). It runs under the starters' lock
// with no supervisor serving, so no runtime create (they run only under
// a supervisor) can be making a sandbox in a root it removes; a root
// still holding a sandbox's state is not empty and stays.
func removeEmptyRoot(root string) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range ents {
		if e.IsDir() {
			_ = os.Remove(filepath.Join(root, e.Name())) // fails unless empty
		}
	}
	_ = os.Remove(root)
}

// handle serves one request on c.
func (s *server) handle(c *net.UnixConn) {
	enc := json.NewEncoder(c)
	if err := checkPeer(c); err != nil {
		_ = enc.Encode(reply{Error: err.Error()})
		return
	}
	req, out, err := readRequest(c)
	if err != nil {
		_ = enc.Encode(reply{Error: err.Error()})
		return
	}
	if out != nil {
		defer out.Close()
	}
	if req.ExitIfIdle {
		s.reap()
		s.mu.Lock()
		exits := s.closeLocked(1)
		s.mu.Unlock()
		_ = enc.Encode(reply{Exited: exits})
		if exits {
			close(s.exit)
		}
		return
	}
	ch, started, err := s.start(req, out)
	if err != nil {
		_ = enc.Encode(reply{Error: err.Error()})
		return
	}
	_ = enc.Encode(reply{})
	e := <-ch
	_ = enc.Encode(reply{Exited: true, Code: e.code, RanUS: max(e.at.Sub(started).Microseconds(), 0)})
}

// exit is how and when a command ended (when the reaper reaped it).
type exit struct {
	code int
	at   time.Time
}

// checkPeer refuses a client that is not the supervisor's own user. The
// supervisor runs commands as that user (root): anyone else who could
// reach the socket would get them run with its privileges. The socket's
// directory is private to that user too; this is the second lock.
func checkPeer(c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return cerr
	}
	if int(cred.Uid) != os.Geteuid() {
		return fmt.Errorf("peer uid %d refused", cred.Uid)
	}
	return nil
}

// readRequest reads the request and the output descriptor sent with it.
// A request is a 4-byte big-endian length and that many bytes of JSON
// (at most maxRequest), the descriptor attached to its first bytes; a
// stream socket may deliver it in several reads.
func readRequest(c *net.UnixConn) (request, *os.File, error) {
	var req request
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	head := make([]byte, 4<<10)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := c.ReadMsgUnix(head, oob)
	if err != nil {
		return req, nil, fmt.Errorf("read request: %w", err)
	}
	var out *os.File
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(msgs) != 1 {
			return req, nil, errors.New("bad control message")
		}
		fds, err := unix.ParseUnixRights(&msgs[0])
		if err != nil || len(fds) != 1 {
			for _, fd := range fds {
				unix.Close(fd)
			}
			return req, nil, errors.New("bad control message")
		}
		unix.CloseOnExec(fds[0])
		out = os.NewFile(uintptr(fds[0]), "output")
	}
	fail := func(err error) (request, *os.File, error) {
		if out != nil {
			out.Close()
		}
		return req, nil, err
	}
	head = head[:n]
	if len(head) < 4 {
		more := make([]byte, 4-len(head))
		if _, err := io.ReadFull(c, more); err != nil {
			return fail(fmt.Errorf("read request: %w", err))
		}
		head = append(head, more...)
	}
	size := int(binary.BigEndian.Uint32(head))
	if size > maxRequest || size < len(head)-4 {
		return fail(fmt.Errorf("bad request length %d", size))
	}
	body := make([]byte, size)
	got := copy(body, head[4:])
	if _, err := io.ReadFull(c, body[got:]); err != nil {
		return fail(fmt.Errorf("read request: %w", err))
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return fail(fmt.Errorf("bad request: %w", err))
	}
	switch {
	case req.ExitIfIdle && len(req.Argv) == 0:
		return fail(nil) // needs no descriptor; one sent is closed
	case req.ExitIfIdle || len(req.Argv) == 0:
		return fail(errors.New("bad request: a command or exit_if_idle"))
	case out == nil:
		return fail(errors.New("request without its output descriptor"))
	}
	return req, out, nil
}

// frame is body with the length prefix readRequest expects.
func frame(body []byte) []byte {
	b := make([]byte, 4, 4+len(body))
	binary.BigEndian.PutUint32(b, uint32(len(body)))
	return append(b, body...)
}

// start starts req's command with out as its stdout and stderr, in a
// process group of its own, and registers its waiter before the reaper
// can see it exit. started is when the process was made (just before it
// was forked).
func (s *server) start(req request, out *os.File) (ch chan exit, started time.Time, err error) {
	null, err := os.Open(os.DevNull)
	if err != nil {
		return nil, started, err
	}
	defer null.Close()
	dir := req.Dir
	if dir == "" {
		dir = "/"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	started = time.Now()
	p, err := os.StartProcess(req.Argv[0], req.Argv, &os.ProcAttr{
		Dir: dir, Env: req.Env, Files: []*os.File{null, out, out},
		Sys: &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		return nil, started, err
	}
	ch = make(chan exit, 1)
	s.waiters[p.Pid] = ch
	s.children = true
	_ = p.Release() // the reaper waits for it
	return ch, started, nil
}

// Command runs `supervisor --socket PATH [--idle-exit D]` with args
// after the subcommand and returns the process's exit code.
func Command(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("supervisor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sock := fs.String("socket", "", "unix socket to serve on")
	idle := fs.Duration("idle-exit", DefaultIdleExit, "exit after this long with nothing to reap and no client")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *sock == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "supervisor: usage: supervisor --socket PATH [--idle-exit D]")
		return 2
	}
	return Serve(*sock, *idle)
}
