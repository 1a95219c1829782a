package egress

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
)

// ReasonHostAddress is the stable reason (after "always denied: ") for an
// address assigned to an interface of the host the proxy runs on.
const ReasonHostAddress = "host_address"

// addrWatch tells the host address set when the host's addresses may have
// changed since it last asked. changed must not block.
type addrWatch interface {
	changed() bool
}

// hostAddrSet is the set of addresses assigned to the interfaces of the
// proxy's network namespace (the host's: every interface, every family,
// including the ones a sandbox's veth pair adds). It defends against a
// sandbox reaching the host's own services through the proxy: an
// `all-public` sandbox dialing the host's public address (or a name that
// resolves to it) would otherwise reach sshd, corral's API or anything
// else listening on the host, since such an address is not in any
// private range.
//
// The set is read again whenever the host's addresses may have changed:
// on Linux a netlink socket subscribed to address changes is polled
// without blocking on every lookup, so an address added before a lookup
// started is always seen (the kernel queues the notification before the
// `ip addr add` that caused it returns). Without the subscription the
// set is read again on every lookup.
type hostAddrSet struct {
	list func() ([]netip.Addr, error)

	mu     sync.Mutex
	watch  addrWatch // nil: read the set on every lookup
	opened bool      // the watch was tried
	loaded bool
	addrs  map[netip.Addr]struct{}
	err    error // from the last read; lookups fail closed while set
}

// hostAddrs is the proxy's view of the host's addresses.
var hostAddrs = &hostAddrSet{list: interfaceAddrs}

// interfaceAddrs lists the addresses of every interface of the process's
// network namespace, canonical (unmapped, no zone).
func interfaceAddrs() ([]netip.Addr, error) {
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list interface addresses: %w", err)
	}
	out := make([]netip.Addr, 0, len(ifas))
	for _, ifa := range ifas {
		var ip net.IP
		switch v := ifa.(type) {
		case *net.IPNet:
			ip = v.IP
		case *net.IPAddr:
			ip = v.IP
		}
		if a, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, canonical(a))
		}
	}
	return out, nil
}

// contains reports whether a (canonical) is an address of the host. When
// the host's addresses cannot be listed it fails closed: every address
// counts as the host's, and err says why.
func (s *hostAddrSet) contains(a netip.Addr) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.opened {
		s.opened = true
		if w, err := openAddrWatch(); err == nil {
			s.watch = w
		}
	}
	// Drain the notifications before reading the set, so that a change
	// racing with the read is seen again by the next lookup.
	if s.watch == nil || s.watch.changed() || !s.loaded || s.err != nil {
		addrs, err := s.list()
		s.loaded, s.err = true, err
		if err == nil {
			s.addrs = make(map[netip.Addr]struct{}, len(addrs))
			for _, x := range addrs {
				s.addrs[x] = struct{}{}
			}
		}
	}
	if s.err != nil {
		return true, s.err
	}
	_, ok := s.addrs[a]
	return ok, nil
}

// hostRange returns the never-openable synthetic range for a, when a is an
// address of the host.
func hostRange(a netip.Addr) *deniedRange {
	is, err := hostAddrs.contains(a)
	if !is {
		return nil
	}
	reason := ReasonHostAddress + ": " + a.String() + " is an address of this host"
	if err != nil {
		reason = ReasonHostAddress + ": cannot list this host's addresses (" + oneLine(err.Error()) + ")"
	}
	return &deniedRange{prefix: netip.PrefixFrom(a, a.BitLen()), reason: reason, never: true}
}
