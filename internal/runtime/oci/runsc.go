package oci

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// runscVersion is the gVisor module version corral builds runsc from
// (`go install gvisor.dev/gvisor/runsc@VERSION`). It is the one place the
// version is pinned: the Makefile's runsc target reads the same file.
//
//go:embed runsc.version
var runscVersion string

// RunscVersion is the pinned gVisor version (a Go module pseudo-version).
func RunscVersion() string { return strings.TrimSpace(runscVersion) }

// DefaultRunscCache is where `make runsc` puts builds of runsc, one
// directory per version: DefaultRunscCache/VERSION/runsc.
const DefaultRunscCache = "/var/cache/corral/runsc"

// CachedRunsc is the path of the pinned runsc build under cache
// (DefaultRunscCache when "").
func CachedRunsc(cache string) string {
	if cache == "" {
		cache = DefaultRunscCache
	}
	return filepath.Join(cache, RunscVersion(), "runsc")
}

// The gVisor platforms a server may choose (--runsc-platform).
const (
	PlatformSystrap = "systrap"
	PlatformPtrace  = "ptrace"
	PlatformKVM     = "kvm"
)

// Runsc is the runsc binary a server runs gVisor sandboxes with.
type Runsc struct {
	// Path is the binary.
	Path string
	// Legacy is true for a runsc without the systrap platform (Debian's
	// 2022 package): it cannot use a prepared network namespace or serve
	// bind-mounted volumes on current kernels, so gVisor sandboxes get
	// network none and no volumes, and the platform is ptrace.
	Legacy bool
	// Note says which binary was chosen and why, for the server's log.
	Note string
}

// FindRunsc picks the runsc binary: path when given (a file, or a name
// looked up in PATH), else the pinned build in cache when present, else
// runsc in PATH (Debian's package) as the fallback. A runsc that does not
// know the systrap platform (`runsc flags`) is Legacy. It fails only when
// no runsc is found at all (gVisor sandboxes are then unavailable, which
// the caller may accept).
func FindRunsc(path, cache string) (Runsc, error) {
	var r Runsc
	switch {
	case path != "":
		p, err := exec.LookPath(path)
		if err != nil {
			return r, fmt.Errorf("runsc %s: %w", path, err)
		}
		r.Path, r.Note = p, "runsc from --runsc"
	default:
		cached := CachedRunsc(cache)
		if st, err := os.Stat(cached); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			r.Path, r.Note = cached, "runsc "+RunscVersion()+" (the pinned build)"
			break
		}
		p, err := exec.LookPath("runsc")
		if err != nil {
			return r, errors.New("no runsc: neither the pinned build " + cached + " (make runsc) nor runsc in PATH")
		}
		r.Path, r.Note = p, "the pinned runsc build "+cached+" is missing (make runsc builds it); falling back to "+p
	}
	out, err := exec.Command(r.Path, "flags").CombinedOutput()
	if err != nil {
		return r, fmt.Errorf("runsc %s flags: %w: %s", r.Path, err, strings.TrimSpace(string(out)))
	}
	if !strings.Contains(string(out), PlatformSystrap) {
		r.Legacy = true
		r.Note += "; it predates the systrap platform (Debian's 2022 runsc?): gVisor sandboxes get platform ptrace, network none and no volumes"
	}
	return r, nil
}

// KVMAvailable reports whether /dev/kvm can be opened. gVisor's kvm
// platform needs it, but a present /dev/kvm does not mean guests run
// (nested virtualisation may be off): corral never picks kvm by itself.
func KVMAvailable() bool {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// runscFlags returns runsc's global flags for platform (filled with the
// default when "") under a legacy runsc or a current one.
//
// The network flag is per sandbox (runscNetworkArgs). --host-uds=all
// lets the control plane reach the agent's unix socket in the
// bind-mounted run directory. --overlay2=none keeps the root file
// system's writes on the host overlay (whose upper layer is the
// sandbox's size-capped tmpfs), so the disk cap answers ENOSPC as under
// runc instead of runsc's own overlay file in memory. --allow-suid
// honours set-user-ID binaries inside, as runc does: code runs as user
// and becomes sandbox root with sudo (a current runsc ignores the bit
// by default); it raises ids only within gVisor's kernel, and a
// template's NoNewPrivileges still prevents it. --oci-seccomp loads the
// spec's seccomp profile (Docker's, as under runc) into gVisor's kernel
// for the sandbox's processes, a filter in front of gVisor's own system
// call surface (runsc ignores the spec's profile without it).
func runscFlags(platform *string, legacy bool) ([]string, error) {
	if *platform == "" {
		*platform = PlatformSystrap
		if legacy {
			*platform = PlatformPtrace
		}
	}
	switch *platform {
	case PlatformSystrap:
		if legacy {
			return nil, errors.New("this runsc predates the systrap platform: use --runsc-platform ptrace or build the pinned runsc (make runsc)")
		}
	case PlatformPtrace:
	case PlatformKVM:
		if !KVMAvailable() {
			return nil, errors.New("runsc platform kvm needs /dev/kvm, which cannot be opened here")
		}
	default:
		return nil, fmt.Errorf("unknown runsc platform %q: use systrap, ptrace or kvm", *platform)
	}
	if legacy {
		return []string{"--platform=" + *platform, "--network=none", "--host-uds=all", "--oci-seccomp"}, nil
	}
	return []string{"--platform=" + *platform, "--host-uds=all", "--overlay2=none", "--allow-suid", "--oci-seccomp"}, nil
}

// runscNetworkArgs is the network flag of a gVisor sandbox (after the
// global flags; a legacy runsc has --network=none among those).
//
// With a prepared namespace (netNS, runtime.Config.NetNS) it is
// --network=sandbox: gVisor's network stack takes over the namespace's
// veth pair, so its traffic meets the same nftables rules, proxy and DNS
// filter as a runc sandbox's. Without one it is --network=none, which
// gives gVisor's own loopback and nothing else (--network=sandbox in a
// namespace runsc makes would give not even loopback: runsc skips
// interfaces that are down, as a new namespace's lo is).
func runscNetworkArgs(legacy bool, netNS string) []string {
	switch {
	case legacy:
		return nil
	case netNS != "":
		return []string{"--network=sandbox"}
	default:
		return []string{"--network=none"}
	}
}
