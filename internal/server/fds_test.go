package server

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestKeepInheritedFDs guards against descriptors the server inherited
// leaking into the processes it starts (shims, runtimes, builds): a
// descriptor without close-on-exec, as a supervisor or a test harness
// passes one, is open in a child before keepInheritedFDs and not after.
func TestKeepInheritedFDs(t *testing.T) {
	var p [2]int
	if err := unix.Pipe2(p[:], 0); err != nil { // no O_CLOEXEC: as inherited
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	inChild := func() bool {
		out, err := exec.Command("/bin/sh", "-c", "ls /proc/self/fd").Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range strings.Fields(string(out)) {
			if f == strconv.Itoa(p[1]) {
				return true
			}
		}
		return false
	}
	if !inChild() {
		t.Fatalf("fd %d without close-on-exec is not in the child: the test cannot see the leak", p[1])
	}
	if err := keepInheritedFDs(); err != nil {
		t.Fatal(err)
	}
	if inChild() {
		t.Errorf("fd %d still reaches a child after keepInheritedFDs", p[1])
	}
	// The server itself keeps it.
	if _, err := unix.Write(p[1], []byte("x")); err != nil {
		t.Errorf("the descriptor was closed in the server: %v", err)
	}
}
