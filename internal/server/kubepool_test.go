package server

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/runtime/runtimetest"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template/registry/registrytest"
)

// TestKubePoolsMatchColdCreate defends against a warm pool whose Pods
// differ from a cold create of their template: --kube-pools made every
// pool's Pods as for a template with sudo (privilege escalation allowed,
// NoNewPrivileges false), whatever the template offered, so a template
// without sudo (cold creates: no_new_privs) had a pool no create could
// claim, its idle Pods allowing escalation. Now each pool is built from
// what a cold create of the template gets (sandbox.TemplateDefaults, the
// rule the Manager's create follows): for a template with sudo, without
// it, and with a sudo that is a link out of the template (no_new_privs),
// the pool serves the cold create's runtime.Config, taken from the real
// Manager's Start. A template not in the registry gets a pool without
// escalation and a warning.
func TestKubePoolsMatchColdCreate(t *testing.T) {
	for _, tc := range []struct {
		name       string
		sudo       func(t *testing.T, rootfs string)
		noNewPrivs bool
	}{
		{"template without sudo", func(*testing.T, string) {}, true},
		{"template with sudo", func(t *testing.T, rootfs string) {
			writeFile(t, filepath.Join(rootfs, "usr/bin/sudo"), "#!/bin/sh\n")
		}, false},
		{"sudo a link out of the template", func(t *testing.T, rootfs string) {
			if err := os.MkdirAll(filepath.Join(rootfs, "usr/bin"), 0o755); err != nil {
				t.Fatal(err)
			}
			host := filepath.Join(t.TempDir(), "sudo")
			writeFile(t, host, "#!/bin/sh\n")
			if err := os.Symlink(host, filepath.Join(rootfs, "usr/bin/sudo")); err != nil {
				t.Fatal(err)
			}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			reg, rootfs := registrytest.New(t, st)
			tc.sudo(t, rootfs)
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			d := runtimetest.New()
			m := sandbox.New(sandbox.Config{WatchInterval: time.Hour, KillGrace: time.Millisecond, SnapshotDir: filepath.Join(t.TempDir(), "snapshots"),
				MemoryPressure: func() bool { return false },
				Admission:      govern.NewAdmission(govern.AdmissionConfig{MaxConcurrent: 4, MaxPerAgent: 4, AgentRate: 1000, AgentBurst: 1000})},
				st, d, reg, log)
			defer m.Shutdown(context.Background(), true)
			sb, err := m.Create(context.Background(), sandbox.CreateRequest{Template: "base"})
			if err != nil {
				t.Fatal(err)
			}
			cold, ok := d.Config(sb.ID)
			if !ok {
				t.Fatal("the driver holds no config of the cold create")
			}
			if cold.NoNewPrivileges != tc.noNewPrivs {
				t.Fatalf("cold create: NoNewPrivileges %v, want %v", cold.NoNewPrivileges, tc.noNewPrivs)
			}
			pools, err := KubeConfig{Image: "img", Pools: "base=3"}.pools(context.Background(), reg, log)
			if err != nil || len(pools) != 1 {
				t.Fatalf("pools: %v %+v", err, pools)
			}
			if p := pools[0]; !p.Serves(cold) || p.NoNewPrivileges != tc.noNewPrivs || p.Size != 3 {
				t.Fatalf("pool %+v does not serve the cold create %+v", p, cold)
			}
		})
	}
	t.Run("template not in the registry", func(t *testing.T) {
		st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		reg, _ := registrytest.New(t, st)
		var logBuf bytes.Buffer
		pools, err := KubeConfig{Image: "img", Pools: "later=2"}.pools(context.Background(), reg, slog.New(slog.NewTextHandler(&logBuf, nil)))
		if err != nil || len(pools) != 1 || !pools[0].NoNewPrivileges || !strings.Contains(logBuf.String(), "level=WARN") {
			t.Fatalf("pools %+v, %v, log %q: want one pool without escalation and a warning", pools, err, logBuf.String())
		}
	})
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
}
