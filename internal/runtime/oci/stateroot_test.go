package oci

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
)

// TestStateRootsPruned: a driver that starts removes the state roots
// under /run/corral that no supervisor serves and that hold only empty
// runtime roots (left by control planes that ended without their
// supervisor's cleanup: over a thousand had accumulated on a test host),
// and keeps one that holds a sandbox's runtime state.
func TestStateRootsPruned(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("/run/corral is root's")
	}
	if err := os.MkdirAll(StateBase, 0o711); err != nil {
		t.Fatal(err)
	}
	root := func() string {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		return filepath.Join(StateBase, hex.EncodeToString(b))
	}
	stale, live := root(), root()
	t.Cleanup(func() { _ = os.RemoveAll(stale); _ = os.RemoveAll(live) })
	for _, d := range []string{filepath.Join(stale, "runc"), filepath.Join(stale, "gvisor"), filepath.Join(live, "runc", "sb-1")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	agent := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(agent, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{StateDir: t.TempDir(), AgentBinary: agent, UIDBase: 1 << 30, RunscPath: "/bin/true"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale empty state root %s left: %v", stale, err)
	}
	if _, err := os.Stat(filepath.Join(live, "runc", "sb-1")); err != nil {
		t.Fatalf("a state root holding a sandbox's state was removed: %v", err)
	}
}
