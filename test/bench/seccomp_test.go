package bench

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// seccompVariant derives one seccomp profile from corral's for
// BenchmarkSeccompCost; nil means no filter.
type seccompVariant struct {
	name  string
	label string
	make  func(full *specs.LinuxSeccomp) *specs.LinuxSeccomp
}

var seccompVariants = []seccompVariant{
	{"Full", "corral's profile (Docker's default, host ABI only)", func(p *specs.LinuxSeccomp) *specs.LinuxSeccomp { return p }},
	{"None", "no seccomp filter", func(*specs.LinuxSeccomp) *specs.LinuxSeccomp { return nil }},
	{"EmptyAllow", "a filter with no rule, default allow (libseccomp and the load alone)", func(p *specs.LinuxSeccomp) *specs.LinuxSeccomp {
		return &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Architectures: p.Architectures}
	}},
	{"NoArgRules", "corral's profile without its rules with argument checks (measurement only: a weaker policy)", func(p *specs.LinuxSeccomp) *specs.LinuxSeccomp {
		q := *p
		q.Syscalls = nil
		for _, s := range p.Syscalls {
			if len(s.Args) == 0 {
				q.Syscalls = append(q.Syscalls, s)
			}
		}
		return &q
	}},
	{"OnlyArgRules", "its socket and personality rules (argument checks) alone, the rest allowed (measurement only)", func(p *specs.LinuxSeccomp) *specs.LinuxSeccomp {
		q := *p
		q.DefaultAction, q.DefaultErrnoRet = specs.ActAllow, nil
		q.Syscalls = nil
		for _, s := range p.Syscalls {
			// The same comparisons, denying what they allow, so that
			// they are not folded into the default; not clone's (runc's
			// init makes threads after the filter is loaded).
			if len(s.Args) > 0 && s.Names[0] != "clone" {
				s.Action = specs.ActErrno
				q.Syscalls = append(q.Syscalls, s)
			}
		}
		return &q
	}},
}

// BenchmarkSeccompCost measures where the seccomp filter's share of a
// `runc run` goes: raw `runc run` of /bin/true with corral's own spec and
// each profile of seccompVariants in turn within each iteration (so all
// see the same load), reported as SeccompCost/<variant>. Only "Full" and
// "None" are policies corral could ship (it ships Full); the others take
// parts of the profile away to show what each part costs runc
// (libseccomp's compile of the rules, the kernel's load of the program).
func BenchmarkSeccompCost(b *testing.B) {
	need(b)
	r := newRawRunc(b)
	base := r.corralSpec(b, "/bin/true")
	bundles := make([]string, len(seccompVariants))
	all := make([]*samples, len(seccompVariants))
	for i, v := range seccompVariants {
		spec := *base
		lin := *base.Linux
		lin.Seccomp = v.make(base.Linux.Seccomp)
		spec.Linux = &lin
		bundles[i] = r.bundle(b, "seccomp-"+v.name, &spec)
		all[i] = newSamples(b)
	}
	for n := 0; n < b.N; n++ {
		for i := range seccompVariants {
			timeCmd(b, all[i], r.runCmd(bundles[i]))
		}
	}
	for i, v := range seccompVariants {
		all[i].reportAs("SeccompCost/" + v.name)
	}
}
