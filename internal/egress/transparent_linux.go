//go:build linux

package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST from linux/netfilter_ipv6/ip6_tables.h.
const ip6tSOOriginalDst = 80

// OriginalDst returns the pre-redirect destination of a connection
// accepted on a listener that nftables redirected to (SO_ORIGINAL_DST,
// IPv4; IP6T_SO_ORIGINAL_DST for IPv6).
//
// The destination comes from the connection's conntrack entry. A
// connection that was not redirected (it was made to the listener's own
// address) yields an error wrapping [ErrNotRedirected], so a sandbox that
// connects to the proxy port directly cannot make the proxy dial itself.
func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) {
	la, ok := c.LocalAddr().(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, errors.New("egress: original destination: no local address")
	}
	local := la.AddrPort()
	local = netip.AddrPortFrom(canonical(local.Addr()), local.Port())
	level, opt := unix.SOL_IP, unix.SO_ORIGINAL_DST
	if !local.Addr().Is4() {
		level, opt = unix.SOL_IPV6, ip6tSOOriginalDst
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("egress: original destination: %w", err)
	}
	var sa unix.RawSockaddrInet6 // large enough for sockaddr_in too
	var serr error
	cerr := rc.Control(func(fd uintptr) {
		l := uint32(unsafe.Sizeof(sa))
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), uintptr(opt),
			uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&l)), 0)
		if e != 0 {
			serr = e
		}
	})
	if cerr != nil {
		return netip.AddrPort{}, fmt.Errorf("egress: original destination: %w", cerr)
	}
	switch {
	case errors.Is(serr, unix.ENOENT):
		return netip.AddrPort{}, fmt.Errorf("egress: original destination of %s: %w (no conntrack entry)", c.RemoteAddr(), ErrNotRedirected)
	case errors.Is(serr, unix.ENOPROTOOPT):
		return netip.AddrPort{}, fmt.Errorf("egress: original destination of %s: %w (conntrack is not available: is nf_conntrack loaded?)", c.RemoteAddr(), ErrNotRedirected)
	case serr != nil:
		return netip.AddrPort{}, fmt.Errorf("egress: original destination of %s: getsockopt: %w", c.RemoteAddr(), serr)
	}
	var orig netip.AddrPort
	switch sa.Family {
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(&sa))
		pb := (*[2]byte)(unsafe.Pointer(&sa4.Port))
		orig = netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), uint16(pb[0])<<8|uint16(pb[1]))
	case unix.AF_INET6:
		pb := (*[2]byte)(unsafe.Pointer(&sa.Port))
		orig = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(pb[0])<<8|uint16(pb[1]))
	default:
		return netip.AddrPort{}, fmt.Errorf("egress: original destination of %s: unexpected address family %d", c.RemoteAddr(), sa.Family)
	}
	if orig == local {
		return netip.AddrPort{}, fmt.Errorf("egress: original destination of %s is the listener itself: %w", c.RemoteAddr(), ErrNotRedirected)
	}
	return orig, nil
}
