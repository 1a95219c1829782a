package server

import (
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// keepInheritedFDs marks every descriptor above stderr that the process
// holds close-on-exec. Go opens its own descriptors close-on-exec, but
// one the process inherited (a lock its supervisor took, a socket of a
// service manager, a pipe of a test harness) is not, and Go's os/exec
// passes such descriptors to every child: the sandboxes' supervisor and
// each runtime would hold it, a supervisor that outlives the server
// would keep a lock taken for the server, and a descriptor could
// reach a process that runs beside untrusted code. It defends against
// that leak; the server itself keeps the descriptors open.
func keepInheritedFDs() error {
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err == nil {
		return nil
	}
	// Kernels before 5.11: one by one.
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 {
			continue
		}
		_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC)
	}
	return nil
}
