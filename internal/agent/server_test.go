package agent

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestMainServesOnSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "run", "corral", "agent.sock")
	must(t, os.MkdirAll(filepath.Dir(sock), 0o755))
	// A stale socket from a previous run is replaced.
	stale, err := net.Listen("unix", sock)
	must(t, err)
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	passwd := filepath.Join(dir, "passwd")
	writeFile(t, passwd, "root:x:0:0:root:"+dir+":/bin/sh\n")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Main(ctx, Config{Socket: sock, DefaultUser: "root", PasswdFile: passwd, GroupFile: passwd, Subreaper: true})
	}()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	var resp *http.Response
	if !eventually(5*time.Second, func() bool {
		resp, err = hc.Get("http://agent/health")
		return err == nil
	}) {
		t.Fatalf("agent not serving: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("health %d", resp.StatusCode)
	}
	fi, err := os.Stat(sock)
	must(t, err)
	if fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket mode %v", fi.Mode())
	}
	if d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err != nil || d != 0 {
		t.Fatalf("dumpable = %d, %v", d, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Main: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Main did not return")
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
}
