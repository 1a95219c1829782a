package server

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// keysPerSandbox is what one sandbox charges to the kernel's per-user key
// quota (runc gives each container a session keyring) with room for the
// warm pools' idle sandboxes beside the running ones; keyBytesEach is the
// byte quota raised with it (a keyring costs about 26 bytes; headroom).
const (
	keysPerSandbox = 2
	keysSpare      = 100
	keyBytesEach   = 100
)

// keySysctls reads and writes the kernel's per-user key quota
// (kernel.keys.maxkeys, kernel.keys.maxbytes): the seam that lets the
// tests refuse writes as a read-only /proc/sys or a user namespace does.
type keySysctls interface {
	read(name string) (int64, error)
	write(name string, v int64) error
}

// procKeys is the real keySysctls: the files under dir/sys/kernel/keys
// (dir is /proc).
type procKeys struct{ dir string }

func (p procKeys) path(name string) string {
	return filepath.Join(p.dir, "sys", "kernel", "keys", name)
}

func (p procKeys) read(name string) (int64, error) {
	b, err := os.ReadFile(p.path(name))
	if err != nil {
		return 0, fmt.Errorf("read kernel.keys.%s: %w", name, err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("kernel.keys.%s holds %q", name, b)
	}
	return v, nil
}

func (p procKeys) write(name string, v int64) error {
	return os.WriteFile(p.path(name), []byte(strconv.FormatInt(v, 10)), 0o644)
}

// keyQuota is what ensureKeyQuota found: Capacity is how many sandboxes
// the quota fits (at least maxSandboxes when it was, or could be made,
// large enough); Note says why Capacity is below maxSandboxes, for the
// refusal of a create beyond it.
type keyQuota struct {
	Capacity int
	Note     string
}

// ensureKeyQuota raises the kernel's per-user key quota
// (kernel.keys.maxkeys and maxbytes) when it is too small for
// maxSandboxes. Every sandbox's root maps to the same host uid and runc
// makes a session keyring for each container, so with the default quota
// (200 keys a user) creates fail at about 190 sandboxes with "unable to
// create session key: disk quota exceeded" whatever --max-sandboxes says.
// The quota is only ever raised, never lowered, and each change is
// logged; sandboxes cannot create keys themselves (the seccomp profile
// refuses add_key, request_key and keyctl).
//
// When the quota cannot be raised (a read-only /proc/sys in a container,
// a server in a non-init user namespace: EROFS, EACCES, EPERM) it does
// not fail: it logs a warning naming the effective capacity and returns
// it, and the server caps admission there, so that a create beyond it
// is refused as capacity_exceeded (naming the key quota) instead of
// failing in runc with an internal error. A quota that cannot be read
// is an error.
func ensureKeyQuota(sys keySysctls, maxSandboxes int, log *slog.Logger) (keyQuota, error) {
	wantKeys := int64(maxSandboxes)*keysPerSandbox + keysSpare
	q := keyQuota{Capacity: maxSandboxes}
	var short []string
	for _, s := range []struct {
		name     string
		want     int64
		capacity func(have int64) int64
	}{
		{"maxkeys", wantKeys, func(have int64) int64 { return (have - keysSpare) / keysPerSandbox }},
		{"maxbytes", wantKeys * keyBytesEach, func(have int64) int64 { return (have/keyBytesEach - keysSpare) / keysPerSandbox }},
	} {
		have, err := sys.read(s.name)
		if err != nil {
			return keyQuota{}, err
		}
		if have >= s.want {
			continue
		}
		err = sys.write(s.name, s.want)
		if err == nil {
			log.Warn("raised the kernel's per-user key quota: runc gives every sandbox a session keyring, charged to the sandboxes' one host uid",
				"sysctl", "kernel.keys."+s.name, "from", have, "to", s.want, "max_sandboxes", maxSandboxes)
			continue
		}
		c := int(max(1, min(s.capacity(have), int64(maxSandboxes))))
		q.Capacity = min(q.Capacity, c)
		short = append(short, fmt.Sprintf("kernel.keys.%s=%d", s.name, have))
		log.Warn("cannot raise the kernel's per-user key quota: runc gives every sandbox a session keyring, so admission is capped at what the quota fits; raise it on the host (sysctl -w kernel.keys."+s.name+"="+strconv.FormatInt(s.want, 10)+") for --max-sandboxes",
			"sysctl", "kernel.keys."+s.name, "have", have, "want", s.want, "max_sandboxes", maxSandboxes,
			"capacity", c, "err", err)
	}
	if q.Capacity < maxSandboxes {
		q.Note = fmt.Sprintf("capped from --max-sandboxes %d by the kernel's per-user key quota (%s), which the server could not raise; see the server log",
			maxSandboxes, strings.Join(short, ", "))
	}
	return q, nil
}
