//go:build !linux

package egress

import "errors"

// openAddrWatch needs Linux; elsewhere the host's addresses are read on
// every lookup.
func openAddrWatch() (addrWatch, error) {
	return nil, errors.New("egress: address notifications need Linux")
}
