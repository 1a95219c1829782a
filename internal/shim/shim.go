// Package shim is the small supervisor corral puts between itself and an
// OCI runtime's foreground process (as a containerd shim does). It marks
// itself a child subreaper, runs the runtime, reaps every process that is
// orphaned below it (gVisor's stub processes, for example, whose parent
// dies first) and exits with the runtime's exit status once nothing is
// left. Without it, such orphans would be left as zombies to a host init
// that may not reap them.
package shim

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// Run runs argv under the shim and returns the exit code to exit with.
// SIGTERM and SIGINT received by the shim are forwarded to the runtime.
func Run(argv []string) int {
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "shim: no command")
		return 2
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "shim: set subreaper:", err)
		return 1
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "shim:", err)
		return 1
	}
	child := cmd.Process.Pid
	go func() {
		for s := range sigs {
			_ = syscall.Kill(child, s.(syscall.Signal))
		}
	}()
	code := 1
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil { // ECHILD: every descendant is gone
			return code
		}
		if pid == child {
			switch {
			case ws.Exited():
				code = ws.ExitStatus()
			case ws.Signaled():
				code = 128 + int(ws.Signal())
			}
		}
	}
}
