package kube

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

func ipPod(uid, sandbox, ip string, phase corev1.PodPhase) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "corral-" + uid, UID: types.UID(uid), Labels: map[string]string{}},
		Status: corev1.PodStatus{Phase: phase, PodIP: ip}}
	if sandbox != "" {
		p.Labels[LabelSandbox] = sandbox
	}
	return p
}

// TestPodIPsReuse: the index behind the cluster egress proxy never hands
// a reused Pod IP the old Pod's sandbox (its policy and secrets): not
// after the old Pod is deleted (directly or as a tombstone), not while
// the watch still holds the old Pod beside the new one (refused, not
// guessed), not while the old Pod is being deleted or has ended; and
// Pending, idle pool and unknown addresses are refused with a reason.
// It defends against IP reuse inheriting another sandbox's egress.
func TestPodIPsReuse(t *testing.T) {
	ip := netip.MustParseAddr("10.244.1.7")
	type step struct {
		do      func(p *PodIPs)
		sandbox string // want
		reason  string // want a reason containing this
	}
	a := ipPod("uid-a", "sba", "10.244.1.7", corev1.PodRunning)
	b := ipPod("uid-b", "sbb", "10.244.1.7", corev1.PodRunning)
	aDeleting := a.DeepCopy()
	now := metav1.Now()
	aDeleting.DeletionTimestamp = &now
	aEnded := a.DeepCopy()
	aEnded.Status.Phase = corev1.PodSucceeded
	cases := map[string][]step{
		"delete then new Pod": {
			{func(p *PodIPs) { p.set(a) }, "sba", ""},
			{func(p *PodIPs) { p.del(a) }, "", "no sandbox Pod"},
			{func(p *PodIPs) { p.set(b) }, "sbb", ""},
		},
		"tombstone delete": {
			{func(p *PodIPs) { p.set(a) }, "sba", ""},
			{func(p *PodIPs) { p.del(cache.DeletedFinalStateUnknown{Key: "ns/corral-uid-a", Obj: a}) }, "", "no sandbox Pod"},
			{func(p *PodIPs) { p.set(b) }, "sbb", ""},
		},
		"new Pod seen before the old one's deletion": {
			{func(p *PodIPs) { p.set(a) }, "sba", ""},
			{func(p *PodIPs) { p.set(b) }, "", "claimed by 2 running Pods"},
			{func(p *PodIPs) { p.del(a) }, "sbb", ""},
		},
		"old Pod being deleted": {
			{func(p *PodIPs) { p.set(a) }, "sba", ""},
			{func(p *PodIPs) { p.set(aDeleting) }, "", "being deleted"},
			{func(p *PodIPs) { p.set(b) }, "sbb", ""},
		},
		"old Pod ended": {
			{func(p *PodIPs) { p.set(a) }, "sba", ""},
			{func(p *PodIPs) { p.set(aEnded) }, "", "Succeeded, not Running"},
			{func(p *PodIPs) { p.set(b) }, "sbb", ""},
		},
		"pending, then running": {
			{func(p *PodIPs) { p.set(ipPod("uid-a", "sba", "10.244.1.7", corev1.PodPending)) }, "", "Pending, not Running"},
			{func(p *PodIPs) { p.set(a) }, "sba", ""},
		},
		"idle pool Pod": {
			{func(p *PodIPs) { p.set(ipPod("uid-a", "", "10.244.1.7", corev1.PodRunning)) }, "", "idle pool Pod"},
			{func(p *PodIPs) { p.set(a) }, "sba", ""}, // claimed
		},
		"IP moves away": {
			{func(p *PodIPs) { p.set(a) }, "sba", ""},
			{func(p *PodIPs) { p.set(ipPod("uid-a", "sba", "10.244.1.8", corev1.PodRunning)) }, "", "no sandbox Pod"},
		},
	}
	for name, steps := range cases {
		t.Run(name, func(t *testing.T) {
			var gone []string
			p := newPodIPs(func(id string) { gone = append(gone, id) })
			for i, s := range steps {
				s.do(p)
				got, why := p.Lookup(ip)
				if got != s.sandbox || (s.reason != "" && !strings.Contains(why, s.reason)) || (s.reason == "" && why != "") {
					t.Fatalf("step %d: Lookup = %q, %q; want %q, reason with %q", i, got, why, s.sandbox, s.reason)
				}
			}
			if name == "delete then new Pod" && (len(gone) != 1 || gone[0] != "sba") {
				t.Fatalf("onGone calls %v, want [sba]", gone)
			}
		})
	}
}
