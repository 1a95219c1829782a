//go:build linux

package egress

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// nlAddrWatch is a non-blocking NETLINK_ROUTE socket subscribed to IPv4
// and IPv6 address changes. It is never closed: there is one per process.
type nlAddrWatch struct {
	fd  int
	buf []byte
}

// openAddrWatch subscribes to the kernel's address notifications.
func openAddrWatch() (addrWatch, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("egress: netlink socket: %w", err)
	}
	sa := &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV6_IFADDR}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("egress: netlink bind: %w", err)
	}
	// Best effort: a larger queue overflows less often (an overflow only
	// costs a re-read).
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
	// Messages are counted, not parsed: a short buffer truncates them,
	// which still dequeues them.
	return &nlAddrWatch{fd: fd, buf: make([]byte, 512)}, nil
}

// changed drains the socket and reports whether any notification arrived
// (or the queue overflowed, or reading failed) since the last call.
func (w *nlAddrWatch) changed() bool {
	changed := false
	for {
		_, _, err := unix.Recvfrom(w.fd, w.buf, unix.MSG_DONTWAIT)
		switch {
		case err == nil:
			changed = true
		case errors.Is(err, unix.EAGAIN):
			return changed
		case errors.Is(err, unix.EINTR):
		default:
			// ENOBUFS: notifications were lost. Anything else: the
			// socket cannot be trusted. Either way, read the set.
			return true
		}
	}
}
