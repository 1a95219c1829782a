package kube

import (
	"context"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPooledPodMatchesCold defends against a pooled sandbox that differs
// from a cold one of the same template (privilege escalation, limits,
// image, runtime class): for a template with sudo (NoNewPrivileges
// false) and one without (true), a Start that matches the pool claims a
// pool Pod whose container is made exactly as a cold Start's Pod (same
// security context, resources, image, runtime class); and a Start that
// differs from the pool in NoNewPrivileges alone is not served from it.
// The server builds --kube-pools from the template's cold settings
// (TestKubePoolsMatchColdCreate in internal/server).
func TestPooledPodMatchesCold(t *testing.T) {
	c := testCluster(t)
	ns := c.namespace(t)
	ag := startAgents(t, c, ns, "")
	ctx := context.Background()
	podOf := func(id string) corev1.Pod {
		t.Helper()
		l, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelSandbox + "=" + id})
		if err != nil || len(l.Items) != 1 {
			t.Fatalf("Pods of sandbox %s: %v, %v", id, l, err)
		}
		return l.Items[0]
	}
	for _, noNewPrivs := range []bool{false, true} {
		name := "sudo"
		if noNewPrivs {
			name = "nosudo"
		}
		t.Run(name, func(t *testing.T) {
			cfg := testConfig("pool" + name)
			cfg.NoNewPrivileges = noNewPrivs
			pool := Pool{Template: cfg.Template, Runtime: cfg.Runtime, Resources: cfg.Resources, DefaultUser: cfg.DefaultUser,
				NoNewPrivileges: noNewPrivs, Size: 1}
			if !pool.Serves(cfg) {
				t.Fatalf("pool %+v does not serve %+v", pool, cfg)
			}
			pooled := newDriver(t, c, ns, ag, "pooled-"+name, func(o *Options) { o.Pools = []Pool{pool} })
			waitPool(t, pooled, 1)
			if _, err := pooled.Start(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			pp := podOf(cfg.ID)
			if !strings.HasPrefix(pp.Name, "corral-pool-") {
				t.Fatalf("sandbox %s got Pod %s, not the pool's", cfg.ID, pp.Name)
			}
			coldCfg := testConfig("cold" + name)
			coldCfg.NoNewPrivileges = noNewPrivs
			cold := newDriver(t, c, ns, ag, "cold-"+name, nil)
			if _, err := cold.Start(ctx, coldCfg); err != nil {
				t.Fatal(err)
			}
			cp := podOf(coldCfg.ID)
			pc, cc := pp.Spec.Containers[0], cp.Spec.Containers[0]
			if !reflect.DeepEqual(pc.SecurityContext, cc.SecurityContext) || !reflect.DeepEqual(pc.Resources, cc.Resources) || pc.Image != cc.Image ||
				!reflect.DeepEqual(pp.Spec.RuntimeClassName, cp.Spec.RuntimeClassName) {
				t.Fatalf("pooled Pod differs from a cold one:\npooled %+v %+v %s\ncold   %+v %+v %s", pc.SecurityContext, pc.Resources, pc.Image,
					cc.SecurityContext, cc.Resources, cc.Image)
			}
			if esc := pc.SecurityContext.AllowPrivilegeEscalation; esc == nil || *esc == noNewPrivs {
				t.Fatalf("pooled Pod: allowPrivilegeEscalation %v with NoNewPrivileges %v", esc, noNewPrivs)
			}
			// Differing in NoNewPrivileges alone: a Pod of its own.
			waitPool(t, pooled, 1)
			other := testConfig("other" + name)
			other.NoNewPrivileges = !noNewPrivs
			if pool.Serves(other) {
				t.Fatalf("pool %+v serves %+v", pool, other)
			}
			if _, err := pooled.Start(ctx, other); err != nil {
				t.Fatal(err)
			}
			if op := podOf(other.ID); strings.HasPrefix(op.Name, "corral-pool-") {
				t.Fatalf("sandbox %s (NoNewPrivileges %v) got pool Pod %s of a pool with %v", other.ID, other.NoNewPrivileges, op.Name, noNewPrivs)
			}
			for _, d := range []struct {
				d  *Driver
				id string
			}{{pooled, cfg.ID}, {cold, coldCfg.ID}, {pooled, other.ID}} {
				if err := d.d.Stop(ctx, d.id, 0); err != nil {
					t.Error(err)
				}
			}
		})
	}
}
