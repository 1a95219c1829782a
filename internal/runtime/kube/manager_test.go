package kube

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template/registry"
	"github.com/corralhq/corral/internal/template/registry/registrytest"
)

// controlPlane is a sandbox.Manager over a real SQLite store and the kube
// driver: the control plane as `corral serve --driver kube` runs it.
type controlPlane struct {
	st  *store.Store
	reg *registry.Registry
}

func newControlPlane(t *testing.T) *controlPlane {
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	reg, _ := registrytest.New(t, st)
	return &controlPlane{st: st, reg: reg}
}

// open starts a Manager over d and reconciles, as a server start does.
func (cp *controlPlane) open(t *testing.T, d runtime.Driver) *sandbox.Manager {
	t.Helper()
	return cp.openWith(t, d, nil)
}

// openWith is open with the Manager's Config adjusted by mod.
func (cp *controlPlane) openWith(t *testing.T, d runtime.Driver, mod func(*sandbox.Config)) *sandbox.Manager {
	t.Helper()
	cfg := sandbox.Config{WatchInterval: 100 * time.Millisecond, KillGrace: time.Second,
		MemoryPressure: func() bool { return false },
		Admission:      govern.NewAdmission(govern.AdmissionConfig{MaxConcurrent: 50, MaxPerAgent: 50, AgentRate: 1000, AgentBurst: 1000})}
	if mod != nil {
		mod(&cfg)
	}
	m := sandbox.New(cfg, cp.st, d, cp.reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := m.Reconcile(context.Background()); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	return m
}

func waitRecord(t *testing.T, st *store.Store, id, state string) *store.Sandbox {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		rec, err := st.GetSandbox(context.Background(), id)
		if err == nil && rec.State == state {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s: not %s after 2 min: %+v, %v", id, state, rec, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestReconcileRestart: a control plane restarted over the same store and
// cluster adopts the sandboxes whose Pods run (their agents answer their
// tokens), ends with a reason those whose Pods were lost meanwhile (a
// node gone, an eviction: the record must not say running for a sandbox
// that is no more), and deletes sandbox Pods the store does not know
// (orphans that would run, and cost, for ever).
func TestReconcileRestart(t *testing.T) {
	c := testCluster(t)
	ns := c.namespace(t)
	ag := startAgents(t, c, ns, "")
	cp := newControlPlane(t)
	d1 := newDriver(t, c, ns, ag, "before", nil)
	m1 := cp.open(t, d1)
	ctx := context.Background()
	kept, err := m1.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	lost, err := m1.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	m1.Shutdown(ctx, false)
	d1.Close()

	// Meanwhile: the lost sandbox's Pod goes away, and a Pod appears that
	// no record knows (a replica that died between its create and its
	// record, say).
	zero := int64(0)
	if err := c.client.CoreV1().Pods(ns).Delete(ctx, "corral-"+lost.ID, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	c.waitPodsGone(t, ns, LabelSandbox+"="+lost.ID)
	raw := newDriver(t, c, ns, ag, "other", nil)
	if _, err := raw.Start(ctx, testConfig("orphan1")); err != nil {
		t.Fatal(err)
	}

	d2 := newDriver(t, c, ns, ag, "after", nil)
	m2 := cp.open(t, d2)
	t.Cleanup(func() { m2.Shutdown(ctx, true) })

	if rec := waitRecord(t, cp.st, kept.ID, store.StateRunning); rec.EndReason != "" {
		t.Fatalf("adopted sandbox: %+v", rec)
	}
	if err := agentList(d2, kept.ID, kept.AccessToken); err != nil {
		t.Fatalf("the adopted sandbox's agent: %v", err)
	}
	rec := waitRecord(t, cp.st, lost.ID, store.StateEnded)
	if rec.EndReason != sandbox.EndOrphaned || rec.Error != "pod gone" {
		t.Fatalf("lost sandbox ended with reason %q, error %q; want %q and the Pod's fate", rec.EndReason, rec.Error, sandbox.EndOrphaned)
	}
	c.waitPodsGone(t, ns, LabelSandbox+"=orphan1")
}

// TestKillAndTTL: a kill and a TTL's end delete the sandbox's Pod (a Pod
// left behind keeps running and costing on its node).
func TestKillAndTTL(t *testing.T) {
	c := testCluster(t)
	ns := c.namespace(t)
	ag := startAgents(t, c, ns, "")
	cp := newControlPlane(t)
	m := cp.open(t, newDriver(t, c, ns, ag, "cp", nil))
	ctx := context.Background()
	t.Cleanup(func() { m.Shutdown(ctx, true) })

	killed, err := m.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Kill(ctx, killed.ID); err != nil {
		t.Fatal(err)
	}
	c.waitPodsGone(t, ns, LabelSandbox+"="+killed.ID)
	if rec := waitRecord(t, cp.st, killed.ID, store.StateEnded); rec.EndReason != sandbox.EndKilled {
		t.Fatalf("killed sandbox: reason %q", rec.EndReason)
	}

	ttl := int64(2)
	expiring, err := m.Create(ctx, sandbox.CreateRequest{Timeout: &ttl})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.client.CoreV1().Pods(ns).Get(ctx, "corral-"+expiring.ID, metav1.GetOptions{}); err != nil {
		t.Fatalf("Pod of a running sandbox: %v", err)
	}
	c.waitPodsGone(t, ns, LabelSandbox+"="+expiring.ID)
	if rec := waitRecord(t, cp.st, expiring.ID, store.StateEnded); rec.EndReason != sandbox.EndTTL {
		t.Fatalf("expired sandbox: reason %q", rec.EndReason)
	}
}
