package oci

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/containerd/go-runc"

	"github.com/corralhq/corral/internal/cgroups"
	"github.com/corralhq/corral/internal/runtime"
)

// freezeTimeout bounds how long a freeze or thaw of a gVisor sandbox's
// cgroup may take to show.
const freezeTimeout = 10 * time.Second

// freezeGVisor freezes the host cgroup of a gVisor sandbox that runsc
// has paused. runsc's pause stops the sandbox's tasks inside gVisor's
// kernel, but the kernel (the sentry, its gofer and the systrap stubs)
// keeps running and used about 4% of a core per paused sandbox here; the
// freezer stops it all, so a paused gVisor sandbox costs no CPU, as a
// paused runc one. If the freeze fails the sandbox is resumed, so that
// it is never left half paused. TestConformance/gvisor/PauseResume is
// the regression test.
func (d *Driver) freezeGVisor(ctx context.Context, id string) error {
	if err := cgroups.Open(d.cgroupPath(id)).SetFrozen(true, freezeTimeout); err != nil {
		_ = d.resume(context.WithoutCancel(ctx), id, runtime.GVisor)
		return fmt.Errorf("freeze gVisor sandbox %s: %w", id, err)
	}
	return nil
}

// thawGVisor thaws a gVisor sandbox's cgroup (freezeGVisor) so that
// runsc can reach its kernel again; a cgroup that is not frozen is left
// as it is.
func (d *Driver) thawGVisor(id string) error {
	if err := cgroups.Open(d.cgroupPath(id)).SetFrozen(false, freezeTimeout); err != nil {
		return fmt.Errorf("thaw gVisor sandbox %s: %w", id, err)
	}
	return nil
}

// starter is the runtime binary that creates and starts sandbox cfg: for
// gVisor with the sandbox's network flag (runscNetworkArgs), which runsc
// reads at create (the namespace its sandbox joins) and at start (the
// interfaces it takes over), so both get it.
func (d *Driver) starter(cfg runtime.Config) *runc.Runc {
	rc := d.binary(cfg.Runtime)
	if cfg.Runtime != runtime.GVisor {
		return rc
	}
	c := *rc
	c.ExtraArgs = append(slices.Clone(rc.ExtraArgs), runscNetworkArgs(d.opts.RunscLegacy, cfg.NetNS)...)
	return &c
}
