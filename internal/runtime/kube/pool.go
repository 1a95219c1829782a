package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/corralhq/corral/internal/idgen"
	"github.com/corralhq/corral/internal/runtime"
)

// poolFor returns the configured pool serving spec, if any.
func (d *Driver) poolFor(spec podSpec) (Pool, bool) {
	for _, p := range d.opts.Pools {
		if p.spec() == spec && p.Size > 0 {
			return p, true
		}
	}
	return Pool{}, false
}

// idlePods lists the ready, unclaimed Pods of pool key in the cache.
func (d *Driver) idlePods(key string) []*corev1.Pod {
	sel := labels.SelectorFromSet(labels.Set{LabelPool: key, LabelState: stateIdle})
	pods, _ := d.lister.Pods(d.opts.Namespace).List(sel)
	var out []*corev1.Pod
	for _, p := range pods {
		if p.Labels[LabelSandbox] == "" && podReady(p) {
			out = append(out, p)
		}
	}
	return out
}

// claim takes a ready Pod of the pool serving spec for sandbox cfg.ID, or
// returns nil when there is no such pool or it has no ready Pod.
//
// The claim is a merge patch of the Pod's labels that carries the
// resourceVersion the driver read: the API server applies it only if the
// Pod has not changed since, so of two control planes that pick the same
// idle Pod one wins and the other gets a conflict and tries the next Pod.
// This is what keeps two replicas from handing out one Pod (and so one
// sandbox's files and processes) to two callers; TestClaimRace checks it.
func (d *Driver) claim(ctx context.Context, cfg runtime.Config, spec podSpec) (*corev1.Pod, error) {
	if _, ok := d.poolFor(spec); !ok {
		return nil, nil
	}
	idle := d.idlePods(spec.key())
	rand.Shuffle(len(idle), func(i, j int) { idle[i], idle[j] = idle[j], idle[i] })
	pods := d.opts.Client.CoreV1().Pods(d.opts.Namespace)
	for _, p := range idle {
		// A pool Pod is made without LabelEgress (it belongs to nobody):
		// the claim adds it for a sandbox with egress, and removes any
		// for one without (null in a merge patch).
		var eg any
		if cfg.Egress {
			eg = egressOn
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": p.ResourceVersion,
			"labels": map[string]any{
				LabelSandbox: cfg.ID, LabelTeam: labelValue(cfg.Team), LabelState: stateClaimed, LabelEgress: eg,
			},
			"annotations": map[string]string{AnnotationClaimedBy: d.replica(), AnnotationTemplate: cfg.Template},
		}})
		if err != nil {
			return nil, err
		}
		got, err := pods.Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			continue // another replica took it, or it went away
		}
		if err != nil {
			return nil, fmt.Errorf("kube: claim Pod %s for sandbox %s: %w", p.Name, cfg.ID, err)
		}
		d.wakeRefill()
		// Start returns once the cache holds the claim, so that List,
		// Alive and Dial see the sandbox.
		err = d.waitFor(ctx, func() (bool, error) {
			cur := d.pod(cfg.ID)
			return cur != nil && cur.UID == got.UID, nil
		})
		if err != nil {
			return nil, err
		}
		return got, nil
	}
	d.wakeRefill()
	return nil, nil
}

func (d *Driver) wakeRefill() {
	select {
	case d.refill <- struct{}{}:
	default:
	}
}

// refillParallel bounds the Pod creations one refill round has in flight.
const refillParallel = 16

// fillPools keeps every pool at its size: it creates the missing Pods
// (idle or starting ones count) and deletes pool Pods that ended before a
// claim. It runs until Close; a claim wakes it, else it looks every 2 s.
// Several replicas fill the same pools, so right after claims a pool may
// briefly hold more than its size; claims drain the excess.
func (d *Driver) fillPools() {
	defer d.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-d.stopc; cancel() }()
	for {
		for _, p := range d.opts.Pools {
			d.fillPool(ctx, p)
		}
		select {
		case <-d.stopc:
			return
		case <-d.refill:
		case <-time.After(2 * time.Second):
		}
	}
}

func (d *Driver) fillPool(ctx context.Context, pool Pool) {
	spec := pool.spec()
	sel := labels.SelectorFromSet(labels.Set{LabelPool: spec.key(), LabelState: stateIdle})
	pods, _ := d.lister.Pods(d.opts.Namespace).List(sel)
	have := 0
	for _, p := range pods {
		if p.Labels[LabelSandbox] != "" || p.DeletionTimestamp != nil {
			continue
		}
		if why := deadReason(p); why != "" {
			d.opts.Log.Warn("kube: pool Pod ended before a claim; deleting it", "pod", p.Name, "reason", why)
			_ = d.opts.Client.CoreV1().Pods(d.opts.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{})
			continue
		}
		have++
	}
	missing := pool.Size - have
	if missing <= 0 {
		return
	}
	sem := make(chan struct{}, refillParallel)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var created []string
	for range missing {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			p := d.newPod("corral-pool-"+idgen.Hex(6), spec, newBootstrap())
			p.Labels[LabelState] = stateIdle
			if _, err := d.opts.Client.CoreV1().Pods(d.opts.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				if ctx.Err() == nil {
					d.opts.Log.Warn("kube: create pool Pod", "template", pool.Template, "err", err)
				}
				return
			}
			mu.Lock()
			created = append(created, p.Name)
			mu.Unlock()
		}()
	}
	wg.Wait()
	// Wait for the cache to see what was created, so the next round does
	// not count it missing again.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = d.waitFor(wctx, func() (bool, error) {
		for _, name := range created {
			if _, err := d.lister.Pods(d.opts.Namespace).Get(name); err != nil {
				return false, nil
			}
		}
		return true, nil
	})
}

// PoolStatus is what a warm pool holds now.
type PoolStatus struct {
	Template    string
	Size, Ready int
}

// Pools reports every configured pool's ready Pods.
func (d *Driver) Pools() []PoolStatus {
	var out []PoolStatus
	for _, p := range d.opts.Pools {
		out = append(out, PoolStatus{Template: p.Template, Size: p.Size, Ready: len(d.idlePods(p.spec().key()))})
	}
	return out
}
