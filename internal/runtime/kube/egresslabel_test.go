package kube

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/gateway"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
)

// testEgress is the Egress option as `corral serve --kube-egress` and
// deploy/kubernetes set it.
func testEgress() *Egress {
	return &Egress{Namespace: "corral", Selector: map[string]string{"app.kubernetes.io/name": "corral-egress"},
		ProxyPort: 3128, DNSPort: 53, DNS: "10.96.0.53"}
}

// egressControlPlane is a Manager over the kube driver with the egress
// proxy remote (RemoteProxyEnv, as --kube-egress sets it), the CA
// certificate ca, and a warm pool of pool Pods.
func egressControlPlane(t *testing.T, c *cluster, ns string, ag *agents, pool int, ca []byte) (*controlPlane, *recordingDriver, *sandbox.Manager) {
	t.Helper()
	cp := newControlPlane(t)
	d := newDriver(t, c, ns, ag, "cp", func(o *Options) {
		o.Egress, o.NetworkPolicyEnforced = testEgress(), true
		if pool > 0 {
			o.Pools = []Pool{testPool(pool)}
		}
	})
	rd := &recordingDriver{Driver: d, cfgs: map[string]runtime.Config{}}
	m := cp.openWith(t, rd, func(cfg *sandbox.Config) {
		cfg.RemoteProxyEnv = map[string]string{"HTTP_PROXY": "http://10.96.0.53:3128", "HTTPS_PROXY": "http://10.96.0.53:3128"}
		cfg.RemoteCA = ca
	})
	t.Cleanup(func() { m.Shutdown(context.Background(), true) })
	return cp, rd, m
}

// recordingDriver is the kube driver keeping the Config of every Start
// (what the Manager asked for, which the driver pushes in /init).
type recordingDriver struct {
	*Driver
	mu   sync.Mutex
	cfgs map[string]runtime.Config
}

func (r *recordingDriver) Start(ctx context.Context, cfg runtime.Config) (*runtime.Handle, error) {
	r.mu.Lock()
	r.cfgs[cfg.ID] = cfg
	r.mu.Unlock()
	return r.Driver.Start(ctx, cfg)
}

func (r *recordingDriver) config(t *testing.T, id string) runtime.Config {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	cfg, ok := r.cfgs[id]
	if !ok {
		t.Fatalf("no Start of sandbox %s", id)
	}
	return cfg
}

// podOf reads sandbox id's Pod from the API server (not the cache).
func podOf(t *testing.T, c *cluster, ns, id string) *corev1.Pod {
	t.Helper()
	l, err := c.client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: LabelSandbox + "=" + id})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("Pod of sandbox %s: %v, %d Pods", id, err, len(l.Items))
	}
	return &l.Items[0]
}

// TestEgressLabel: only the Pod of a sandbox whose network is not none
// carries corral.dev/egress=true, the label the NetworkPolicy
// corral-sandboxes-egress admits to the egress proxy: a cold Pod gets it
// at create, a pool Pod (made without it) by the claim, a `none`
// sandbox's Pod never; a run-time change to none removes it and back
// adds it. It defends against a sandbox with network none reaching the
// proxy and DNS filter at the network level (before, every sandbox Pod
// was admitted and only the proxy refused it).
func TestEgressLabel(t *testing.T) {
	c := testCluster(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		pool int
	}{{"cold", 0}, {"claimed", 3}} {
		t.Run(tc.name, func(t *testing.T) {
			ns := c.namespace(t)
			ag := startAgents(t, c, ns, "")
			_, d, m := egressControlPlane(t, c, ns, ag, tc.pool, nil)
			if tc.pool > 0 {
				waitPool(t, d.Driver, tc.pool)
				idle, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelState + "=" + stateIdle})
				if err != nil || len(idle.Items) == 0 {
					t.Fatalf("idle pool Pods: %v, %d", err, len(idle.Items))
				}
				for _, p := range idle.Items {
					if v, has := p.Labels[LabelEgress]; has {
						t.Fatalf("idle pool Pod %s has %s=%q: it belongs to no sandbox and must reach nothing", p.Name, LabelEgress, v)
					}
				}
			}
			withNet, err := m.Create(ctx, sandbox.CreateRequest{Network: "allow", Allow: []string{"example.com"}})
			if err != nil {
				t.Fatal(err)
			}
			without, err := m.Create(ctx, sandbox.CreateRequest{})
			if err != nil {
				t.Fatal(err)
			}
			pw, pn := podOf(t, c, ns, withNet.ID), podOf(t, c, ns, without.ID)
			fromPool := strings.HasPrefix(pw.Name, "corral-pool-") && strings.HasPrefix(pn.Name, "corral-pool-")
			if fromPool != (tc.pool > 0) {
				t.Fatalf("Pods %s and %s: from the pool %v, want %v", pw.Name, pn.Name, fromPool, tc.pool > 0)
			}
			if pw.Labels[LabelEgress] != egressOn {
				t.Fatalf("Pod %s of a sandbox with network allow: labels %v; want %s=true", pw.Name, pw.Labels, LabelEgress)
			}
			if v, has := pn.Labels[LabelEgress]; has {
				t.Fatalf("Pod %s of a sandbox with network none has %s=%q", pn.Name, LabelEgress, v)
			}

			// Run-time changes: to none removes the label, back adds it.
			if _, err := m.SetNetwork(ctx, withNet.ID, sandbox.NetworkRequest{Mode: "none"}); err != nil {
				t.Fatal(err)
			}
			if v, has := podOf(t, c, ns, withNet.ID).Labels[LabelEgress]; has {
				t.Fatalf("after the network became none the Pod still has %s=%q", LabelEgress, v)
			}
			if _, err := m.SetNetwork(ctx, without.ID, sandbox.NetworkRequest{Mode: "all-public"}); err != nil {
				t.Fatal(err)
			}
			if v := podOf(t, c, ns, without.ID).Labels[LabelEgress]; v != egressOn {
				t.Fatalf("after the network became all-public the Pod has %s=%q, want true", LabelEgress, v)
			}
		})
	}
}

// TestEgressCAInPod: a kube sandbox with a secret trusts the egress CA as
// a local one does: its agent installed the CA certificate at
// gateway.SandboxCAFile and appended it to the template's bundle at
// SandboxCABundle, and the sandbox's environment points SSL_CERT_FILE
// and the others there; nothing of the CA's key is in the sandbox's
// files. A sandbox without secrets gets none of it. It defends against
// secrets over HTTPS failing in Pods (the proxy's certificate untrusted)
// and, by handing over the certificate alone in /init (no Secret mount),
// against a sandbox reading the key and forging the proxy's certificates.
func TestEgressCAInPod(t *testing.T) {
	c := testCluster(t)
	ctx := context.Background()
	caDir := t.TempDir()
	ca, err := egress.LoadOrCreateCA(caDir)
	if err != nil {
		t.Fatal(err)
	}
	caPEM := ca.CertPEM()
	ns := c.namespace(t)
	ag := startAgents(t, c, ns, "")
	cp, rec, m := egressControlPlane(t, c, ns, ag, 0, caPEM)
	if err := cp.st.PutSecret(ctx, &store.Secret{Team: store.DefaultTeam, Name: "tok", Hosts: []string{"example.com"},
		Header: "Authorization", Value: "Bearer not-in-the-sandbox"}); err != nil {
		t.Fatal(err)
	}
	withSecret, err := m.Create(ctx, sandbox.CreateRequest{Network: "allow", Allow: []string{"example.com"}, Secrets: []string{"tok"}})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := m.Create(ctx, sandbox.CreateRequest{Network: "allow", Allow: []string{"example.com"}})
	if err != nil {
		t.Fatal(err)
	}

	root := ag.root(podOf(t, c, ns, withSecret.ID).UID)
	if root == "" {
		t.Fatal("no stand-in root for the sandbox's Pod")
	}
	file, err := os.ReadFile(filepath.Join(root, gateway.SandboxCAFile))
	if err != nil || !bytes.Equal(file, caPEM) {
		t.Fatalf("%s in the sandbox: %q, %v; want the CA's PEM", gateway.SandboxCAFile, file, err)
	}
	bundle, err := os.ReadFile(filepath.Join(root, gateway.SandboxCABundle))
	if err != nil || !bytes.Contains(bundle, caPEM) {
		t.Fatalf("%s in the sandbox: %v; want the CA appended", gateway.SandboxCABundle, err)
	}
	key, err := os.ReadFile(filepath.Join(caDir, "ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	keyBody := bytes.Join(bytes.Split(key, []byte("\n"))[1:3], []byte("\n")) // the first lines of the key's base64
	// Nothing of the key anywhere in the sandbox's files.
	err = filepath.Walk(root, func(path string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(b, []byte("PRIVATE KEY")) || bytes.Contains(b, keyBody) {
			t.Errorf("%s in the sandbox holds a private key", strings.TrimPrefix(path, root))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	env := rec.config(t, withSecret.ID).Env
	for k, v := range gateway.TrustEnv() {
		if env[k] != v {
			t.Errorf("sandbox with a secret: %s=%q, want %q", k, env[k], v)
		}
	}

	proot := ag.root(podOf(t, c, ns, plain.ID).UID)
	if _, err := os.Stat(filepath.Join(proot, gateway.SandboxCAFile)); !os.IsNotExist(err) {
		t.Fatalf("sandbox without secrets: %s: %v; want no CA installed", gateway.SandboxCAFile, err)
	}
	penv := rec.config(t, plain.ID).Env
	for k := range gateway.TrustEnv() {
		if v, has := penv[k]; has {
			t.Errorf("sandbox without secrets: %s=%q set", k, v)
		}
	}
}

// TestNetworkPolicyManifest: the policies of
// deploy/kubernetes/networkpolicies.yaml are the ones the driver applies
// (with --kube-egress and the manifests' namespaces), so that a review
// or GitOps copy cannot drift from what the code enforces: above all,
// the default policy admits no egress and only Pods labelled
// corral.dev/egress=true reach the proxy.
func TestNetworkPolicyManifest(t *testing.T) {
	b, err := os.ReadFile("../../../deploy/kubernetes/networkpolicies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*networkingv1.NetworkPolicy{}
	for _, doc := range bytes.Split(b, []byte("\n---")) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if np, ok := obj.(*networkingv1.NetworkPolicy); ok && np.Namespace == "corral-sandboxes" {
			got[np.Name] = np
		}
	}
	o := Options{Namespace: "corral-sandboxes", ControlPlaneNamespace: "corral", Egress: testEgress(),
		ControlPlane: map[string]string{"app.kubernetes.io/name": "corral"}}
	for _, want := range []*networkingv1.NetworkPolicy{networkPolicy(o), egressPolicy(o)} {
		np := got[want.Name]
		if np == nil {
			t.Fatalf("networkpolicies.yaml has no policy %s", want.Name)
		}
		if !apiequality.Semantic.DeepEqual(np.Spec, want.Spec) {
			t.Errorf("networkpolicies.yaml's %s differs from the driver's:\n got %+v\nwant %+v", want.Name, np.Spec, want.Spec)
		}
	}
}
