package registry

import (
	"net/netip"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/corralhq/corral/internal/egress"
)

// Build limits.
const (
	MaxSpecFiles     = 256
	MaxSpecFileBytes = 32 << 20 // all files together
	MaxSpecCommands  = 64
	MaxSpecPackages  = 256
	MaxAptSources    = 16
)

// DebianMirrors are the names a build that installs packages may reach.
var DebianMirrors = []string{"deb.debian.org", "security.debian.org"}

// Spec describes a template build (docs/environments.md): the data and
// its validation; the build itself runs a sandbox (sandbox.Manager).
type Spec struct {
	Name     string            `json:"name"`
	Version  string            `json:"version,omitempty"`
	Base     string            `json:"base,omitempty"` // template[:version]; "debian:bookworm" means base
	Packages []string          `json:"packages,omitempty"`
	Files    []SpecFile        `json:"files,omitempty"`
	Run      []SpecCommand     `json:"run,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Workdir  string            `json:"workdir,omitempty"`
	Runtime  string            `json:"runtime,omitempty"`
	Tier     string            `json:"tier,omitempty"`
	Start    string            `json:"start,omitempty"`
	// AptSources, when set, replace the template's apt sources for the
	// package step only: one-line sources.list entries (`deb [opts] URI
	// suite [component...]`). Their hosts replace DebianMirrors in the
	// build's allowlist; the template's own /etc/apt is not changed.
	AptSources []string `json:"apt_sources,omitempty"`
	// Allow is what the build may reach besides the package mirrors
	// (added when Packages is not empty).
	Allow []string `json:"allow,omitempty"`
	// Team owns the built template (private to it); "" publishes it for
	// every team. It is set from the caller's key, never read from a
	// request body.
	Team string `json:"-"`
}

// SpecFile is a file copied into the template.
type SpecFile struct {
	Path          string `json:"path"`
	ContentBase64 string `json:"content_base64"`
	Mode          string `json:"mode,omitempty"`  // octal, default 0644
	Owner         string `json:"owner,omitempty"` // user name, default root
}

// SpecCommand is a command run during the build.
type SpecCommand struct {
	Command string `json:"command"`
	User    string `json:"user,omitempty"` // root (default) or user
}

var pkgRe = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]*(=[A-Za-z0-9.+:~-]+)?$`)

// Check validates a spec but for its tier (the Manager knows the tiers);
// it changes nothing. A refusal is an *InvalidError.
func (s *Spec) Check() error {
	if !ValidName(s.Name) {
		return invalid("template name %q: use [a-z0-9._-], starting with a letter or digit", s.Name)
	}
	if s.Version != "" && !ValidVersion(s.Version) {
		return invalid("template version %q: use [a-z0-9._-]", s.Version)
	}
	if len(s.Packages) > MaxSpecPackages || len(s.Files) > MaxSpecFiles || len(s.Run) > MaxSpecCommands {
		return invalid("a spec has at most %d packages, %d files and %d commands", MaxSpecPackages, MaxSpecFiles, MaxSpecCommands)
	}
	for _, p := range s.Packages {
		if !pkgRe.MatchString(p) {
			return invalid("package %q is not a Debian package name", p)
		}
	}
	if len(s.AptSources) > 0 && len(s.Packages) == 0 {
		return invalid("apt_sources needs packages to install")
	}
	if len(s.AptSources) > MaxAptSources {
		return invalid("a spec has at most %d apt sources", MaxAptSources)
	}
	for _, src := range s.AptSources {
		if _, err := AptSourceHost(src); err != nil {
			return err
		}
	}
	total := 0
	for _, f := range s.Files {
		if !filepath.IsAbs(f.Path) || filepath.Clean(f.Path) != f.Path || f.Path == "/" {
			return invalid("file path %q must be absolute and clean", f.Path)
		}
		total += len(f.ContentBase64) * 3 / 4
		if f.Mode != "" {
			if m, err := strconv.ParseUint(f.Mode, 8, 32); err != nil || m > 0o7777 {
				return invalid("file %s: mode %q is not octal permission bits", f.Path, f.Mode)
			}
		}
		if f.Owner != "" && f.Owner != "root" && f.Owner != "user" {
			return invalid("file %s: owner must be root or user", f.Path)
		}
	}
	if total > MaxSpecFileBytes {
		return invalid("files exceed %d bytes", MaxSpecFileBytes)
	}
	for _, c := range s.Run {
		if strings.TrimSpace(c.Command) == "" || len(c.Command) > 64<<10 {
			return invalid("a run command must be 1 byte to 64 KiB")
		}
		if c.User != "" && c.User != "root" && c.User != "user" {
			return invalid("run user must be root or user")
		}
	}
	for k := range s.Env {
		if !envNameRe.MatchString(k) {
			return invalid("env var name %q is not valid", k)
		}
	}
	if s.Workdir != "" && !filepath.IsAbs(s.Workdir) {
		return invalid("workdir must be absolute")
	}
	if s.Runtime != "" && s.Runtime != "runc" && s.Runtime != "gvisor" {
		return invalid("runtime must be runc or gvisor")
	}
	return nil
}

// AptSourceHost checks one apt_sources entry (`deb [opts] URI suite
// [component...]`, http or https, a host name) and returns the URI's host
// name, which the build's allowlist gets.
func AptSourceHost(src string) (string, error) {
	bad := func(why string) (string, error) {
		return "", invalid("apt source %q: %s", clip(src), why)
	}
	if len(src) > 1024 || strings.ContainsAny(src, "\r\n\x00") {
		return bad("one line of at most 1024 bytes")
	}
	f := strings.Fields(src)
	if len(f) < 3 || f[0] != "deb" {
		return bad("want `deb [options] URI suite [component...]`")
	}
	f = f[1:]
	if strings.HasPrefix(f[0], "[") {
		i := 0
		for i < len(f) && !strings.HasSuffix(f[i], "]") {
			i++
		}
		if i == len(f) {
			return bad("options [..] are not closed")
		}
		f = f[i+1:]
	}
	if len(f) < 2 {
		return bad("want a URI and a suite")
	}
	u, err := url.Parse(f[0])
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return bad("the URI must be http:// or https:// with a host")
	}
	h := strings.ToLower(u.Hostname())
	if _, err := netip.ParseAddr(h); err == nil {
		return bad("name the mirror by host name, not address (the build's allowlist holds names)")
	}
	if _, err := egress.ParsePolicy(string(egress.ModeAllow), []string{h}); err != nil {
		return bad(err.Error())
	}
	return h, nil
}

// clip bounds a caller's text quoted in an error.
func clip(s string) string {
	if len(s) > 4096 {
		return s[:4096] + "…"
	}
	return s
}
