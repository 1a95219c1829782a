//go:build !linux

package egress

import (
	"errors"
	"net"
	"net/netip"
)

// OriginalDst returns the pre-redirect destination of a connection
// accepted on a listener that nftables redirected to. It needs Linux;
// elsewhere it always fails.
func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.New("egress: original destination: only supported on Linux")
}
