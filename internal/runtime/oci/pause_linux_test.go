package oci

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/containerd/go-runc"
)

// TestRuncFreezeWording pins the runc message the pause retry matches
// (runcFreezeGaveUp, the only signal runc gives of a freeze that gave
// up): the runc binary in use must still contain it, and a failed runc
// pause must reach the driver as an error that carries runc's own
// message (go-runc's error holds runc's stderr), or the match could
// never hold. It defends against a runc upgrade that rewords the message
// turning the retry off without a sound, after which pauses of throttled
// sandboxes fail again on a loaded host (TestConformance/runc/
// PauseThrottled shows that only when the freeze gives up, which is not
// every run).
func TestRuncFreezeWording(t *testing.T) {
	path, err := exec.LookPath("runc")
	if err != nil {
		t.Skip("runc is not installed (apt-get install runc)")
	}
	bin, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(bin, []byte(runcFreezeGaveUp)) {
		out, _ := exec.Command(path, "--version").Output()
		t.Fatalf("%s (%s) no longer says %q when its freeze gives up: find its new wording (libcontainer/cgroups/fs/freezer.go) and update runcFreezeGaveUp, or the pause retry never runs",
			path, bytes.TrimSpace(out), runcFreezeGaveUp)
	}
	// A pause runc refuses (no such container, in a root of its own)
	// fails with runc's message in the error.
	rc := &runc.Runc{Command: path, Root: t.TempDir()}
	err = rc.Pause(context.Background(), "corral-no-such-sandbox")
	if err == nil {
		t.Fatal("runc paused a container that does not exist")
	}
	if !strings.Contains(err.Error(), "corral-no-such-sandbox") && !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("a failed runc pause's error %q does not carry runc's message: the pause retry cannot match %q", err, runcFreezeGaveUp)
	}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		// go-runc's shape: the exit status, then runc's stderr.
		{errors.New("exit status 1: " + runcFreezeGaveUp + "\n"), true},
		{errors.New(`exit status 1: time="2026-12-02T08:00:00Z" level=error msg="` + runcFreezeGaveUp + `"`), true},
		{errors.New("exit status 1: container not running"), false},
		{nil, false},
	} {
		if got := freezeGaveUp(tc.err); got != tc.want {
			t.Errorf("freezeGaveUp(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
