package sandbox

import (
	"io/fs"

	"github.com/corralhq/corral/internal/inroot"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/store"
)

// TemplateDefaults is the part of a runtime.Config that a create naming
// only template tv (no tier, runtime or resources of its own) gets from
// it: its runtime and tier's limits, its default user and whether
// privilege escalation is off. A runtime's own warm pool (--kube-pools)
// is built from it, so that a pooled sandbox has exactly the settings of
// a cold one (sudo where the template offers it, no_new_privs where not).
func TemplateDefaults(tv *store.TemplateVersion) runtime.Config {
	rt := firstNonEmpty(tv.Config.Runtime, string(runtime.Runc))
	tier, ok := Tiers[firstNonEmpty(tv.Config.Tier, DefaultTier)]
	if !ok {
		tier = Tiers[DefaultTier]
	}
	res := tier.Resources
	noNewPrivs, user := templatePrivileges(tv)
	return runtime.Config{Runtime: runtime.Runtime(rt), Template: tv.Ref(), NoNewPrivileges: noNewPrivs, DefaultUser: user,
		Resources: runtime.Resources{CPU: res.CPU, MemoryBytes: res.MemoryMB << 20, DiskBytes: res.DiskMB << 20, Pids: res.Pids, Nofile: res.Nofile}}
}

// templatePrivileges is the one rule for a sandbox's privileges from its
// template: no_new_privs unless the template's root holds a regular
// /usr/bin/sudo (looked up inside the root, so that a link to a host
// file cannot turn no_new_privs off), and the template's user, or
// "user".
func templatePrivileges(tv *store.TemplateVersion) (noNewPrivs bool, user string) {
	sudo, err := inroot.StatMode(tv.RootFS, "/usr/bin/sudo")
	if err == nil && !sudo.IsRegular() {
		err = fs.ErrNotExist
	}
	return err != nil, firstNonEmpty(tv.Config.User, "user")
}
