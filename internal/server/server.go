// Package server wires corral's parts into the running control plane:
// data directory, store, admin key, base template, runtime driver,
// sandbox manager and the HTTP API.
package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/corralhq/corral/internal/api"
	"github.com/corralhq/corral/internal/runtime/oci"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template"
)

// Defaults for `corral serve`.
const (
	DefaultListen  = "127.0.0.1:7420"
	DefaultDataDir = "/var/lib/corral"
)

// Config is the server's configuration.
type Config struct {
	// Listen is the HTTP address (default 127.0.0.1:7420).
	Listen string
	// DataDir holds the database, admin key, templates and sandbox state.
	DataDir string
	// TemplateCache holds template builds (default /var/cache/corral/templates).
	TemplateCache string
	// MaxOutput bounds stdout/stderr returned by exec (default 1 MiB each).
	MaxOutput int
	// MaxSandboxes caps running sandboxes (default 50).
	MaxSandboxes int
	// KillGrace is the time between SIGTERM and SIGKILL when a sandbox is
	// killed (default 3 s).
	KillGrace time.Duration
	// KillOnShutdown kills every sandbox when the server stops; otherwise
	// they keep running and the next start adopts them.
	KillOnShutdown bool
	// AgentBinary is the static corral binary run as each sandbox's agent
	// (default: the running executable).
	AgentBinary string
	// Progress receives the base template build's progress display.
	Progress io.Writer
	// Log is the server's logger.
	Log *slog.Logger
}

// Validate fills defaults and checks the configuration.
func (c *Config) Validate() error {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.MaxOutput < 0 || c.MaxSandboxes < 0 || c.KillGrace < 0 || c.KillGrace > time.Minute {
		return errors.New("max-output and max-sandboxes must not be negative; kill-grace must be 0..1m")
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("listen address %q: %w", c.Listen, err)
	}
	abs, err := filepath.Abs(c.DataDir)
	if err != nil {
		return err
	}
	c.DataDir = abs
	return nil
}

// Server is a started control plane.
type Server struct {
	cfg     Config
	Store   *store.Store
	Manager *sandbox.Manager
	Handler http.Handler
	// AdminKey is the admin API key.
	AdminKey string

	templates templateSource
}

// Open prepares everything but the listener: it creates the data dir,
// opens the store, ensures the admin key and base template, and
// reconciles sandboxes left from a previous run.
func Open(ctx context.Context, cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o711); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	if err := os.Chmod(cfg.DataDir, 0o711); err != nil {
		return nil, err
	}
	st, err := store.Open(filepath.Join(cfg.DataDir, "corral.db"))
	if err != nil {
		return nil, err
	}
	key, err := ensureAdminKey(ctx, st, filepath.Join(cfg.DataDir, "admin.key"))
	if err != nil {
		st.Close()
		return nil, err
	}
	tmpl, err := ensureBase(ctx, cfg)
	if err != nil {
		st.Close()
		return nil, err
	}
	agentBin, err := installAgent(cfg.AgentBinary, cfg.DataDir)
	if err != nil {
		st.Close()
		return nil, err
	}
	drv, err := oci.New(oci.Options{StateDir: filepath.Join(cfg.DataDir, "sandboxes"), AgentBinary: agentBin})
	if err != nil {
		st.Close()
		return nil, err
	}
	mgr := sandbox.New(sandbox.Config{MaxSandboxes: cfg.MaxSandboxes, KillGrace: cfg.KillGrace}, st, drv, templateSource{tmpl}, cfg.Log)
	if err := mgr.Reconcile(ctx); err != nil {
		mgr.Shutdown(ctx, false)
		st.Close()
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	h := api.New(api.Config{MaxOutput: cfg.MaxOutput}, mgr, st, cfg.Log)
	return &Server{cfg: cfg, Store: st, Manager: mgr, Handler: h, AdminKey: key, templates: templateSource{tmpl}}, nil
}

// Close stops the manager (killing sandboxes if configured) and the store.
func (s *Server) Close(ctx context.Context) error {
	s.Manager.Shutdown(ctx, s.cfg.KillOnShutdown)
	return s.Store.Close()
}

// Run serves until ctx is done, then shuts down gracefully.
func Run(ctx context.Context, cfg Config) error {
	s, err := Open(ctx, cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		s.Close(context.Background())
		return fmt.Errorf("listen: %w", err)
	}
	hs := &http.Server{Handler: s.Handler, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	s.cfg.Log.Info("corral serving", "listen", ln.Addr().String(), "data", s.cfg.DataDir)
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	if cerr := s.Close(sctx); err == nil {
		err = cerr
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// ensureAdminKey reads DIR/admin.key or creates it (mode 0600), and makes
// sure the store accepts it. Keys have E2B's shape: e2b_ + 40 hex.
func ensureAdminKey(ctx context.Context, st *store.Store, path string) (string, error) {
	b, err := os.ReadFile(path)
	key := strings.TrimSpace(string(b))
	if errors.Is(err, os.ErrNotExist) || key == "" {
		buf := make([]byte, 20)
		if _, err := rand.Read(buf); err != nil {
			return "", err
		}
		key = "e2b_" + hex.EncodeToString(buf)
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return "", fmt.Errorf("write admin key: %w", err)
		}
		if _, err := f.WriteString(key + "\n"); err != nil {
			f.Close()
			return "", fmt.Errorf("write admin key: %w", err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return "", err
		}
		f.Close()
	} else if err != nil {
		return "", fmt.Errorf("read admin key: %w", err)
	}
	if err := st.AddAPIKey(ctx, "admin", key); err != nil {
		return "", err
	}
	return key, nil
}

// ensureBase registers the base template, building it (cached by
// content) when it is missing.
func ensureBase(ctx context.Context, cfg Config) (*template.Store, error) {
	ts, err := template.OpenStore(filepath.Join(cfg.DataDir, "templates"))
	if err != nil {
		return nil, err
	}
	if _, err := ts.Resolve("base"); err == nil {
		return ts, nil
	}
	t, err := template.BuildBase(ctx, cfg.TemplateCache, template.BaseOptions{Progress: cfg.Progress})
	if err != nil {
		return nil, err
	}
	if err := ts.Register("base", t.Dir); err != nil {
		return nil, err
	}
	return ts, nil
}

// installAgent copies the running (static) binary into the data dir, from
// where it is bind-mounted read-only into sandboxes. The copy lives on a
// path sandbox root can traverse, unlike a binary under /root.
func installAgent(bin, dataDir string) (string, error) {
	if bin == "" {
		self, err := os.Executable()
		if err != nil {
			return "", err
		}
		bin = self
	}
	return InstallAgentBinary(bin, dataDir)
}

// InstallAgentBinary copies bin to DATA/bin/corral-agent (atomically).
func InstallAgentBinary(bin, dataDir string) (string, error) {
	dir := filepath.Join(dataDir, "bin")
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", err
	}
	src, err := os.Open(bin)
	if err != nil {
		return "", fmt.Errorf("agent binary: %w", err)
	}
	defer src.Close()
	tmp, err := os.CreateTemp(dir, ".agent-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, src); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	dst := filepath.Join(dir, "corral-agent")
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", err
	}
	return dst, nil
}

type templateSource struct{ s *template.Store }

func (t templateSource) RootFS(name string) (string, error) {
	tm, err := t.s.Resolve(name)
	if err != nil {
		if errors.Is(err, template.ErrNotFound) {
			return "", errors.New("no such template")
		}
		return "", errors.New("template unavailable")
	}
	return tm.RootFS, nil
}

// TemplateRootFS returns the rootfs directory of a registered template.
func (s *Server) TemplateRootFS(name string) (string, error) {
	return s.templates.RootFS(name)
}
