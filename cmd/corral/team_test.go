package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/api"
	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/runtime/runtimetest"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template/registry/registrytest"
	corral "github.com/corralhq/corral/sdk/go"
)

// TestCLITeamQuota: `corral team quota T` shows the quota in force and
// where each value comes from; its flags change only the fields given
// (the rest of the override stays) and --reset drops it; a bad value is a
// usage error (exit 2) naming the field, and nothing changes; `team ls`
// lists the teams; a member key is refused (forbidden, exit 1).
func TestCLITeamQuota(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	admin, member := store.NewKeyValue(), store.NewKeyValue()
	if err := st.AddAPIKey(ctx, "admin", admin, "", store.RoleAdmin); err != nil {
		t.Fatal(err)
	}
	if err := st.AddAPIKey(ctx, "member", member, "research", store.RoleMember); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg, _ := registrytest.New(t, st)
	m := sandbox.New(sandbox.Config{WatchInterval: time.Second, SnapshotDir: t.TempDir(), MemoryPressure: func() bool { return false },
		Admission: govern.NewAdmission(govern.AdmissionConfig{Team: govern.TeamQuota{MaxCPUs: 8}})}, st, runtimetest.New(), reg, log)
	if err := m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.Config{Templates: reg}, m, st, log))
	t.Cleanup(func() { srv.Close(); m.Shutdown(ctx, true); st.Close() })
	t.Setenv("CORRAL_URL", srv.URL)
	t.Setenv("CORRAL_API_KEY", admin)

	quota := func(args ...string) corral.Team {
		t.Helper()
		out, errOut, code := runCLI(t, append([]string{"team", "quota", "research", "--json"}, args...)...)
		var tm corral.Team
		if code != 0 || json.Unmarshal([]byte(out), &tm) != nil {
			t.Fatalf("team quota %q: exit %d %q %q", args, code, out, errOut)
		}
		return tm
	}
	out, errOut, code := runCLI(t, "team", "quota", "research")
	if code != 0 || !strings.Contains(out, "team research: 0 running") || !strings.Contains(out, "max-cpus       8      default") ||
		!strings.Contains(out, "max-sandboxes  -      default") {
		t.Fatalf("team quota research: %d %q %q", code, out, errOut)
	}
	out, _, code = runCLI(t, "team", "quota", "research", "--max-sandboxes", "2", "--max-cpus", "1.5")
	if code != 0 || !strings.Contains(out, "max-sandboxes  2      team") || !strings.Contains(out, "max-cpus       1.5    team") {
		t.Fatalf("set quota: %d %q", code, out)
	}
	if tm := quota("--create-rate", "3"); tm.Override.MaxSandboxes == nil || *tm.Override.MaxSandboxes != 2 ||
		tm.Override.CreateRate == nil || *tm.Override.CreateRate != 3 || tm.Quota.MaxCPUs != 1.5 {
		t.Fatalf("a further flag dropped the others: %+v", tm)
	}
	if _, errOut, code := runCLI(t, "team", "quota", "research", "--max-memory-mb", "-5"); code != 2 || !strings.Contains(errOut, "max_memory_mb") {
		t.Fatalf("bad value: exit %d %q; want 2 naming max_memory_mb", code, errOut)
	}
	if tm := quota(); tm.Override.MaxMemoryMB != nil || tm.Quota.MaxSandboxes != 2 {
		t.Fatalf("a refused value changed the quota: %+v", tm)
	}
	out, _, code = runCLI(t, "team", "ls")
	if code != 0 || !strings.Contains(out, "default") || !strings.Contains(out, "research") {
		t.Fatalf("team ls: %d %q", code, out)
	}
	if tm := quota("--reset"); tm.Override != (corral.QuotaOverride{}) || tm.Quota != (corral.TeamQuota{MaxCPUs: 8}) {
		t.Fatalf("--reset: %+v", tm)
	}
	t.Setenv("CORRAL_API_KEY", member)
	if _, errOut, code := runCLI(t, "team", "quota", "research", "--max-sandboxes", "100"); code != 1 || !strings.Contains(errOut, "forbidden") {
		t.Fatalf("member: exit %d %q; want 1 forbidden", code, errOut)
	}
}
