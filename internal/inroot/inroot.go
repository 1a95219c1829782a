// Package inroot is the one way the host-root control plane looks at a path
// inside a root file system it does not trust: a template's rootfs (built
// or imported from an OCI image) or a sandbox's mounted overlay.
//
// The attack it defends against: the control plane runs as host root, and
// a plain open(2) of filepath.Join(root, "/etc/ssl/certs/ca-certificates.crt")
// follows symbolic links the template planted. An image whose CA bundle is
// a link to /var/lib/corral/ca/ca-key.pem (absolute) or to
// ../../../../../../../admin.key (relative, climbing out of the template
// dir) would make corral read the egress CA's private key or the admin
// API key and bind-mount it into the sandbox; a link to /dev/zero would
// make it read forever; a FIFO would block it. Here every lookup is
// openat2(2) with RESOLVE_IN_ROOT: the path is resolved as the sandbox
// would resolve it (an absolute link target and ".." at the top stay
// inside the root), never onto the host, and with RESOLVE_NO_MAGICLINKS
// and RESOLVE_NO_XDEV no /proc magic link and no mount point below root
// is crossed. Files are read only if they are regular files, and only up
// to a bound.
package inroot

import (
	"errors"
	"fmt"
)

// ErrRefused is wrapped by every RefusedError.
var ErrRefused = errors.New("refused")

// RefusedError is content of a root that corral refuses to use: a path
// that is not what it must be (a symbolic link where a real directory is
// needed, something other than a regular file, a file over its bound).
// Its message names the path as the sandbox sees it and never a host
// path, so it can be shown to an API caller.
type RefusedError struct {
	// Path is the path inside the root ("/tmp").
	Path string
	// Reason says what is wrong ("is a symbolic link").
	Reason string
}

func (e *RefusedError) Error() string { return e.Path + " " + e.Reason }

// Is makes errors.Is(err, ErrRefused) hold.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

func refused(name, format string, args ...any) error {
	return &RefusedError{Path: name, Reason: fmt.Sprintf(format, args...)}
}
