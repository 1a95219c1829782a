package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	pb "github.com/corralhq/corral/proto/process"
)

const (
	maxArgs      = 1024
	maxArgsBytes = 256 << 10
	maxEnvs      = 256
)

// spawnSpec is a validated start request.
type spawnSpec struct {
	argv0    string
	argv     []string
	env      []string
	dir      string
	user     *user
	pty      *pb.PTY
	stdin    bool
	tag      string
	config   *pb.ProcessConfig
	deadline time.Time // zero: no lifetime limit
}

// prepare validates a StartRequest for user u and resolves cmd, env and cwd.
func (s *Server) prepare(req *pb.StartRequest, u *user) (*spawnSpec, error) {
	cfg := req.GetProcess()
	if cfg == nil || cfg.GetCmd() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	if len(cfg.GetArgs()) > maxArgs {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("too many args (%d > %d)", len(cfg.GetArgs()), maxArgs))
	}
	total := len(cfg.GetCmd())
	for _, a := range cfg.GetArgs() {
		total += len(a) + 1
	}
	if total > maxArgsBytes {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("args too long (%d > %d bytes)", total, maxArgsBytes))
	}
	if len(cfg.GetEnvs()) > maxEnvs {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("too many envs (%d > %d)", len(cfg.GetEnvs()), maxEnvs))
	}
	for k := range cfg.GetEnvs() {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("invalid env name %q", k))
		}
	}
	if len(cfg.GetCmd()) > maxPathLen {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("cmd too long"))
	}

	var dir string
	if cfg.Cwd != nil && cfg.GetCwd() != "" {
		d, err := rpcPath(cfg.GetCwd(), u)
		if err != nil {
			return nil, err
		}
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd '%s' does not exist", d))
		}
		dir = d
	} else if fi, err := os.Stat(u.Home); err == nil && fi.IsDir() {
		dir = u.Home
	} else {
		// A home that does not exist (images without one) is not the
		// caller's mistake: start in /.
		dir = "/"
	}

	env := s.processEnv(u, cfg.GetEnvs())
	argv0, err := lookPath(cfg.GetCmd(), envValue(env, "PATH"), dir)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	return &spawnSpec{
		argv0:  argv0,
		argv:   append([]string{cfg.GetCmd()}, cfg.GetArgs()...),
		env:    env,
		dir:    dir,
		user:   u,
		pty:    req.Pty,
		stdin:  req.Stdin == nil || req.GetStdin(),
		tag:    req.GetTag(),
		config: cfg,
	}, nil
}

// processEnv builds a process environment: PATH, HOME, USER, LOGNAME, then
// the sandbox-global env, then the request's envs; later entries win.
func (s *Server) processEnv(u *user, req map[string]string) []string {
	path := os.Getenv("PATH")
	if path == "" {
		path = defaultPath
	}
	var keys []string
	vals := map[string]string{}
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			keys = append(keys, k)
		}
		vals[k] = v
	}
	set("PATH", path)
	set("HOME", u.Home)
	set("USER", u.Name)
	set("LOGNAME", u.Name)
	for _, kv := range s.sandboxEnv() {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			set(k, v)
		}
	}
	reqKeys := make([]string, 0, len(req))
	for k := range req {
		reqKeys = append(reqKeys, k)
	}
	sort.Strings(reqKeys)
	for _, k := range reqKeys {
		set(k, req[k])
	}
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, k+"="+vals[k])
	}
	return out
}

func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}

// lookPath finds cmd in the child's PATH (not the agent's).
func lookPath(cmd, path, dir string) (string, error) {
	isExec := func(p string) bool {
		fi, err := os.Stat(p)
		return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
	}
	if strings.Contains(cmd, "/") {
		p := cmd
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if isExec(p) {
			return p, nil
		}
		return "", fmt.Errorf("executable '%s' not found", cmd)
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, cmd)
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if isExec(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("executable '%s' not found in PATH", cmd)
}

// spawn starts the process described by sp with sub already attached, so no
// output is missed, and returns it registered in the table.
func (s *Server) spawn(sp *spawnSpec, sub *subscriber) (*proc, error) {
	p := &proc{
		tag:       sp.tag,
		config:    sp.config,
		isPTY:     sp.pty != nil,
		subs:      map[*subscriber]struct{}{sub: {}},
		finished:  make(chan struct{}),
		oomBefore: oomKills(),
	}
	var childFiles []*os.File // closed in the parent after fork
	defer func() {
		for _, f := range childFiles {
			f.Close()
		}
	}()
	var chunk int
	var wraps []func([]byte) *pb.ProcessEvent_DataEvent
	var ownedReaders []*os.File // the output pipes (or PTY master), read by the pumps
	var fds []uintptr
	sys := &syscall.SysProcAttr{
		Setsid: true,
		Credential: &syscall.Credential{
			Uid:    sp.user.UID,
			Gid:    sp.user.GID,
			Groups: sp.user.Groups,
		},
	}

	if sp.pty != nil {
		master, tty, err := pty.Open()
		if err != nil {
			return nil, fmt.Errorf("open pty: %w", err)
		}
		childFiles = append(childFiles, tty)
		size := sp.pty.GetSize()
		if size.GetCols() > 0 && size.GetRows() > 0 {
			_ = pty.Setsize(master, &pty.Winsize{Cols: uint16(size.GetCols()), Rows: uint16(size.GetRows())})
		}
		m, err := pollable(master)
		if err != nil {
			return nil, err
		}
		p.ptmx = m
		ownedReaders = append(ownedReaders, m)
		chunk = ptyChunk
		wraps = append(wraps, func(b []byte) *pb.ProcessEvent_DataEvent {
			return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Pty{Pty: b}}
		})
		fd := tty.Fd()
		fds = []uintptr{fd, fd, fd}
		sys.Setctty = true
		sys.Ctty = 0
	} else {
		if sp.stdin {
			r, w, err := os.Pipe()
			if err != nil {
				return nil, err
			}
			childFiles = append(childFiles, r)
			p.stdin = w
			fds = []uintptr{r.Fd()}
		} else {
			fd, err := devNullFD()
			if err != nil {
				return nil, err
			}
			fds = []uintptr{fd}
		}
		for _, wrap := range []func([]byte) *pb.ProcessEvent_DataEvent{
			func(b []byte) *pb.ProcessEvent_DataEvent {
				return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: b}}
			},
			func(b []byte) *pb.ProcessEvent_DataEvent {
				return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stderr{Stderr: b}}
			},
		} {
			r, w, err := os.Pipe()
			if err != nil {
				closeAll(ownedReaders)
				if p.stdin != nil {
					p.stdin.Close()
				}
				return nil, err
			}
			childFiles = append(childFiles, w)
			ownedReaders = append(ownedReaders, r)
			wraps = append(wraps, wrap)
			fds = append(fds, w.Fd())
		}
		chunk = pipeChunk
	}

	attr := &syscall.ProcAttr{Dir: sp.dir, Env: sp.env, Files: fds, Sys: sys}
	pid, waitc, err := theReaper.forkExec(sp.argv0, sp.argv, attr)
	if err != nil {
		closeAll(ownedReaders)
		if p.stdin != nil {
			p.stdin.Close()
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("start %s: %w", sp.argv[0], err))
	}
	p.pid = pid
	// Make sandbox code the OOM killer's first choice, not the agent.
	setOOMScoreAdj(pid)
	if !sp.deadline.IsZero() {
		p.timer = time.AfterFunc(time.Until(sp.deadline), p.timeout)
	}
	s.procs.add(p)

	var wg sync.WaitGroup
	for i, r := range ownedReaders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.pump(r, chunk, wraps[i])
		}()
	}
	go func() {
		ws := <-waitc
		if p.timer != nil {
			p.timer.Stop()
		}
		// Output written just before exit is still in the pipes: the
		// pumps read it to EOF, however slow the consumer, but do not
		// wait forever on descendants that inherited the pipes (pump:
		// drainGrace of silence, drainMax bytes). A pump blocked in a
		// read is woken by the deadline set here.
		p.exited.Store(true)
		for _, r := range ownedReaders {
			_ = r.SetReadDeadline(time.Now().Add(drainGrace))
		}
		wg.Wait()
		closeAll(ownedReaders)
		_ = p.closeStdin()
		p.finish(p.buildEnd(ws))
		s.procs.retire(p)
	}()
	return p, nil
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// pollable re-opens f's descriptor in non-blocking mode so that reads go
// through the runtime poller and Close interrupts a blocked Read.
func pollable(f *os.File) (*os.File, error) {
	defer f.Close()
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// devNullFD is /dev/null opened once for reading: the stdin of every
// process started without one (ForkExec dups it onto the child's fd 0).
var devNullFD = sync.OnceValues(func() (uintptr, error) {
	fd, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: os.DevNull, Err: err}
	}
	return uintptr(fd), nil
})

// setOOMScoreAdj makes process pid the OOM killer's first choice before
// the agent (oom_score_adj 100), with plain system calls: the file needs
// no buffering and no poller registration.
func setOOMScoreAdj(pid int) {
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	_, _ = unix.Write(fd, []byte("100"))
	unix.Close(fd)
}
