package agent

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
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

// TestMainRemovesTokenFile: the agent removes its token file before it
// serves, so that sandbox root cannot read the token from RunDir (it
// printed with `sudo cat /run/corral/token`), and still requires the token.
func TestMainRemovesTokenFile(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	tok := filepath.Join(dir, "token")
	writeFile(t, tok, "s3cret")
	passwd := filepath.Join(dir, "passwd")
	writeFile(t, passwd, "root:x:0:0:root:"+dir+":/bin/sh\n")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Main(ctx, Config{Socket: sock, TokenFile: tok, DefaultUser: "root", PasswdFile: passwd, GroupFile: passwd})
	}()
	defer func() {
		cancel()
		<-done
	}()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	get := func(token string) int {
		req, _ := http.NewRequest("POST", "http://agent/process.Process/List", strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("X-Access-Token", token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if !eventually(5*time.Second, func() bool { return get("s3cret") == http.StatusOK }) {
		t.Fatal("agent not serving with its token")
	}
	if _, err := os.Lstat(tok); !os.IsNotExist(err) {
		t.Fatalf("token file still there while the agent serves: %v", err)
	}
	if code := get(""); code != http.StatusUnauthorized {
		t.Fatalf("without the token: %d, want 401", code)
	}
}
