package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/corralhq/corral/proto/agentproto"
	"github.com/corralhq/corral/proto/filesystem/filesystemconnect"
	"github.com/corralhq/corral/proto/process/processconnect"
)

// Config configures the agent.
type Config struct {
	// Socket is the unix socket path Main listens on.
	Socket string
	// DefaultUser is the user for requests that name none ("user" in
	// standard templates).
	DefaultUser string
	// TokenFile, when set, names a file whose content is the access token
	// required by every request but GET /health (see auth.go).
	TokenFile string
	// MaxUpload bounds the body of one POST /files request in bytes, after
	// decompression too. Zero means 100 MiB.
	MaxUpload int64
	// Subreaper makes the agent a child subreaper and reaps every child,
	// as it always does when it is PID 1. Without it (and not PID 1) only
	// the agent's own children are waited for.
	Subreaper bool
	// PasswdFile and GroupFile override /etc/passwd and /etc/group.
	PasswdFile, GroupFile string
	// Env is the sandbox-global environment passed to every process, as
	// KEY=VALUE. When nil it is taken from the agent's own environment:
	// each CORRAL_ENV_KEY=VALUE becomes KEY=VALUE.
	Env []string
	// Listen, when set, is a TCP address (host:port) Main serves on
	// instead of Socket: the agent of a Kubernetes Pod, reached at the
	// Pod IP. An agent on TCP refuses to start without a token.
	Listen string
	// BootstrapToken, when set, makes the agent wait for its sandbox: it
	// answers nothing but GET /health and one POST /init authenticated
	// with this token, which sets the sandbox's access token and
	// environment (init.go). Main takes it from the environment variable
	// CORRAL_AGENT_BOOTSTRAP_TOKEN and removes the variable.
	BootstrapToken string
	// CARoot is the directory agentproto.CAFile and CABundle are under
	// when POST /init installs the egress CA ("": /, the sandbox's root;
	// tests point it at a directory standing in for it).
	CARoot string
}

// Server is an agent instance: the process table, watchers and handlers.
type Server struct {
	cfg Config
	// mu guards token, env and bootstrap, which POST /init sets once.
	mu sync.RWMutex
	// token is the access token ("" for none); bootstrap is the token of
	// POST /init while the agent waits for its sandbox ("" once done or
	// when not in that mode).
	token, bootstrap string
	env              []string
	procs            *procTable
	watchers         *watcherTable
	idle             idleTrimmer
	// accounts caches the account files (see userCache).
	accounts userCache
}

const (
	defaultMaxUpload = 100 << 20
	maxRequestBytes  = 1 << 20
	maxPathLen       = 4096
	defaultPath      = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	envPrefix        = "CORRAL_ENV_"
)

// New validates cfg and returns a Server. It starts the process-wide child
// reaper (reaping every child when PID 1 or cfg.Subreaper).
func New(cfg Config) (*Server, error) {
	if cfg.DefaultUser == "" {
		cfg.DefaultUser = "user"
	}
	if cfg.MaxUpload <= 0 {
		cfg.MaxUpload = defaultMaxUpload
	}
	if cfg.PasswdFile == "" {
		cfg.PasswdFile = "/etc/passwd"
	}
	if cfg.GroupFile == "" {
		cfg.GroupFile = "/etc/group"
	}
	s := &Server{cfg: cfg, procs: newProcTable(), watchers: newWatcherTable()}
	if cfg.TokenFile != "" {
		b, err := os.ReadFile(cfg.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("agent: read token file: %w", err)
		}
		s.token = strings.TrimSpace(string(b))
		if s.token == "" {
			return nil, errors.New("agent: token file is empty")
		}
	}
	s.bootstrap = cfg.BootstrapToken
	if cfg.Env != nil {
		s.env = append([]string(nil), cfg.Env...)
	} else {
		s.env = sandboxEnv(os.Environ())
	}
	global := os.Getpid() == 1 || cfg.Subreaper
	if cfg.Subreaper && os.Getpid() != 1 {
		if err := setSubreaper(); err != nil {
			return nil, fmt.Errorf("agent: PR_SET_CHILD_SUBREAPER: %w", err)
		}
	}
	theReaper.start(global)
	return s, nil
}

// sandboxEnv extracts the sandbox-global environment from the agent's:
// CORRAL_ENV_FOO=bar becomes FOO=bar; nothing else is passed on.
func sandboxEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		if rest, ok := strings.CutPrefix(kv, envPrefix); ok && rest != "" && rest[0] != '=' {
			out = append(out, rest)
		}
	}
	return out
}

// Handler returns the agent's HTTP handler: both Connect services, /health
// and /files, behind the access-token check.
func (s *Server) Handler() http.Handler {
	// Small messages go uncompressed to a client that accepts gzip: its
	// per-message setup costs more than it saves on a command's events.
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(maxRequestBytes), connect.WithCompressMinBytes(1024)}
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(&processService{s: s}, opts...))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{s: s}, opts...))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /files", s.handleDownload)
	mux.HandleFunc("POST /files", s.handleUpload)
	mux.HandleFunc("GET "+agentproto.PortPath+"{port}", s.handlePort)
	mux.HandleFunc("POST "+agentproto.InitPath, s.handleInit)
	return s.idle.wrap(s.authMiddleware(s.asFileUser(mux)))
}

// Serve serves the agent on ln until ctx is done.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 30 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	<-errc
	return nil
}

// Main runs the agent: it makes itself non-dumpable, reads and removes
// the token file, listens on cfg.Socket (creating its directory,
// replacing a stale socket, mode 0600) and serves until ctx is done or, as
// PID 1, SIGTERM arrives, in which case every process in the sandbox is
// sent SIGTERM first.
func Main(ctx context.Context, cfg Config) error {
	// threat-model.md #6: code in the sandbox must not ptrace the agent.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("agent: PR_SET_DUMPABLE: %w", err)
	}
	if v, ok := os.LookupEnv(bootstrapEnv); ok {
		cfg.BootstrapToken = v
		os.Unsetenv(bootstrapEnv)
	}
	if cfg.Socket == "" && cfg.Listen == "" {
		return errors.New("agent: no socket path")
	}
	s, err := New(cfg)
	if err != nil {
		return err
	}
	if err := forgetTokenFile(cfg.TokenFile); err != nil {
		return err
	}
	if cfg.Listen != "" {
		ln, err := listenTCP(cfg)
		if err != nil {
			return err
		}
		return s.serveMain(ctx, ln, "")
	}
	if err := os.MkdirAll(filepath.Dir(cfg.Socket), 0o700); err != nil {
		return fmt.Errorf("agent: socket dir: %w", err)
	}
	if fi, err := os.Lstat(cfg.Socket); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("agent: %s exists and is not a socket", cfg.Socket)
		}
		if err := os.Remove(cfg.Socket); err != nil {
			return fmt.Errorf("agent: remove stale socket: %w", err)
		}
	}
	ln, err := net.Listen("unix", cfg.Socket)
	if err != nil {
		return fmt.Errorf("agent: listen: %w", err)
	}
	if err := os.Chmod(cfg.Socket, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("agent: chmod socket: %w", err)
	}

	return s.serveMain(ctx, ln, cfg.Socket)
}

// serveMain serves ln until ctx is done or, as PID 1, SIGTERM arrives
// (every process of the sandbox is sent SIGTERM first); it removes socket,
// when set, at the end.
func (s *Server) serveMain(ctx context.Context, ln net.Listener, socket string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigc)
	go func() {
		select {
		case <-sigc:
			if os.Getpid() == 1 {
				// kill(-1) reaches every process but the caller. Then wait
				// for them to finish: when PID 1 exits the kernel SIGKILLs
				// the rest, which would cut their grace period short. The
				// host SIGKILLs everything when its grace (3 s) runs out.
				_ = syscall.Kill(-1, syscall.SIGTERM)
				for others() {
					time.Sleep(10 * time.Millisecond)
				}
			}
			cancel()
		case <-ctx.Done():
		}
	}()
	// An agent idles most of its life, in every sandbox: a smaller heap
	// goal, and what start-up allocated and dropped goes back to the
	// host once it had no request for a moment (idle.go; after requests
	// it returns it in the same way).
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(idleGCPercent)
	}
	s.idle.arm(startTrimAfter)
	err := s.Serve(ctx, ln)
	if socket != "" {
		os.Remove(socket)
	}
	return err
}

// forgetTokenFile removes the token file once the token is read, before
// the agent listens and so before any code runs in the sandbox.
//
// The file lives in the sandbox's RunDir, where sandbox root could read it
// (`sudo cat /run/corral/token` printed the token) and, with it, sign
// /files URLs or call the sandbox's envd routes on the control plane as
// its owner. Once removed, the token exists in the sandbox only in the
// agent's memory, which sandbox root cannot read: the agent is
// non-dumpable and sandbox root has no CAP_SYS_PTRACE.
// TestAgentTokenNotReadable is the regression test.
func forgetTokenFile(path string) error {
	if path == "" {
		return nil
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("agent: remove token file: %w", err)
	}
	return nil
}

// others reports whether any process but the caller is visible in /proc
// (in the sandbox's pid namespace: any other process of the sandbox).
func others() bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	self := strconv.Itoa(os.Getpid())
	for _, e := range ents {
		name := e.Name()
		if name[0] < '0' || name[0] > '9' || name == self {
			continue
		}
		// Zombies are reaped by the reaper; skip them.
		if b, err := os.ReadFile("/proc/" + name + "/stat"); err == nil {
			if i := strings.LastIndexByte(string(b), ')'); i > 0 && i+2 < len(b) && b[i+2] == 'Z' {
				continue
			}
		}
		return true
	}
	return false
}
