package template

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"strings"
)

// RecipeVersion is the revision of the base build recipe. Bump it whenever
// the build changes in a way the package list, mirror and setup script do
// not capture (for example ShiftOwnership or the debootstrap flags), so that
// cached builds are rebuilt.
const RecipeVersion = 1

// DefaultMirror is the Debian mirror used when BaseOptions.Mirror is empty.
const DefaultMirror = "http://deb.debian.org/debian"

// BaseSuite is the Debian suite of the base template.
const BaseSuite = "bookworm"

// BaseName is the build name of the base template (the prefix of its build
// dir and the name in its manifest).
const BaseName = "base"

// DefaultBasePackages returns the packages installed in the base template on
// top of debootstrap's minbase variant: what agents and the E2B SDK expect
// of E2B's base template.
func DefaultBasePackages() []string {
	return []string{
		"python3", "python-is-python3", "bash", "coreutils", "sudo", "git",
		"curl", "ncurses-bin", "procps", "iproute2", "ca-certificates",
	}
}

// baseSetupScript runs inside the chroot once debootstrap is done. It only
// runs code from Debian's packages (shadow's useradd, sudo's visudo, coreutils).
const baseSetupScript = `set -eu
groupadd --gid 1000 user
useradd --uid 1000 --gid 1000 --create-home --home-dir /home/user --skel /etc/skel --shell /bin/bash user
chown 1000:1000 /home/user
chmod 0755 /home/user
printf '%s\n' 'user ALL=(ALL:ALL) NOPASSWD: ALL' > /etc/sudoers.d/user
chmod 0440 /etc/sudoers.d/user
visudo -c -q -f /etc/sudoers.d/user
printf 'corral\n' > /etc/hostname
printf '127.0.0.1\tlocalhost corral\n::1\tlocalhost ip6-localhost ip6-loopback\n' > /etc/hosts
: > /etc/resolv.conf
rm -rf /var/lib/apt/lists/*
mkdir -p /var/lib/apt/lists/partial
rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/* /var/cache/apt/*.bin
rm -f /var/log/*.log /var/cache/debconf/*-old
install -d -m 0700 -o root -g root /run/corral
install -d -m 0755 -o root -g root /.corral
`

// BaseOptions configures BuildBase. With only IDBase set it builds the
// default base template from DefaultMirror.
type BaseOptions struct {
	// Mirror is the Debian mirror URL; empty means DefaultMirror.
	Mirror string
	// Packages are installed on top of minbase; nil means
	// DefaultBasePackages().
	Packages []string
	// Progress receives a progress display: a progress bar if it is a
	// terminal, else one plain line per step. Nil means no progress.
	Progress io.Writer
	// Debootstrap is the debootstrap program; empty means "debootstrap"
	// looked up in PATH, /usr/sbin and /sbin.
	Debootstrap string
	// IDBase is the base of the server's uid range: the host uid/gid the
	// files' container id 0 is shifted to (required; see package idrange).
	IDBase uint32
}

func (o BaseOptions) mirror() string {
	if o.Mirror == "" {
		return DefaultMirror
	}
	return strings.TrimRight(o.Mirror, "/")
}

// packages returns the package list, sorted and without duplicates, so that
// the digest does not depend on the order packages were given in.
func (o BaseOptions) packages() []string {
	p := o.Packages
	if p == nil {
		p = DefaultBasePackages()
	}
	p = slices.Clone(p)
	slices.Sort(p)
	return slices.Compact(p)
}

// Digest returns the hex sha256 of the build recipe o describes: recipe
// version, suite, mirror, uid base, package list and setup script. Builds with the
// same digest are interchangeable, so BuildBase caches by it.
func (o BaseOptions) Digest() string {
	h := sha256.New()
	fmt.Fprintf(h, "corral-base-recipe\x00%d\x00", RecipeVersion)
	fmt.Fprintf(h, "suite\x00%s\x00variant\x00minbase\x00", BaseSuite)
	fmt.Fprintf(h, "mirror\x00%s\x00", o.mirror())
	fmt.Fprintf(h, "offset\x00%d\x00", o.IDBase)
	for _, p := range o.packages() {
		fmt.Fprintf(h, "package\x00%s\x00", p)
	}
	fmt.Fprintf(h, "script\x00%d\x00%s", len(baseSetupScript), baseSetupScript)
	return hex.EncodeToString(h.Sum(nil))
}

// validatePackages rejects package names that could be taken as debootstrap
// options or break its comma-separated --include list.
func validatePackages(pkgs []string) error {
	for _, p := range pkgs {
		if p == "" || strings.HasPrefix(p, "-") || strings.ContainsAny(p, ", \t\n/") {
			return fmt.Errorf("invalid package name %q", p)
		}
	}
	return nil
}

// baseDirName returns the build dir name for a recipe digest.
func baseDirName(digest string) string {
	return BaseName + "-" + digest[:16]
}

// baseVersion returns the human-readable version for a recipe digest.
func baseVersion(digest string) string {
	return fmt.Sprintf("%s-r%d-%s", BaseSuite, RecipeVersion, digest[:12])
}

// recipe is one build: debootstrap of the base packages, then (optionally)
// extra packages from apt-get, the base setup script, files and a further
// setup script, then the ownership shift.
type recipe struct {
	name          string // build name (manifest name)
	digest        string
	dirName       string // build dir name under the cache
	version       string
	recipeVersion int
	opts          BaseOptions // mirror, progress, debootstrap, uid base
	packages      []string    // debootstrap --include
	extra         []string    // apt-get install --no-install-recommends after debootstrap
	files         []File      // written after the setup scripts, owned by root
	script        string      // run in the chroot after the base setup script
}

// recipe returns the build steps of the base template.
func (o BaseOptions) recipe() recipe {
	d := o.Digest()
	return recipe{name: BaseName, digest: d, dirName: baseDirName(d), version: baseVersion(d),
		recipeVersion: RecipeVersion, opts: o, packages: o.packages()}
}

// allPackages is the manifest's package list: what was asked for.
func (r recipe) allPackages() []string {
	p := append(slices.Clone(r.packages), r.extra...)
	slices.Sort(p)
	return slices.Compact(p)
}
