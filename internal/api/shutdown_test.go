package api_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/api"
	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/runtime/runtimetest"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template/registry/registrytest"
)

// TestRefusedWhileShuttingDown: once the Manager's Shutdown has begun,
// every route whose work Shutdown waits for (snapshot, fork, save as a
// template, pause, resume, a new timeout) answers 503 unavailable, in
// the native shape and in E2B's, and changes nothing. The E2B timeout
// and connect routes answered 404 "not found" for a sandbox that runs.
func TestRefusedWhileShuttingDown(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.AddAPIKey(ctx, "admin", apiKey, "", "admin"); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	d := runtimetest.New()
	reg, _ := registrytest.New(t, st)
	m := sandbox.New(sandbox.Config{
		WatchInterval: 20 * time.Millisecond, KillGrace: time.Millisecond,
		SnapshotDir: filepath.Join(t.TempDir(), "snapshots"), MemoryPressure: func() bool { return false },
		Admission: govern.NewAdmission(govern.AdmissionConfig{MaxConcurrent: 10, MaxPerAgent: 10, AgentRate: 1000, AgentBurst: 1000}),
	}, st, d, reg, log)
	if err := m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.Config{Templates: reg}, m, st, log))
	t.Cleanup(srv.Close)
	e := &env{t: t, st: st, d: d, m: m, srv: srv}
	run := e.createNative(map[string]any{}).ID
	frozen := e.createNative(map[string]any{}).ID
	if _, err := m.Pause(ctx, frozen); err != nil {
		t.Fatal(err)
	}
	before := map[string]*store.Sandbox{}
	for _, id := range []string{run, frozen} {
		if before[id], err = st.GetSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	m.Shutdown(ctx, false)

	for _, c := range []struct {
		path, body string
		e2b        bool
	}{
		{path: "/v1/sandboxes/" + run + "/snapshots", body: `{}`},
		{path: "/v1/sandboxes/" + run + "/fork", body: `{}`},
		{path: "/v1/sandboxes/" + run + "/template", body: `{"ref":"saved:v1"}`},
		{path: "/v1/sandboxes/" + run + "/pause", body: `{}`},
		{path: "/v1/sandboxes/" + run + "/pause", body: `{"persist":true}`},
		{path: "/v1/sandboxes/" + frozen + "/resume", body: `{}`},
		{path: "/v1/sandboxes/" + run + "/timeout", body: `{"timeout":3600}`},
		{path: "/sandboxes/" + run + "/snapshots", body: `{}`, e2b: true},
		{path: "/sandboxes/" + run + "/fork", body: `{}`, e2b: true},
		{path: "/sandboxes/" + run + "/pause", body: `{}`, e2b: true},
		{path: "/sandboxes/" + frozen + "/resume", body: `{}`, e2b: true},
		{path: "/sandboxes/" + frozen + "/connect", body: `{}`, e2b: true},
		{path: "/sandboxes/" + run + "/connect", body: `{"timeout":86400}`, e2b: true},
		{path: "/sandboxes/" + run + "/timeout", body: `{"timeout":3600}`, e2b: true},
	} {
		var ae apiErr
		var ee struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		out := any(&ae)
		if c.e2b {
			out = &ee
		}
		status := e.call("POST", c.path, apiKey, c.body, out)
		switch {
		case status != http.StatusServiceUnavailable:
			t.Errorf("POST %s %s: %d %+v %+v, want 503", c.path, c.body, status, ae, ee)
		case !c.e2b && ae.Code != api.CodeUnavailable:
			t.Errorf("POST %s %s: code %q, want %q", c.path, c.body, ae.Code, api.CodeUnavailable)
		case c.e2b && (ee.Code != http.StatusServiceUnavailable || ee.Message != api.CodeUnavailable+": "+sandbox.ErrShuttingDown.Error()):
			t.Errorf("POST %s %s: %+v, want E2B's 503 unavailable", c.path, c.body, ee)
		}
	}
	for id, want := range map[string]string{run: store.StateRunning, frozen: store.StatePaused} {
		rec, err := st.GetSandbox(ctx, id)
		if err != nil || rec.State != want || rec.Persisted != "" || !rec.ExpiresAt.Equal(before[id].ExpiresAt) {
			t.Errorf("after the refusals %s is %+v (%v), want %s expiring %v as before", id, rec, err, want, before[id].ExpiresAt)
		}
	}
	if list, err := st.ListSnapshots(ctx, store.SnapshotFilter{}); err != nil || len(list) != 0 {
		t.Errorf("after the refusals the store holds snapshots %v (%v), want none", list, err)
	}
	if ids, _ := d.List(ctx); len(ids) != 2 || d.StateOf(run) != runtimetest.Running || d.StateOf(frozen) != runtimetest.Paused {
		t.Errorf("after the refusals the driver holds %v (%s, %s), want the two sandboxes as before", ids, d.StateOf(run), d.StateOf(frozen))
	}
}
