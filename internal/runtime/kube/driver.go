package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/proto/agentproto"
)

// Driver runs sandboxes as Pods. It reads Pods from a watch-fed cache (one
// watch for every sandbox of the namespace), so Alive, List and Dial cost
// the API server nothing; only Start, Stop and pool refills call it.
type Driver struct {
	opts    Options
	factory informers.SharedInformerFactory
	lister  corelisters.PodLister
	index   cache.Indexer
	stopc   chan struct{}
	http    *http.Client

	// mu guards changed, closed on every change the cache sees (and
	// replaced), so that waiters for a Pod's state need not poll.
	mu      sync.Mutex
	changed chan struct{}

	// refill wakes the pool filler.
	refill    chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// indexSandbox indexes Pods by their sandbox-id label.
const indexSandbox = "sandbox"

var _ runtime.Driver = (*Driver)(nil)
var _ runtime.LossReporter = (*Driver)(nil)
var _ runtime.Shared = (*Driver)(nil)
var _ runtime.EgressSwitch = (*Driver)(nil)

// SharedRuntime: every control plane on the cluster sees every sandbox
// Pod of the namespace, and may delete one.
func (d *Driver) SharedRuntime() bool { return true }

// New starts a driver: it checks the cluster (the NetworkPolicy-enforcing
// CNI when egress is on), applies the sandboxes' NetworkPolicy, starts
// the Pod watch and waits for its first listing, then starts filling the
// warm pools. Close stops it.
func New(ctx context.Context, opts Options) (*Driver, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if opts.Egress != nil && !opts.NetworkPolicyEnforced {
		if err := DetectPolicyCNI(ctx, opts.Client); err != nil {
			return nil, err
		}
	}
	if err := ensureNetworkPolicy(ctx, opts); err != nil {
		return nil, err
	}
	d := &Driver{opts: opts, stopc: make(chan struct{}), changed: make(chan struct{}), refill: make(chan struct{}, 1)}
	d.http = &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: d.dialPod}}
	d.factory = informers.NewSharedInformerFactoryWithOptions(opts.Client, 0,
		informers.WithNamespace(opts.Namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = selectorAll }))
	inf := d.factory.Core().V1().Pods()
	if err := inf.Informer().AddIndexers(cache.Indexers{indexSandbox: func(obj any) ([]string, error) {
		if p, ok := obj.(*corev1.Pod); ok && p.Labels[LabelSandbox] != "" {
			return []string{p.Labels[LabelSandbox]}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, err
	}
	notify := func(any) { d.notify() }
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: notify, DeleteFunc: notify, UpdateFunc: func(_, n any) { d.notify() },
	}); err != nil {
		return nil, err
	}
	d.lister = inf.Lister()
	d.index = inf.Informer().GetIndexer()
	d.factory.Start(d.stopc)
	synced := d.factory.WaitForCacheSync(ctxDone(ctx))
	for _, ok := range synced {
		if !ok {
			close(d.stopc)
			return nil, fmt.Errorf("kube: list the sandbox Pods of namespace %s: %w", opts.Namespace, context.Cause(ctx))
		}
	}
	if len(opts.Pools) > 0 {
		d.wg.Add(1)
		go d.fillPools()
	}
	return d, nil
}

// Close stops the watch and the pool filler (a second Close does
// nothing). Pods are left running: a new driver adopts them.
func (d *Driver) Close() error {
	d.closeOnce.Do(func() {
		close(d.stopc)
		d.factory.Shutdown()
		d.wg.Wait()
	})
	return nil
}

func ctxDone(ctx context.Context) <-chan struct{} { return ctx.Done() }

func (d *Driver) notify() {
	d.mu.Lock()
	close(d.changed)
	d.changed = make(chan struct{})
	d.mu.Unlock()
}

// waitFor calls cond on every cache change until it reports done (nil),
// fails (err), or ctx ends.
func (d *Driver) waitFor(ctx context.Context, cond func() (bool, error)) error {
	for {
		d.mu.Lock()
		ch := d.changed
		d.mu.Unlock()
		done, err := cond()
		if err != nil || done {
			return err
		}
		select {
		case <-ch:
		case <-time.After(time.Second): // a lost wake-up costs a second
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// pod returns sandbox id's Pod from the cache, nil if there is none.
func (d *Driver) pod(id string) *corev1.Pod {
	objs, err := d.index.ByIndex(indexSandbox, id)
	if err != nil || len(objs) == 0 {
		return nil
	}
	return objs[0].(*corev1.Pod)
}

// Start claims a ready Pod of a matching warm pool or creates one, waits
// until it is ready, and hands its agent the sandbox's token and
// environment.
func (d *Driver) Start(ctx context.Context, cfg runtime.Config) (*runtime.Handle, error) {
	if !idRE.MatchString(cfg.ID) {
		return nil, fmt.Errorf("kube: bad sandbox id %q", cfg.ID)
	}
	if len(cfg.AccessToken) < 16 {
		return nil, fmt.Errorf("kube: sandbox %s: an agent on TCP needs an access token of at least 16 characters", cfg.ID)
	}
	if len(cfg.Volumes) > 0 {
		return nil, fmt.Errorf("kube: sandbox %s: volumes: %w", cfg.ID, runtime.ErrUnsupported)
	}
	if len(cfg.Layers) > 0 {
		return nil, fmt.Errorf("kube: sandbox %s: snapshot layers: %w", cfg.ID, runtime.ErrUnsupported)
	}
	if p := d.pod(cfg.ID); p != nil {
		return nil, fmt.Errorf("kube: sandbox %s already has Pod %s", cfg.ID, p.Name)
	}
	spec := specOf(cfg)
	pod, err := d.claim(ctx, cfg, spec)
	if err != nil {
		// A claim may have succeeded before the wait failed.
		_ = d.Stop(context.WithoutCancel(ctx), cfg.ID, 0)
		return nil, err
	}
	if pod == nil {
		if pod, err = d.create(ctx, cfg, spec); err != nil {
			return nil, err
		}
	}
	if err := d.initAgent(ctx, cfg, pod); err != nil {
		_ = d.Stop(context.WithoutCancel(ctx), cfg.ID, 0)
		return nil, err
	}
	return &runtime.Handle{ID: cfg.ID}, nil
}

// create makes a Pod for cfg and waits until it is ready and the cache
// holds it.
func (d *Driver) create(ctx context.Context, cfg runtime.Config, spec podSpec) (*corev1.Pod, error) {
	p := d.newPod("corral-"+cfg.ID, spec, newBootstrap())
	p.Labels[LabelSandbox] = cfg.ID
	p.Labels[LabelTeam] = labelValue(cfg.Team)
	p.Labels[LabelState] = stateClaimed
	if cfg.Egress {
		p.Labels[LabelEgress] = egressOn
	}
	p.Annotations[AnnotationClaimedBy] = d.replica()
	p.Annotations[AnnotationTemplate] = cfg.Template
	created, err := d.opts.Client.CoreV1().Pods(d.opts.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kube: create Pod of sandbox %s: %w", cfg.ID, err)
	}
	wctx, cancel := context.WithTimeout(ctx, d.opts.ReadyTimeout)
	defer cancel()
	var ready *corev1.Pod
	err = d.waitFor(wctx, func() (bool, error) {
		cur, err := d.lister.Pods(d.opts.Namespace).Get(created.Name)
		if err != nil || cur.UID != created.UID {
			return false, nil
		}
		if why := deadReason(cur); why != "" {
			return false, fmt.Errorf("kube: Pod %s of sandbox %s ended before it was ready: %s", cur.Name, cfg.ID, why)
		}
		if podReady(cur) {
			ready = cur
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		_ = d.deletePod(context.WithoutCancel(ctx), created.Name, 0)
		return nil, fmt.Errorf("kube: wait for Pod %s of sandbox %s: %w", created.Name, cfg.ID, err)
	}
	return ready, nil
}

// initAgent pushes the sandbox's access token and environment to the
// agent of pod, authenticated with its bootstrap token (POST /init).
func (d *Driver) initAgent(ctx context.Context, cfg runtime.Config, pod *corev1.Pod) error {
	body, err := json.Marshal(agentproto.InitRequest{AccessToken: cfg.AccessToken, EnvVars: cfg.Env, TrustCA: string(cfg.TrustCA)})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last error
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(withPod(ctx, pod), http.MethodPost, "http://agent"+agentproto.InitPath, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set(agentproto.AccessTokenHeader, bootstrapOf(pod))
		req.Header.Set("Content-Type", "application/json")
		resp, err := d.http.Do(req)
		if err == nil {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent {
				return nil
			}
			// The agent answered and refused: retrying cannot help.
			return fmt.Errorf("kube: init the agent of sandbox %s (Pod %s): %s: %s", cfg.ID, pod.Name, resp.Status, bytes.TrimSpace(msg))
		}
		// Ready in the API but not yet listening (a probe's lag): retry.
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube: init the agent of sandbox %s (Pod %s): %w", cfg.ID, pod.Name, last)
		case <-time.After(time.Duration(min(attempt+1, 10)) * 50 * time.Millisecond):
		}
	}
}

type podKey struct{}

func withPod(ctx context.Context, p *corev1.Pod) context.Context {
	return context.WithValue(ctx, podKey{}, p)
}

// dialPod dials the agent of the Pod in ctx (the init call's transport).
func (d *Driver) dialPod(ctx context.Context, _, _ string) (net.Conn, error) {
	p, _ := ctx.Value(podKey{}).(*corev1.Pod)
	if p == nil {
		return nil, errors.New("kube: no Pod to dial")
	}
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", d.opts.AgentAddr(p))
}

// SetEgress admits sandbox id's Pod to the egress proxy (on: the label
// LabelEgress, which the NetworkPolicy PolicyEgressName selects) or shuts
// it out (off: the label removed), when the sandbox's network changes at
// run time. Shutting out defends against a sandbox whose network became
// none still reaching the proxy and DNS filter through the CNI; it
// returns once the API server has the change (the CNI applies it next).
func (d *Driver) SetEgress(ctx context.Context, id string, on bool) error {
	p := d.pod(id)
	if p == nil {
		return fmt.Errorf("kube: sandbox %s: %w", id, runtime.ErrNotFound)
	}
	var v any // null removes the label
	if on {
		v = egressOn
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{LabelEgress: v}}})
	if err != nil {
		return err
	}
	if _, err := d.opts.Client.CoreV1().Pods(d.opts.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("kube: sandbox %s: %w", id, runtime.ErrNotFound)
		}
		return fmt.Errorf("kube: set the egress label of Pod %s (sandbox %s): %w", p.Name, id, err)
	}
	return nil
}

// Stop deletes the sandbox's Pod with the grace period (the kubelet sends
// SIGTERM, then SIGKILL after it) and waits until the API server no
// longer has it.
func (d *Driver) Stop(ctx context.Context, id string, grace time.Duration) error {
	name := "corral-" + id
	if p := d.pod(id); p != nil {
		name = p.Name
	} else {
		// Not in the cache (yet): ask the API server.
		list, err := d.opts.Client.CoreV1().Pods(d.opts.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelSandbox + "=" + id})
		if err != nil {
			return fmt.Errorf("kube: stop sandbox %s: %w", id, err)
		}
		if len(list.Items) == 0 {
			return nil
		}
		name = list.Items[0].Name
	}
	return d.deletePod(ctx, name, grace)
}

// deletePod deletes Pod name and waits until the API server and the cache
// no longer hold it.
func (d *Driver) deletePod(ctx context.Context, name string, grace time.Duration) error {
	secs := int64(grace / time.Second)
	pods := d.opts.Client.CoreV1().Pods(d.opts.Namespace)
	err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &secs})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kube: delete Pod %s: %w", name, err)
	}
	wctx, cancel := context.WithTimeout(ctx, grace+2*time.Minute)
	defer cancel()
	return d.waitFor(wctx, func() (bool, error) {
		if _, err := d.lister.Pods(d.opts.Namespace).Get(name); err == nil {
			return false, nil
		}
		_, err := pods.Get(wctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, nil
	})
}

// List returns the ids of every sandbox Pod in the namespace, terminating
// ones included (idle pool Pods are no sandboxes yet).
func (d *Driver) List(context.Context) ([]string, error) {
	pods, err := d.lister.Pods(d.opts.Namespace).List(labels.Everything())
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, p := range pods {
		if id := p.Labels[LabelSandbox]; id != "" {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// Alive reports whether the sandbox's Pod runs: not deleted, not ended.
func (d *Driver) Alive(id string) bool {
	p := d.pod(id)
	return p != nil && p.DeletionTimestamp == nil && deadReason(p) == ""
}

// LostReason says why sandbox id's Pod is gone or ended (evicted, its
// node lost, the container exited), "" when it runs or was never seen.
func (d *Driver) LostReason(id string) string {
	p := d.pod(id)
	if p == nil {
		return "pod gone"
	}
	if p.DeletionTimestamp != nil {
		return "pod deleted"
	}
	return deadReason(p)
}

// Dial connects to the sandbox's agent at its Pod's address.
func (d *Driver) Dial(ctx context.Context, id string) (net.Conn, error) {
	p := d.pod(id)
	if p == nil || p.DeletionTimestamp != nil {
		return nil, fmt.Errorf("kube: dial sandbox %s: %w", id, runtime.ErrNotFound)
	}
	if p.Status.PodIP == "" {
		return nil, fmt.Errorf("kube: dial sandbox %s: Pod %s has no IP", id, p.Name)
	}
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "tcp", d.opts.AgentAddr(p))
	if err != nil {
		return nil, fmt.Errorf("kube: dial sandbox %s: %w", id, err)
	}
	return c, nil
}

// Stats reports what the API server knows of the sandbox: OOM kills of
// its container (the kubelet's OOMKilled). CPU, memory and disk readings
// live on the node (the metrics API), not here: they are zero.
func (d *Driver) Stats(id string) (runtime.Stats, error) {
	p := d.pod(id)
	if p == nil {
		return runtime.Stats{}, fmt.Errorf("kube: stats of sandbox %s: %w", id, runtime.ErrNotFound)
	}
	var st runtime.Stats
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil && t.Reason == "OOMKilled" {
			st.OOMKills++
		}
		if t := cs.LastTerminationState.Terminated; t != nil && t.Reason == "OOMKilled" {
			st.OOMKills++
		}
	}
	st.Time = time.Now()
	return st, nil
}

// unsupported is the error of an operation Kubernetes does not offer, or
// ErrNotFound for a sandbox the driver does not hold.
func (d *Driver) unsupported(op, id string) error {
	if d.pod(id) == nil {
		return fmt.Errorf("kube: %s sandbox %s: %w", op, id, runtime.ErrNotFound)
	}
	return fmt.Errorf("kube: %s sandbox %s: %w", op, id, runtime.ErrUnsupported)
}

// Pause is not offered: Kubernetes has no freezer for a Pod.
func (d *Driver) Pause(_ context.Context, id string) error { return d.unsupported("pause", id) }

// Resume is not offered (see Pause).
func (d *Driver) Resume(_ context.Context, id string) error { return d.unsupported("resume", id) }

// NetNS is not offered: the Pod's network is the CNI's.
func (d *Driver) NetNS(_ context.Context, id string) (string, error) {
	return "", d.unsupported("netns of", id)
}

// Processes is not offered: the node's process table is the kubelet's.
func (d *Driver) Processes(id string) ([]runtime.Process, error) {
	return nil, d.unsupported("processes of", id)
}

// Snapshot is not offered: the writable layer lives on the node.
func (d *Driver) Snapshot(_ context.Context, id, _ string) (int64, error) {
	return 0, d.unsupported("snapshot", id)
}

func (d *Driver) replica() string {
	if d.opts.Replica != "" {
		return d.opts.Replica
	}
	h, _ := os.Hostname()
	return h
}

// podReady reports whether the Pod has an IP and its Ready condition.
func podReady(p *corev1.Pod) bool {
	if p.Status.PodIP == "" || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// deadReason says why a Pod ended ("" while it runs or starts).
func deadReason(p *corev1.Pod) string {
	switch p.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		why := "pod " + string(p.Status.Phase)
		if p.Status.Reason != "" {
			why += ": " + p.Status.Reason
		}
		if p.Status.Message != "" {
			why += " (" + p.Status.Message + ")"
		}
		return why
	}
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil && cs.Name == containerName {
			return fmt.Sprintf("container exited %d: %s", t.ExitCode, t.Reason)
		}
	}
	return ""
}
