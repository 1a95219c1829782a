package sandbox

import (
	"context"
	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/netns"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/store"
)

// What the Manager needs of the server's other parts, declared here where
// it is used; internal/server passes the concrete types (*audit.Log,
// *gateway.Gateway, *volume.Service). A nil field means the part is
// absent; set a field only with a non-nil pointer (an interface holding
// a nil pointer is not nil). (The volumes' interface is in volumes.go, the pools' in
// pool.go.)

// auditRecorder records an event of a sandbox ("" for none) in the audit
// log (*audit.Log).
type auditRecorder interface {
	Record(sandbox, kind string, data any)
	// RecordBy records an event a request caused, with the team and API
	// key id of the actor ctx carries.
	RecordBy(ctx context.Context, sandbox, kind string, data any)
	// RecordSandboxEnd writes a sandbox's end and, only if that end
	// ended the record, its event, together; it reports whether it did
	// (see Manager.recordEnd).
	RecordSandboxEnd(ctx context.Context, end *store.SandboxEnd, kind string, data any) (bool, error)
}

// networkGateway gives sandboxes their network (*gateway.Gateway): the
// host side of each sandbox's veth pair, its egress policy in the proxy
// and DNS filter, and the reaping of what a sandbox left.
type networkGateway interface {
	// ResolvConf is the resolv.conf every sandbox gets.
	ResolvConf() string
	// TrustFiles are the binds and env that make a rootfs trust the
	// egress CA (sandboxes with secrets).
	TrustFiles(rootfs string) ([]runtime.FileBind, map[string]string, error)
	// Reserve reserves a sandbox's addresses before it starts; Reserved
	// says whether it holds some; Attach makes its veth pair in the
	// sandbox's network namespace; Create makes a namespace with its
	// veth pair before it starts (Link.NSPath; for gVisor); Link returns
	// the pair if any.
	Reserve(id string) (*netns.Link, error)
	Create(id string) (*netns.Link, error)
	Reserved(id string) bool
	Attach(id, nsPath string) (*netns.Link, error)
	Link(id string) (*netns.Link, bool)
	// Set installs a sandbox's egress policy; Remove removes its network.
	Set(id string, c egress.Client) error
	Remove(id string) error
	// Adopt takes over the veth pairs a previous run left for the
	// sandboxes keep accepts; Reap removes those of sandboxes keep
	// refuses and returns their ids.
	Adopt(keep func(id string) bool) ([]*netns.Link, error)
	Reap(keep func(id string) bool) []string
	// Ensure reinstalls the nftables table if it went missing.
	Ensure() (restored bool, err error)
	// Usage returns a sandbox's egress counters.
	Usage(id string) egress.Usage
}
