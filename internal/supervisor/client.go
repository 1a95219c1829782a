package supervisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Client runs commands under the supervisor of one socket, starting the
// supervisor when none serves it.
type Client struct {
	// Socket is the supervisor's unix socket. Its directory is made
	// private to the caller's user (mode 0700).
	Socket string
	// Binary is the corral binary, run as `Binary supervisor --socket
	// Socket` when no supervisor serves the socket.
	Binary string
}

// Run runs argv under the supervisor with out as its stdout and stderr
// and returns its exit code once it exited. The command keeps running
// if ctx ends first (the caller gets ctx's error); the supervisor reaps
// it.
func (c *Client) Run(ctx context.Context, argv []string, out *os.File) (int, error) {
	code, _, err := c.RunTimed(ctx, argv, out)
	return code, err
}

// RunTimed is Run that also returns how long the command ran, from its
// start to its exit as the supervisor saw them (0 when it did not say):
// the rest of the time Run took is the supervisor's.
func (c *Client) RunTimed(ctx context.Context, argv []string, out *os.File) (int, time.Duration, error) {
	wd, _ := os.Getwd()
	body, err := json.Marshal(request{Argv: argv, Env: os.Environ(), Dir: wd})
	if err != nil {
		return 0, 0, err
	}
	if len(body) > maxRequest {
		return 0, 0, errors.New("supervisor request too large")
	}
	// A supervisor that was just exiting closes the connection before it
	// starts anything: then a new one is started and asked again.
	for attempt := 0; ; attempt++ {
		r, started, err := c.run(ctx, body, out)
		if started || attempt == 2 || ctx.Err() != nil {
			return r.Code, time.Duration(r.RanUS) * time.Microsecond, err
		}
	}
}

// run sends one request; started says whether the command started.
func (c *Client) run(ctx context.Context, body []byte, out *os.File) (r reply, started bool, err error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return r, false, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	if _, _, err := conn.WriteMsgUnix(frame(body), unix.UnixRights(int(out.Fd())), nil); err != nil {
		return r, false, fmt.Errorf("supervisor request: %w", err)
	}
	dec := json.NewDecoder(bufio.NewReader(conn))
	if err := dec.Decode(&r); err != nil {
		return reply{}, false, fmt.Errorf("supervisor: %w", err)
	}
	if r.Error != "" {
		return reply{}, true, fmt.Errorf("supervisor: %s", r.Error)
	}
	if err := dec.Decode(&r); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return reply{}, true, fmt.Errorf("supervisor: wait for the command to exit: %w", err)
	}
	return r, true, nil
}

// Close asks the supervisor to exit if it has nothing to reap and no
// other client: a control plane that closes calls it, so that an idle
// supervisor does not outlive it (orphaned, it would stay). One that
// still reaps sandboxes stays. No supervisor running is not an error.
func (c *Client) Close() error {
	_, err := c.exitIfIdle()
	return err
}

// CloseWait is Close for a caller that holds no sandbox: it asks again
// until the supervisor exits or wait passed, as the processes of the
// sandboxes just stopped may not all be reaped yet.
func (c *Client) CloseWait(wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		exited, err := c.exitIfIdle()
		if err != nil || exited || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exitIfIdle sends the request once; exited is true if the supervisor
// exits or none runs.
func (c *Client) exitIfIdle() (exited bool, err error) {
	conn, err := c.connect()
	if err != nil {
		return true, nil
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write(frame([]byte(`{"exit_if_idle":true}`))); err != nil {
		return false, fmt.Errorf("supervisor: %w", err)
	}
	var r reply
	if err := json.NewDecoder(conn).Decode(&r); err != nil {
		return false, fmt.Errorf("supervisor: %w", err)
	}
	if r.Error != "" {
		return false, fmt.Errorf("supervisor: %s", r.Error)
	}
	return r.Exited, nil
}

// dial connects to the supervisor, starting it if none answers.
func (c *Client) dial(ctx context.Context) (*net.UnixConn, error) {
	if conn, err := c.connect(); err == nil {
		return conn, nil
	}
	// One starter at a time: two control planes (or two driver
	// instances) must not start two supervisors on one socket.
	lock, err := c.lock()
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if conn, err := c.connect(); err == nil {
		return conn, nil
	}
	cmd := exec.Command(c.Binary, "supervisor", "--socket", c.Socket)
	// Its own session: no terminal signal or process-group kill of the
	// control plane reaches it, and it outlives the control plane.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start supervisor: %w", err)
	}
	// Reaped here when it exits while this process lives.
	go func() { _ = cmd.Wait() }()
	delay := time.Millisecond
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := c.connect()
		if err == nil {
			return conn, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("supervisor did not start: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
		if delay < 20*time.Millisecond {
			delay *= 2
		}
	}
}

// lock takes the starters' lock of the socket's directory (making the
// directory when missing) and returns it held. A supervisor that exits,
// or a Prune, removes the lock file and the directory while holding the
// lock; a starter that got the lock of a file removed meanwhile tries
// again, so that it never starts a supervisor in a directory that is
// gone.
func (c *Client) lock() (*os.File, error) {
	dir := filepath.Dir(c.Socket)
	path := filepath.Join(dir, "lock")
	for attempt := 0; ; attempt++ {
		if err := privateDir(dir); err != nil {
			return nil, err
		}
		lock, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, fmt.Errorf("supervisor lock: %w", err)
		}
		if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
			lock.Close()
			return nil, fmt.Errorf("supervisor lock: %w", err)
		}
		var held, named unix.Stat_t
		if unix.Fstat(int(lock.Fd()), &held) == nil && unix.Lstat(path, &named) == nil &&
			held.Dev == named.Dev && held.Ino == named.Ino {
			return lock, nil
		}
		lock.Close()
		if attempt == 100 {
			return nil, errors.New("supervisor lock: its file keeps being removed")
		}
	}
}

// Prune removes the directory of the socket's directory (the state root
// a data directory's supervisor shares with its runtimes' roots) when no
// supervisor serves the socket and nothing but empty directories is
// left in it, as an exiting supervisor does (removeEmptyRoot). A control
// plane prunes the roots of other data directories at start, so that
// the roots of supervisors that never ran or were killed do not
// accumulate. It holds the starters' lock meanwhile: no supervisor
// starts, so no runtime create (they run only under a supervisor) makes
// a sandbox in a root it removes; a root holding a sandbox's state is
// not empty and stays.
func (c *Client) Prune() error {
	root := filepath.Dir(filepath.Dir(c.Socket))
	if _, err := os.Lstat(root); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if conn, err := c.connect(); err == nil {
		conn.Close()
		return nil
	}
	lock, err := c.lock()
	if err != nil {
		return err
	}
	defer lock.Close()
	if conn, err := c.connect(); err == nil {
		conn.Close()
		return nil
	}
	dir := filepath.Dir(c.Socket)
	_ = os.Remove(c.Socket) // a killed supervisor's
	_ = os.Remove(lock.Name())
	_ = os.Remove(dir)
	removeEmptyRoot(root)
	return nil
}

func (c *Client) connect() (*net.UnixConn, error) {
	return net.DialUnix("unix", nil, &net.UnixAddr{Name: c.Socket, Net: "unix"})
}

// privateDir makes dir (and its parents) and checks that it is a real
// directory of this user that nobody else may enter: the supervisor runs
// whatever reaches its socket, so the socket must not be reachable by
// anyone else.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("supervisor dir: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("supervisor dir: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("supervisor dir %s is not a directory of uid %d", dir, os.Geteuid())
	}
	if st.Mode&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("supervisor dir: %w", err)
		}
	}
	return nil
}
