package kube

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// PodIPs maps a source Pod IP to the sandbox whose Pod has it, for the
// egress proxy running in the cluster (`corral egress-proxy`), which tells
// sandboxes apart by the source address of their connections. It is fed
// by one watch of the sandbox Pods (corral's labels) of a namespace and
// needs get, list and watch on Pods there, nothing else.
//
// It defends against a sandbox getting another's egress policy or
// secrets through an IP address: entries are keyed by Pod UID (never by
// IP alone), a Pod counts only while it is Running with an IP, claimed by
// a sandbox and not being deleted, and an entry is dropped the moment the
// watch reports its Pod deleted, ended or its IP changed. When two Pods
// the watch still holds claim one IP (an IP reused before the old Pod's
// deletion reached the watch), the address is refused rather than given
// to either. Until the first listing, and after the watch fails until it
// lists again, every address is refused: a stale index could map a
// reused IP to a Pod that is gone.
type PodIPs struct {
	factory informers.SharedInformerFactory
	inf     cache.SharedIndexInformer
	stopc   chan struct{}
	once    sync.Once

	mu    sync.RWMutex
	byUID map[types.UID]podIP
	byIP  map[netip.Addr]map[types.UID]struct{}

	// staleAt is the resourceVersion the informer had synced when its
	// watch last failed ("" while it is healthy): until it has synced a
	// newer one the index may miss deletions, and Lookup refuses.
	staleAt atomic.Pointer[string]

	onGone func(sandbox string)
}

// podIP is what the index keeps of one sandbox Pod.
type podIP struct {
	uid     types.UID
	name    string
	sandbox string // "" for an idle pool Pod
	ip      netip.Addr
	phase   corev1.PodPhase
	deleted bool // deletionTimestamp set
}

// WatchPodIPs starts the watch of namespace's sandbox Pods and waits for
// its first listing. onGone, when set, is called with the sandbox id of a
// Pod that left the index (deleted, ended, lost its IP), so that per
// sandbox state (the proxy's caps) is forgotten with it. Close stops it.
func WatchPodIPs(ctx context.Context, client kubernetes.Interface, namespace string, onGone func(sandbox string)) (*PodIPs, error) {
	p := newPodIPs(onGone)
	p.factory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = selectorAll }))
	p.inf = p.factory.Core().V1().Pods().Informer()
	if err := p.inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		rv := p.inf.LastSyncResourceVersion()
		p.staleAt.Store(&rv)
	}); err != nil {
		return nil, err
	}
	if _, err := p.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    p.set,
		UpdateFunc: func(_, n any) { p.set(n) },
		DeleteFunc: p.del,
	}); err != nil {
		return nil, err
	}
	p.factory.Start(p.stopc)
	for _, ok := range p.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			p.Close()
			return nil, fmt.Errorf("kube: list the sandbox Pods of namespace %s: %w", namespace, context.Cause(ctx))
		}
	}
	return p, nil
}

func newPodIPs(onGone func(string)) *PodIPs {
	return &PodIPs{stopc: make(chan struct{}), byUID: map[types.UID]podIP{},
		byIP: map[netip.Addr]map[types.UID]struct{}{}, onGone: onGone}
}

// Close stops the watch (a second Close does nothing).
func (p *PodIPs) Close() {
	p.once.Do(func() {
		close(p.stopc)
		if p.factory != nil {
			p.factory.Shutdown()
		}
	})
}

// set records (or updates) a Pod the watch reports.
func (p *PodIPs) set(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	e := podIP{uid: pod.UID, name: pod.Name, sandbox: pod.Labels[LabelSandbox], phase: pod.Status.Phase,
		deleted: pod.DeletionTimestamp != nil}
	if a, err := netip.ParseAddr(pod.Status.PodIP); err == nil {
		e.ip = a.Unmap()
	}
	p.mu.Lock()
	old, had := p.byUID[e.uid]
	p.unindex(old, had)
	p.byUID[e.uid] = e
	if e.ip.IsValid() {
		s := p.byIP[e.ip]
		if s == nil {
			s = map[types.UID]struct{}{}
			p.byIP[e.ip] = s
		}
		s[e.uid] = struct{}{}
	}
	p.mu.Unlock()
	if had && old.serves() && (!e.serves() || old.ip != e.ip || old.sandbox != e.sandbox) {
		p.gone(old.sandbox)
	}
}

// del forgets a deleted Pod.
func (p *PodIPs) del(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	p.mu.Lock()
	old, had := p.byUID[pod.UID]
	p.unindex(old, had)
	delete(p.byUID, pod.UID)
	p.mu.Unlock()
	if had && old.sandbox != "" {
		p.gone(old.sandbox)
	}
}

// unindex removes e from byIP; p.mu is held.
func (p *PodIPs) unindex(e podIP, had bool) {
	if !had || !e.ip.IsValid() {
		return
	}
	if s := p.byIP[e.ip]; s != nil {
		delete(s, e.uid)
		if len(s) == 0 {
			delete(p.byIP, e.ip)
		}
	}
}

func (p *PodIPs) gone(sandbox string) {
	if sandbox != "" && p.onGone != nil {
		p.onGone(sandbox)
	}
}

// serves reports whether traffic from the Pod's IP may be its sandbox's.
func (e podIP) serves() bool {
	return e.sandbox != "" && e.ip.IsValid() && e.phase == corev1.PodRunning && !e.deleted
}

// Lookup returns the sandbox whose Running Pod has the IP addr. When there
// is none it returns "" and why, for the refusal and the audit event: no
// sandbox Pod has the IP, the Pod is an idle pool Pod, not Running, being
// deleted, or two Pods claim the IP; or the index is not current.
func (p *PodIPs) Lookup(addr netip.Addr) (sandbox, reason string) {
	addr = addr.Unmap().WithZone("")
	if rv := p.staleAt.Load(); rv != nil {
		if p.inf.LastSyncResourceVersion() == *rv {
			return "", fmt.Sprintf("source %s: the watch of sandbox Pods failed and has not listed them again (a reused IP could be mistaken)", addr)
		}
		p.staleAt.CompareAndSwap(rv, nil)
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	uids := p.byIP[addr]
	var live []podIP
	for uid := range uids {
		if e := p.byUID[uid]; e.phase == corev1.PodRunning && !e.deleted {
			live = append(live, e)
		}
	}
	switch {
	case len(live) > 1:
		return "", fmt.Sprintf("source %s is claimed by %d running Pods (an IP reused before the old Pod's deletion was seen); refused until one is gone", addr, len(live))
	case len(live) == 1 && live[0].sandbox == "":
		return "", fmt.Sprintf("source %s is the idle pool Pod %s, which belongs to no sandbox yet", addr, live[0].name)
	case len(live) == 1:
		return live[0].sandbox, ""
	}
	for uid := range uids {
		e := p.byUID[uid]
		if e.deleted {
			return "", fmt.Sprintf("source %s is Pod %s, which is being deleted", addr, e.name)
		}
		return "", fmt.Sprintf("source %s is Pod %s, which is %s, not Running", addr, e.name, e.phase)
	}
	return "", fmt.Sprintf("source %s is no sandbox Pod's IP", addr)
}
