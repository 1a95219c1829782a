package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/corralhq/corral/internal/agentclient"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/runtime/drivertest"
	"github.com/corralhq/corral/proto/process"
	"github.com/corralhq/corral/proto/process/processconnect"
)

// newDriver returns a driver over namespace ns of c with its own API
// client (as a separate control-plane replica has), reaching agents
// through ag. mod adjusts the options.
func newDriver(t testing.TB, c *cluster, ns string, ag *agents, replica string, mod func(*Options)) *Driver {
	t.Helper()
	client, err := kubernetes.NewForConfig(c.config)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Client: client, Namespace: ns, DefaultImage: "registry.example/corral/base:test",
		Replica: replica, AgentAddr: ag.addr, ControlPlaneNamespace: "corral"}
	if mod != nil {
		mod(&o)
	}
	d, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// testConfig is a sandbox Config for the kube tests.
func testConfig(id string) runtime.Config {
	return runtime.Config{ID: id, Runtime: runtime.Runc, Template: "base:3", Team: "acme",
		Resources:   runtime.Resources{CPU: 0.5, MemoryBytes: 256 << 20, DiskBytes: 64 << 20, Pids: 128, Nofile: 1024},
		Env:         map[string]string{"SANDBOX_SECRET_ENV": "env-value-not-in-the-pod"},
		DefaultUser: "user", AccessToken: "tok-" + id + "-0123456789abcdef"}
}

// agentList calls process.List on sandbox id's agent through d with tok.
func agentList(d runtime.Driver, id, tok string) error {
	hc := agentclient.NewHTTP(func(ctx context.Context) (net.Conn, error) { return d.Dial(ctx, id) }, tok)
	defer hc.CloseIdleConnections()
	_, err := processconnect.NewProcessClient(hc, "http://agent").List(context.Background(), connect.NewRequest(&process.ListRequest{}))
	return err
}

// TestConformance runs the driver conformance suite against the kube
// driver: Pods on the test cluster (kwok), each one's agent a real
// `corral agent --listen` process on 127.0.0.1 standing in for the Pod
// IP (agents_test.go). It needs root for the agents' namespaces.
func TestConformance(t *testing.T) {
	c := testCluster(t)
	if os.Geteuid() != 0 {
		t.Skip("the stand-in agents of the conformance suite need root (pid and mount namespaces, commands as user and root)")
	}
	bin := filepath.Join(t.TempDir(), "corral")
	if err := os.Chmod(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", bin, "../../../cmd/corral")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the agent: %v: %s", err, out)
	}
	drivertest.Run(t, func(t *testing.T) drivertest.Setup {
		ns := c.namespace(t)
		ag := startAgents(t, c, ns, bin)
		mk := func(t *testing.T) runtime.Driver { return newDriver(t, c, ns, ag, "conformance", nil) }
		return drivertest.Setup{
			Driver: mk(t), Runtime: runtime.Runc, Restart: mk,
			Leftovers: func(id string) []string { return ag.leftovers(c, ns, id) },
			Remote:    "Kubernetes Pods run on nodes (kwok here: no processes, the agent is a stand-in on 127.0.0.1)",
		}
	})
}

// TestPodSpec: a sandbox's Pod is what docs/kubernetes.md says. Each
// field defends against something: the service-account token (sandbox
// code calling the API server), the runtime class (the isolation
// boundary), the limits (a sandbox starving its node), the writable
// emptyDir's size limit (filling the node's disk), no privilege
// escalation for templates without sudo, NET_RAW dropped, and neither
// the sandbox's access token nor its environment in the Pod object (whoever
// reads Pods would read them).
func TestPodSpec(t *testing.T) {
	c := testCluster(t)
	ns := c.namespace(t)
	ag := startAgents(t, c, ns, "")
	d := newDriver(t, c, ns, ag, "spec", func(o *Options) {
		o.ReadOnlyRoot = map[string]bool{"base": true}
	})
	cfg := testConfig("specbox1")
	cfg.Runtime = runtime.GVisor
	cfg.NoNewPrivileges = true
	if _, err := d.Start(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	l, err := c.client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: LabelSandbox + "=specbox1"})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("Pods of the sandbox: %v, %v", l, err)
	}
	p := l.Items[0]
	checks := []struct {
		what string
		ok   bool
	}{
		{"runtimeClassName gvisor", p.Spec.RuntimeClassName != nil && *p.Spec.RuntimeClassName == "gvisor"},
		{"automountServiceAccountToken false", p.Spec.AutomountServiceAccountToken != nil && !*p.Spec.AutomountServiceAccountToken},
		{"enableServiceLinks false", p.Spec.EnableServiceLinks != nil && !*p.Spec.EnableServiceLinks},
		{"service account corral-sandbox", p.Spec.ServiceAccountName == "corral-sandbox"},
		{"restartPolicy Never", p.Spec.RestartPolicy == corev1.RestartPolicyNever},
		{"no host namespaces", !p.Spec.HostNetwork && !p.Spec.HostPID && !p.Spec.HostIPC},
		{"label sandbox id", p.Labels[LabelSandbox] == "specbox1"},
		{"label team", p.Labels[LabelTeam] == "acme"},
		{"label template", p.Labels[LabelTemplate] == "base"},
		{"label managed-by", p.Labels[LabelManagedBy] == "corral"},
		{"annotation template ref", p.Annotations[AnnotationTemplate] == "base:3"},
		{"no projected token volume", !slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool { return v.Projected != nil })},
	}
	for _, ch := range checks {
		if !ch.ok {
			t.Errorf("Pod %s: want %s", p.Name, ch.what)
		}
	}
	ctr := p.Spec.Containers[0]
	lim, req := ctr.Resources.Limits, ctr.Resources.Requests
	for name, want := range map[corev1.ResourceName]string{corev1.ResourceCPU: "500m", corev1.ResourceMemory: "256Mi", corev1.ResourceEphemeralStorage: "128Mi"} {
		if q := lim[name]; q.Cmp(resource.MustParse(want)) != 0 {
			t.Errorf("limit %s = %s, want %s", name, q.String(), want)
		}
		if q := req[name]; q.Cmp(resource.MustParse(want)) != 0 {
			t.Errorf("request %s = %s, want %s (requests = limits)", name, q.String(), want)
		}
	}
	sc := ctr.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "NET_RAW") || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("security context %+v: want no privilege escalation, read-only root, NET_RAW dropped, RuntimeDefault seccomp", sc)
	}
	var writable *corev1.Volume
	for i := range p.Spec.Volumes {
		if p.Spec.Volumes[i].Name == "writable" {
			writable = &p.Spec.Volumes[i]
		}
	}
	if writable == nil || writable.EmptyDir == nil || writable.EmptyDir.SizeLimit == nil || writable.EmptyDir.SizeLimit.Cmp(resource.MustParse("64Mi")) != 0 {
		t.Errorf("writable volume %+v: want an emptyDir with sizeLimit 64Mi", writable)
	}
	raw, _ := json.Marshal(p)
	for _, secret := range []string{cfg.AccessToken, "env-value-not-in-the-pod"} {
		if strings.Contains(string(raw), secret) {
			t.Errorf("the Pod object holds %q (the sandbox's token or environment)", secret)
		}
	}
	// The agent got the sandbox's token: it opens the agent.
	if err := agentList(d, cfg.ID, cfg.AccessToken); err != nil {
		t.Fatalf("agent with the sandbox token: %v", err)
	}
	// Kill deletes the Pod (with the grace period asked for).
	if err := d.Stop(context.Background(), cfg.ID, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := c.client.CoreV1().Pods(ns).Get(context.Background(), p.Name, metav1.GetOptions{}); err == nil {
		t.Fatalf("Pod %s still exists after Stop", p.Name)
	}
	if d.Alive(cfg.ID) {
		t.Fatal("Alive after Stop")
	}
}

// TestNetworkPolicy: the driver applies a default-deny NetworkPolicy to
// its namespace (ingress only from the control plane to the agent port;
// egress only to the egress proxy and DNS filter, none without egress),
// and refuses egress when no CNI that enforces NetworkPolicy is detected,
// since then the policy would be an object nobody enforces and a sandbox
// could reach the whole cluster network.
func TestNetworkPolicy(t *testing.T) {
	c := testCluster(t)
	ctx := context.Background()
	egress := &Egress{Namespace: "corral", Selector: map[string]string{"app.kubernetes.io/name": "corral-egress"}, ProxyPort: 3128, DNSPort: 53, DNS: "10.96.0.53"}

	t.Run("no egress: deny all", func(t *testing.T) {
		ns := c.namespace(t)
		newDriver(t, c, ns, startAgents(t, c, ns, ""), "np", nil)
		np, err := c.client.NetworkingV1().NetworkPolicies(ns).Get(ctx, PolicyName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(np.Spec.Egress) != 0 || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			t.Fatalf("policy without egress: %+v; want both policy types and no egress rule", np.Spec)
		}
		if np.Spec.PodSelector.MatchLabels[LabelName] != nameValue {
			t.Fatalf("policy selects %v, want the sandbox Pods", np.Spec.PodSelector)
		}
		eg, err := c.client.NetworkingV1().NetworkPolicies(ns).Get(ctx, PolicyEgressName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(eg.Spec.Egress) != 0 {
			t.Fatalf("egress policy without egress: %+v; want no rule", eg.Spec)
		}
		in := np.Spec.Ingress
		if len(in) != 1 || len(in[0].Ports) != 1 || in[0].Ports[0].Port.IntVal != agentPort || in[0].From[0].PodSelector.MatchLabels["app.kubernetes.io/name"] != "corral" {
			t.Fatalf("ingress %+v: want only the control plane, to the agent port", in)
		}
	})
	t.Run("egress refused without a policy CNI", func(t *testing.T) {
		ns := c.namespace(t)
		client, _ := kubernetes.NewForConfig(c.config)
		_, err := New(ctx, Options{Client: client, Namespace: ns, DefaultImage: "x", Egress: egress})
		if err == nil || !strings.Contains(err.Error(), "no CNI that enforces NetworkPolicy") || !strings.Contains(err.Error(), "--kube-networkpolicy-enforced") {
			t.Fatalf("New with egress and no policy CNI: %v; want the refusal naming the override", err)
		}
		if _, err := c.client.NetworkingV1().NetworkPolicies(ns).Get(ctx, PolicyName, metav1.GetOptions{}); err == nil {
			t.Fatal("a refused start created the NetworkPolicy")
		}
	})
	t.Run("egress with the override", func(t *testing.T) {
		ns := c.namespace(t)
		newDriver(t, c, ns, startAgents(t, c, ns, ""), "np", func(o *Options) { o.Egress, o.NetworkPolicyEnforced = egress, true })
		checkEgressPolicy(t, c, ns)
	})
	t.Run("egress with a detected CNI", func(t *testing.T) {
		ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "cilium", Namespace: "kube-system"},
			Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "cilium"}},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"k8s-app": "cilium"}},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}}}
		if _, err := c.client.AppsV1().DaemonSets("kube-system").Create(ctx, ds, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.client.AppsV1().DaemonSets("kube-system").Delete(ctx, "cilium", metav1.DeleteOptions{}) })
		ns := c.namespace(t)
		newDriver(t, c, ns, startAgents(t, c, ns, ""), "np", func(o *Options) { o.Egress = egress })
		checkEgressPolicy(t, c, ns)
	})
}

// checkEgressPolicy: with egress the default policy still denies all
// egress, and PolicyEgressName admits only Pods labelled
// corral.dev/egress=true, only to the proxy (a sandbox with network none
// reaches nothing at the network level).
func checkEgressPolicy(t *testing.T, c *cluster, ns string) {
	t.Helper()
	def, err := c.client.NetworkingV1().NetworkPolicies(ns).Get(context.Background(), PolicyName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(def.Spec.Egress) != 0 || !slices.Contains(def.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
		t.Fatalf("default policy with egress on: %+v; want every sandbox Pod's egress denied", def.Spec)
	}
	np, err := c.client.NetworkingV1().NetworkPolicies(ns).Get(context.Background(), PolicyEgressName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sel := np.Spec.PodSelector.MatchLabels; sel[LabelEgress] != "true" || sel[LabelName] != nameValue || len(np.Spec.PodSelector.MatchExpressions) != 0 {
		t.Fatalf("egress policy selects %+v; want only sandbox Pods labelled %s=true", np.Spec.PodSelector, LabelEgress)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}) {
		t.Fatalf("egress policy types %v, want Egress only", np.Spec.PolicyTypes)
	}
	if len(np.Spec.Egress) != 1 {
		t.Fatalf("egress rules %+v: want exactly one (the proxy)", np.Spec.Egress)
	}
	rule := np.Spec.Egress[0]
	if len(rule.To) != 1 || rule.To[0].PodSelector.MatchLabels["app.kubernetes.io/name"] != "corral-egress" ||
		rule.To[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "corral" || rule.To[0].IPBlock != nil {
		t.Fatalf("egress peer %+v: want only the proxy Pods of namespace corral", rule.To)
	}
	var ports []string
	for _, p := range rule.Ports {
		ports = append(ports, fmt.Sprintf("%s/%d", *p.Protocol, p.Port.IntVal))
	}
	slices.Sort(ports)
	if want := []string{"TCP/3128", "TCP/53", "UDP/53"}; !slices.Equal(ports, want) {
		t.Fatalf("egress ports %v, want %v", ports, want)
	}
}

// TestClaimRace: two control planes (two drivers, two API clients) start
// sandboxes at once from one warm pool. Each ready Pod must go to one
// sandbox only: were the claim not conditional on the resourceVersion
// read, both replicas' patches of the same idle Pod would succeed and
// two callers would share one sandbox (its files, its processes).
func TestClaimRace(t *testing.T) {
	c := testCluster(t)
	ns := c.namespace(t)
	ag := startAgents(t, c, ns, "")
	const size, perReplica = 12, 15
	cfg := testConfig("x")
	pool := Pool{Template: cfg.Template, Runtime: cfg.Runtime, Resources: cfg.Resources, DefaultUser: cfg.DefaultUser, Size: size}
	withPool := func(o *Options) { o.Pools = []Pool{pool} }
	a := newDriver(t, c, ns, ag, "replica-a", withPool)
	b := newDriver(t, c, ns, ag, "replica-b", withPool)
	waitPool(t, a, size)

	var wg sync.WaitGroup
	errs := make(chan error, 2*perReplica)
	for r, d := range map[string]*Driver{"a": a, "b": b} {
		for i := range perReplica {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cfg := testConfig(fmt.Sprintf("race%s%02d", r, i))
				if _, err := d.Start(context.Background(), cfg); err != nil {
					errs <- fmt.Errorf("start %s on replica %s: %w", cfg.ID, r, err)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	l, err := c.client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: LabelSandbox})
	if err != nil {
		t.Fatal(err)
	}
	owner := map[string]string{}
	pooled := 0
	for _, p := range l.Items {
		id := p.Labels[LabelSandbox]
		if prev, ok := owner[id]; ok {
			t.Errorf("sandbox %s has two Pods: %s and %s", id, prev, p.Name)
		}
		owner[id] = p.Name
		if strings.HasPrefix(p.Name, "corral-pool-") {
			pooled++
		}
	}
	if len(owner) != 2*perReplica {
		t.Fatalf("%d sandboxes have Pods, want %d", len(owner), 2*perReplica)
	}
	// Each sandbox's agent answers its own token: no Pod was initialised
	// for two sandboxes.
	for r, d := range map[string]*Driver{"a": a, "b": b} {
		for i := range perReplica {
			cfg := testConfig(fmt.Sprintf("race%s%02d", r, i))
			if err := agentList(d, cfg.ID, cfg.AccessToken); err != nil {
				t.Errorf("sandbox %s's agent refuses its own token: %v", cfg.ID, err)
			}
		}
	}
	if pooled == 0 {
		t.Fatal("no sandbox came from the pool: the race was not exercised")
	}
	t.Logf("%d of %d sandboxes claimed pool Pods, the rest got new ones", pooled, 2*perReplica)
}

// waitPool polls until d's first pool has n ready Pods.
func waitPool(t testing.TB, d *Driver, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		st := d.Pools()
		if len(st) > 0 && st[0].Ready >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool not ready after 5 min: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
