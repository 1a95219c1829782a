// Package testserver starts a real corral control plane in-process for the
// integration tests and benchmarks: the static corral binary built from
// this checkout as the sandbox agent, a fresh data directory, the cached
// base template, and an HTTP server on 127.0.0.1.
package testserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/idrange"
	"github.com/corralhq/corral/internal/server"
	"github.com/corralhq/corral/internal/watchdog"
)

// Server is a running test control plane.
type Server struct {
	// Bin is the static corral binary (the CLI; it can serve as agent
	// and supervisor too).
	Bin string
	// AgentBin is the lean agent binary (cmd/corral-agent) the server
	// runs as each sandbox's agent and as the sandboxes' supervisor.
	AgentBin string
	// Tmp is the scratch directory holding Bin and DataDir.
	Tmp string
	// DataDir is the server's data directory.
	DataDir string
	// URL and Key reach the API.
	URL, Key string
	// Srv is the control plane.
	Srv  *server.Server
	http *httptest.Server
}

// Missing names what this machine lacks to run sandboxes, or "".
func Missing() string {
	if os.Geteuid() != 0 {
		return "needs root (namespaces, mounts, cgroups)"
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return "runc is not installed (apt-get install runc)"
	}
	return ""
}

// Start builds corral from cmdDir (the path of ./cmd/corral relative to
// the caller's package) and starts a server with logs at level.
func Start(cmdDir string, level slog.Level) (*Server, error) {
	return StartWith(cmdDir, level, nil)
}

// StartWith is Start with a hook that adjusts the server's configuration
// (egress resolver, caps, log destination) before it opens.
func StartWith(cmdDir string, level slog.Level, configure func(*server.Config)) (*Server, error) {
	tmp, err := os.MkdirTemp("", "corral-test-")
	if err != nil {
		return nil, err
	}
	// Sandbox root (an unprivileged host uid) must traverse to its rootfs.
	if err := os.Chmod(tmp, 0o711); err != nil {
		return nil, err
	}
	s := &Server{Tmp: tmp, Bin: filepath.Join(tmp, "corral"), DataDir: filepath.Join(tmp, "data")}
	s.AgentBin = filepath.Join(tmp, "corral-agent")
	for bin, dir := range map[string]string{s.Bin: cmdDir, s.AgentBin: filepath.Join(filepath.Dir(cmdDir), "corral-agent")} {
		cmd := exec.Command("go", "build", "-o", bin, dir)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			os.RemoveAll(tmp)
			return nil, fmt.Errorf("build %s: %v: %s", dir, err, b)
		}
	}
	ids, err := CopyIDFiles(filepath.Join(tmp, "etc"))
	if err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	cfg := server.Config{
		IDFiles: ids,
		DataDir: s.DataDir, AgentBinary: s.AgentBin, Progress: os.Stderr, MaxOutput: 64 << 10,
		KillOnShutdown: true, Admission: govern.AdmissionConfig{MaxConcurrent: 20},
		// Some attack tests burn CPU for longer than the default 30 s
		// runaway limit under gVisor's ptrace platform; the watchdog's
		// rule has its own test with its own server.
		Watchdog: watchdog.Config{CPURunawayFor: 5 * time.Minute},
		Log:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
	}
	if configure != nil {
		configure(&cfg)
	}
	s.Srv, err = server.Open(context.Background(), cfg)
	if err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("open server: %w", err)
	}
	// The listener's bounds are the production server's.
	s.http = httptest.NewUnstartedServer(s.Srv.Handler)
	s.http.Config = s.Srv.HTTPServer()
	s.http.Start()
	s.URL, s.Key = s.http.URL, s.Srv.AdminKey
	return s, nil
}

// CopyIDFiles copies the host's /etc/subuid, /etc/subgid, /etc/passwd and
// /etc/group into dir and returns their names there: a test server checks
// its uid range against the host's real delegations and users but records
// its own entry in the copies, never in /etc (the real corral serve does).
func CopyIDFiles(dir string) (idrange.Files, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return idrange.Files{}, err
	}
	f := idrange.InDir(dir)
	for src, dst := range map[string]string{"/etc/subuid": f.SubUID, "/etc/subgid": f.SubGID, "/etc/passwd": f.Passwd, "/etc/group": f.Group} {
		b, err := os.ReadFile(src)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return idrange.Files{}, err
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			return idrange.Files{}, err
		}
	}
	return f, nil
}

// Close kills every sandbox, stops the server, unmounts the volumes a
// test left behind (a server keeps volumes mounted across restarts; a
// test server does not come back) and removes the scratch dir.
func (s *Server) Close() error {
	s.http.Close()
	err := s.Srv.Close(context.Background())
	mnts, _ := filepath.Glob(filepath.Join(s.DataDir, "volumes", "*", "mnt"))
	for _, mp := range mnts {
		if uerr := unix.Unmount(mp, unix.MNT_DETACH); uerr != nil && !errors.Is(uerr, unix.EINVAL) && err == nil {
			err = fmt.Errorf("unmount test volume %s: %w", mp, uerr)
		}
	}
	os.RemoveAll(s.Tmp)
	return err
}
