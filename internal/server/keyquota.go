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

// ensureKeyQuota raises the kernel's per-user key quota
// (kernel.keys.maxkeys and maxbytes, under procDir/sys/kernel/keys) when
// it is too small for maxSandboxes. Every sandbox's root maps to the same
// host uid and runc makes a session keyring for each container, so with
// the default quota (200 keys a user) creates fail at about 190 sandboxes
// with "unable to create session key: disk quota exceeded" whatever
// --max-sandboxes says. The quota is only ever raised, never lowered, and
// each change is logged; sandboxes cannot create keys themselves (the
// seccomp profile refuses add_key, request_key and keyctl).
func ensureKeyQuota(procDir string, maxSandboxes int, log *slog.Logger) error {
	wantKeys := int64(maxSandboxes)*keysPerSandbox + keysSpare
	for _, q := range []struct {
		name string
		want int64
	}{{"maxkeys", wantKeys}, {"maxbytes", wantKeys * keyBytesEach}} {
		path := filepath.Join(procDir, "sys", "kernel", "keys", q.name)
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("read kernel.keys.%s: %w", q.name, err)
		}
		have, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return fmt.Errorf("kernel.keys.%s holds %q", q.name, b)
		}
		if have >= q.want {
			continue
		}
		if err := os.WriteFile(path, []byte(strconv.FormatInt(q.want, 10)), 0o644); err != nil {
			return fmt.Errorf("raise kernel.keys.%s from %d to %d for %d sandboxes: %w", q.name, have, q.want, maxSandboxes, err)
		}
		log.Warn("raised the kernel's per-user key quota: runc gives every sandbox a session keyring, charged to the sandboxes' one host uid",
			"sysctl", "kernel.keys."+q.name, "from", have, "to", q.want, "max_sandboxes", maxSandboxes)
	}
	return nil
}
