package integration

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	corral "github.com/corralhq/corral/sdk/go"
)

// TestServeConfigFile proves that `corral serve --config FILE` configures
// the real server (issue 11: operators expect a config file, and a key that
// silently did not apply would leave a limit at its default unnoticed).
// The file's max-sandboxes = 1 is the admission limit (a second create is
// refused 429 capacity_exceeded), --listen on the command line wins over
// the file's listen (the server answers on the flag's address), and a file
// with a misspelt key stops the server before it touches its data dir,
// with exit status 2 and a message naming the key and the file.
func TestServeConfigFile(t *testing.T) {
	need(t)
	ctx := context.Background()
	tmp := t.TempDir()
	for d := tmp; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o711) // sandbox root must traverse to its rootfs
	}
	file := filepath.Join(tmp, "serve.toml")
	unused := freeAddr(t)
	conf := "listen = \"" + unused + "\"\nmax-sandboxes = 1\nno-network = true\nkill-on-shutdown = true\nkill-grace = \"1s\"\n"
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(tmp, "data")
	addr := freeAddr(t)
	p := startServe(t, data, addr, "--config", file)
	t.Cleanup(func() {
		if p.running() {
			_ = p.signal(t, syscall.SIGTERM)
		}
		if t.Failed() {
			t.Logf("corral serve log (tail):\n%s", logTail(p.log.String(), 60))
		}
	})
	c := corral.New(p.url, p.key)
	sb, err := c.Create(ctx, corral.CreateOptions{})
	if err != nil {
		t.Fatalf("first create: %v", err)
	}
	if _, err := c.Create(ctx, corral.CreateOptions{}); !corral.IsCapacityExceeded(err) {
		t.Errorf("second create with max-sandboxes = 1 from the file: %v, want capacity_exceeded", err)
	}
	if err := sb.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.signal(t, syscall.SIGTERM); err != nil && !strings.Contains(err.Error(), "exit status 0") {
		t.Errorf("corral serve exit: %v", err)
	}

	bad := filepath.Join(tmp, "bad.toml")
	if err := os.WriteFile(bad, []byte("max-sandbox = 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badData := filepath.Join(tmp, "bad-data")
	out, err := exec.Command(env.bin, "serve", "--config", bad, "--data", badData, "--listen", freeAddr(t)).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("serve with an unknown key: %v, want exit status 2\n%s", err, out)
	}
	if !strings.Contains(string(out), `unknown key "max-sandbox"`) || !strings.Contains(string(out), bad) {
		t.Errorf("message does not name the key and the file: %s", out)
	}
	if _, err := os.Stat(badData); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused server made its data dir: %v", err)
	}
}
