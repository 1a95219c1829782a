// Package pgtest starts throw-away PostgreSQL servers for tests: a new
// cluster (initdb) in a temporary directory, a postgres server listening
// on 127.0.0.1 only, on a free port, with a random password, as an
// unprivileged user (the "postgres" system user when the test runs as
// root: postgres refuses to run as root). It never touches the system's
// own cluster. The server is a child of the test process that gets
// SIGQUIT (immediate shutdown) if the test process dies, so a killed or
// timed-out test binary leaves no server running.
//
// Packages share one server per test binary with [Shared] and [Main]:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
//	func TestX(t *testing.T) { url := pgtest.Shared(t).NewDatabase(t) ... }
package pgtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// BinDir holds Debian's PostgreSQL 15 server binaries (package
// postgresql, which `make deps` installs).
const BinDir = "/usr/lib/postgresql/15/bin"

// User is the database superuser of the servers this package starts.
const User = "corral"

// RunAs is the system user the server runs as when the test runs as
// root.
const RunAs = "postgres"

// startTimeout bounds initdb plus the server's start; stopTimeout its
// shutdown.
const (
	startTimeout = 2 * time.Minute
	stopTimeout  = time.Minute
)

// Options are a server's settings.
type Options struct {
	// Durable keeps PostgreSQL's crash safety (fsync, synchronous
	// commit, full page writes), as a production server has it. Off,
	// commits are not flushed to disk: faster tests, same semantics
	// while the machine does not crash.
	Durable bool
}

// Server is a running test server.
type Server struct {
	dir      string
	port     int
	cred     *syscall.Credential
	opts     Options
	password string
	cmd      *exec.Cmd
	exited   chan struct{}
	log      *lockedBuffer
	n        atomic.Int64
	stopOnce sync.Once
	stopErr  error
}

// Unavailable returns why this package cannot start a server here, or ""
// when it can.
func Unavailable() string {
	for _, b := range []string{"initdb", "postgres"} {
		if _, err := os.Stat(filepath.Join(BinDir, b)); err != nil {
			return fmt.Sprintf("PostgreSQL 15 is not installed (%s: %v; apt-get install postgresql)", filepath.Join(BinDir, b), err)
		}
	}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup(RunAs); err != nil {
			return fmt.Sprintf("running as root and there is no %q user to run PostgreSQL as: %v", RunAs, err)
		}
	}
	return ""
}

// Start makes a new cluster and starts its server. Stop it with
// [Server.Stop].
func Start(opts Options) (*Server, error) {
	if why := Unavailable(); why != "" {
		return nil, errors.New(why)
	}
	var cred *syscall.Credential
	uid, gid := -1, -1
	if os.Geteuid() == 0 {
		u, err := user.Lookup(RunAs)
		if err != nil {
			return nil, err
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
	}
	dir, err := os.MkdirTemp(tempBase(uid >= 0), "corral-pgtest-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, password: randomHex(16), log: &lockedBuffer{}, cred: cred, opts: opts}
	fail := func(err error) (*Server, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	pwfile := filepath.Join(dir, "pw")
	if err := os.WriteFile(pwfile, []byte(s.password+"\n"), 0o600); err != nil {
		return fail(err)
	}
	if uid >= 0 {
		for _, p := range []string{dir, pwfile} {
			if err := os.Chown(p, uid, gid); err != nil {
				return fail(err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	initdb := exec.CommandContext(ctx, filepath.Join(BinDir, "initdb"), "-D", s.data(), "-U", User, "--pwfile="+pwfile,
		"--auth=scram-sha-256", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.Dir, initdb.Env = dir, env()
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %w\n%s", err, out))
	}
	os.Remove(pwfile)
	// A port that was free a moment ago may be taken by the time the
	// server binds it: try a few.
	for attempt := 0; ; attempt++ {
		if err = s.start(ctx, 0); err == nil {
			return s, nil
		}
		if attempt == 4 || !strings.Contains(s.log.String(), "could not bind") {
			return fail(err)
		}
	}
}

// tempBase is where the cluster's directory is made: the temporary
// directory, unless another user (the server's, when the test runs as
// root) cannot reach it (a TMPDIR under /root): then /tmp.
func tempBase(otherUser bool) string {
	base := os.TempDir()
	if !otherUser {
		return base
	}
	for d := base; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return "/tmp"
		}
		if d == "/" {
			return base
		}
	}
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

func env() []string {
	return []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", "LANG=C", "TZ=UTC"}
}

// start starts the server on port (0: a free one).
func (s *Server) start(ctx context.Context, port int) error {
	if port == 0 {
		var err error
		if port, err = freePort(); err != nil {
			return err
		}
	}
	s.port = port
	cred, opts := s.cred, s.opts
	args := []string{"-D", s.data(), "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
		"-c", "max_connections=200", "-c", "shared_buffers=32MB", "-c", "logging_collector=off"}
	if !opts.Durable {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	s.log.Reset()
	cmd := exec.Command(filepath.Join(BinDir, "postgres"), args...)
	cmd.Dir, cmd.Env = s.dir, env()
	cmd.Stdout, cmd.Stderr = s.log, s.log
	// SIGQUIT is PostgreSQL's immediate shutdown: the server and its
	// backends exit when the test process does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	go func() { cmd.Wait(); close(s.exited) }()
	for {
		c, err := pgx.Connect(ctx, s.URL("postgres"))
		if err == nil {
			c.Close(ctx)
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("postgres exited while starting: %s", s.log.String())
		case <-ctx.Done():
			s.kill()
			return fmt.Errorf("postgres did not accept connections within %v (last: %v): %s", startTimeout, err, s.log.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// Port is the server's TCP port on 127.0.0.1.
func (s *Server) Port() int { return s.port }

// URL is the address of database db, for pgx and corral's --store.
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s?sslmode=disable", User, s.password, s.port, db)
}

// CreateDatabase creates an empty database called name.
func (s *Server) CreateDatabase(ctx context.Context, name string) error {
	return s.admin(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize())
}

// DropDatabase drops database name, closing its connections.
func (s *Server) DropDatabase(ctx context.Context, name string) error {
	return s.admin(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`)
}

func (s *Server) admin(ctx context.Context, q string) error {
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, q)
	return err
}

// NewDatabase creates a new, empty database for tb, dropped when tb
// ends, and returns its URL.
func (s *Server) NewDatabase(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("t%d", s.n.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.CreateDatabase(ctx, name); err != nil {
		tb.Fatalf("pgtest: create database: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.DropDatabase(ctx, name); err != nil {
			tb.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	return s.URL(name)
}

// Restart shuts the server down (fast shutdown: open transactions are
// rolled back, connections closed) and starts it again on the same port
// with the same cluster, as an operator's restart or a failover would.
func (s *Server) Restart() error {
	if err := s.Halt(); err != nil {
		return err
	}
	return s.Resume()
}

// Halt shuts the server down (fast shutdown) and keeps its cluster:
// until [Server.Resume], connections are refused, as while a production
// server restarts or fails over.
func (s *Server) Halt() error {
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.exited:
		return nil
	case <-time.After(stopTimeout):
		s.kill()
		return fmt.Errorf("postgres did not stop within %v: killed", stopTimeout)
	}
}

// Resume starts a halted server again on its port.
func (s *Server) Resume() error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	return s.start(ctx, s.port)
}

// Stop shuts the server down (fast shutdown: open transactions are
// rolled back) and removes its directory.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		_ = s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.exited:
		case <-time.After(stopTimeout):
			s.kill()
			s.stopErr = fmt.Errorf("postgres did not stop within %v: killed", stopTimeout)
		}
		if err := os.RemoveAll(s.dir); err != nil && s.stopErr == nil {
			s.stopErr = err
		}
	})
	return s.stopErr
}

var (
	mainUsed   atomic.Bool
	sharedOnce sync.Once
	shared     *Server
	sharedErr  error
)

// Main runs a package's tests and then stops the server that [Shared]
// started, if any. Call it from TestMain.
func Main(m *testing.M) int {
	mainUsed.Store(true)
	code := m.Run()
	if shared != nil {
		if err := shared.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// Shared returns the test binary's server, starting it on first use. It
// skips tb when PostgreSQL is not installed and the test does not run as
// root; as root (make test, which installs it) that is a failure.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	if !mainUsed.Load() {
		tb.Fatal("pgtest.Shared needs func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) } in the package (to stop the server)")
	}
	if why := Unavailable(); why != "" {
		if os.Geteuid() == 0 {
			tb.Fatalf("pgtest: %s (make test installs it)", why)
		}
		tb.Skipf("pgtest: %s", why)
	}
	sharedOnce.Do(func() { shared, sharedErr = Start(Options{}) })
	if sharedErr != nil {
		tb.Fatalf("pgtest: %v", sharedErr)
	}
	return shared
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// lockedBuffer keeps the server's log (bounded: the last logLimit
// bytes).
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

const logLimit = 64 << 10

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.Write(p)
	if l.b.Len() > logLimit {
		rest := l.b.Bytes()[l.b.Len()-logLimit/2:]
		l.b = *bytes.NewBuffer(append([]byte(nil), rest...))
	}
	return len(p), nil
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *lockedBuffer) Reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.Reset()
}

// Password is the password of [User] (for PGPASSWORD, a URL without one).
func (s *Server) Password() string { return s.password }
