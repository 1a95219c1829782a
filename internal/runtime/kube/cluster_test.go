package kube

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/corralhq/corral/internal/store/pgtest"
)

// The test cluster: a real etcd and kube-apiserver on 127.0.0.1, kwok
// simulating a node and the Pod lifecycle (Pods go Running with IPs and
// run no processes), and a binder standing in for kube-scheduler. It is
// started once per test binary (TestMain stops it) from the binaries
// `make kube-tools` builds (tools/kube), cached by version.

// kubeAssets is where the cluster's binaries are: $CORRAL_KUBE_ASSETS, or
// /var/cache/corral/kube/<tools/kube/VERSION>.
func kubeAssets() (string, error) {
	if d := os.Getenv("CORRAL_KUBE_ASSETS"); d != "" {
		return d, nil
	}
	v, err := os.ReadFile("../../../tools/kube/VERSION")
	if err != nil {
		return "", err
	}
	return filepath.Join("/var/cache/corral/kube", strings.TrimSpace(string(v))), nil
}

type cluster struct {
	dir    string
	config *rest.Config
	client kubernetes.Interface
	cmds   []*exec.Cmd
	// exited is closed when that command ends.
	exited map[string]chan struct{}
	stop   chan struct{}
	// node is the kwok node Pods are bound to.
	node string
}

var (
	clusterOnce sync.Once
	theCluster  *cluster
	clusterErr  error
	skipReason  string
)

func TestMain(m *testing.M) {
	code := pgtest.Main(m)
	if theCluster != nil {
		theCluster.shutdown()
	}
	if agentBinDir != "" {
		os.RemoveAll(agentBinDir)
	}
	os.Exit(code)
}

// testCluster returns the shared cluster, starting it on first use. It
// skips the test only when the binaries are not built and the test does
// not run as root (as root, under `make test`, they must be there).
func testCluster(t testing.TB) *cluster {
	t.Helper()
	clusterOnce.Do(func() {
		dir, err := kubeAssets()
		if err != nil {
			clusterErr = err
			return
		}
		for _, b := range []string{"etcd", "kube-apiserver", "kwok", "kwok-stages.yaml"} {
			if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
				if os.Geteuid() != 0 {
					skipReason = fmt.Sprintf("the Kubernetes test binaries are not built (%s missing; run `make kube-tools`)", filepath.Join(dir, b))
					return
				}
				clusterErr = fmt.Errorf("%s missing: run `make kube-tools` (make test does)", filepath.Join(dir, b))
				return
			}
		}
		theCluster, clusterErr = startCluster(dir)
	})
	if skipReason != "" {
		t.Skip(skipReason)
	}
	if clusterErr != nil {
		t.Fatalf("test cluster: %v", clusterErr)
	}
	return theCluster
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func startCluster(assets string) (_ *cluster, err error) {
	dir, err := os.MkdirTemp("", "corral-kube-")
	if err != nil {
		return nil, err
	}
	c := &cluster{dir: dir, stop: make(chan struct{}), node: "kwok-node-0", exited: map[string]chan struct{}{}}
	defer func() {
		if err != nil {
			c.shutdown()
		}
	}()
	client, peer, secure := 0, 0, 0
	for _, p := range []*int{&client, &peer, &secure} {
		if *p, err = freePort(); err != nil {
			return nil, err
		}
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", client)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	if err := c.run(assets, "etcd", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL, "--unsafe-no-fsync", "--log-level", "warn"); err != nil {
		return nil, err
	}
	// Service-account keys (the API server requires them) and an admin token.
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, err
	}
	saKey, saPub := filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := os.WriteFile(saKey, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(saPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600); err != nil {
		return nil, err
	}
	tb := make([]byte, 16)
	rand.Read(tb)
	token := hex.EncodeToString(tb)
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(token+",admin,admin,system:masters\n"), 0o600); err != nil {
		return nil, err
	}
	if err := c.run(assets, "kube-apiserver", "--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", fmt.Sprint(secure),
		"--cert-dir", filepath.Join(dir, "certs"), "--token-auth-file", tokens, "--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc", "--service-account-key-file", saPub,
		"--service-account-signing-key-file", saKey, "--service-cluster-ip-range", "10.96.0.0/24",
		"--endpoint-reconciler-type", "none", "--profiling=false", "--max-requests-inflight", "2000", "--max-mutating-requests-inflight", "1000"); err != nil {
		return nil, err
	}
	c.config = &rest.Config{
		Host: fmt.Sprintf("https://127.0.0.1:%d", secure), BearerToken: token,
		// The API server's self-signed certificate of this test run.
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS:             500, Burst: 1000,
	}
	if c.client, err = kubernetes.NewForConfig(c.config); err != nil {
		return nil, err
	}
	if err := c.waitReady(); err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: t, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: t, user: {token: %q}}]
contexts: [{name: t, context: {cluster: t, user: t}}]
current-context: t
`, c.config.Host, token), 0o600); err != nil {
		return nil, err
	}
	if err := c.run(assets, "kwok", "--kubeconfig", kubeconfig, "--manage-all-nodes=true",
		"--config", filepath.Join(assets, "kwok-stages.yaml"),
		"--cidr", "10.244.0.0/16", "--node-ip", "10.244.255.254"); err != nil {
		return nil, err
	}
	if err := c.addNode(); err != nil {
		return nil, err
	}
	// The RuntimeClass of gVisor sandboxes (the RuntimeClass admission
	// refuses Pods naming one that does not exist).
	if _, err := c.client.NodeV1().RuntimeClasses().Create(context.Background(), &nodev1.RuntimeClass{
		ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	go c.bind()
	return c, nil
}

// run starts one of the cluster's binaries, logging to a file of dir.
func (c *cluster) run(assets, name string, args ...string) error {
	log, err := os.Create(filepath.Join(c.dir, name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(assets, name), args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	c.cmds = append(c.cmds, cmd)
	done := make(chan struct{})
	c.exited[name] = done
	go func() { cmd.Wait(); log.Close(); close(done) }()
	return nil
}

func (c *cluster) waitReady() error {
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: insecureTLS()}, Timeout: 5 * time.Second}
	deadline := time.Now().Add(3 * time.Minute)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-c.exited["kube-apiserver"]:
			last = "kube-apiserver exited"
			deadline = time.Now()
			continue
		default:
		}
		req, _ := http.NewRequest(http.MethodGet, c.config.Host+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+c.config.BearerToken)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	b, _ := os.ReadFile(filepath.Join(c.dir, "kube-apiserver.log"))
	return fmt.Errorf("kube-apiserver not ready after 3 min (%s); log tail:\n%s", last, tail(b, 3000))
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// addNode registers the kwok node, roomy enough for the benchmarks.
func (c *cluster) addNode() error {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: c.node, Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
			Labels: map[string]string{"type": "kwok", "kubernetes.io/hostname": c.node}},
		Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("4000"), corev1.ResourceMemory: resource.MustParse("16Ti"),
				corev1.ResourcePods: resource.MustParse("5000"), corev1.ResourceEphemeralStorage: resource.MustParse("100Ti"),
			},
		},
	}
	n.Status.Capacity = n.Status.Allocatable
	_, err := c.client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{})
	return err
}

// bind stands in for kube-scheduler: it binds every unscheduled Pod to
// the kwok node.
func (c *cluster) bind() {
	f := informers.NewSharedInformerFactoryWithOptions(c.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", "").String()
	}))
	inf := f.Core().V1().Pods().Informer()
	queue := make(chan *corev1.Pod, 10000)
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(o any) {
		if p, ok := o.(*corev1.Pod); ok && p.Spec.NodeName == "" && p.DeletionTimestamp == nil {
			queue <- p
		}
	}})
	f.Start(c.stop)
	for range 8 {
		go func() {
			for {
				select {
				case <-c.stop:
					return
				case p := <-queue:
					err := c.client.CoreV1().Pods(p.Namespace).Bind(context.Background(), &corev1.Binding{
						ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID},
						Target:     corev1.ObjectReference{Kind: "Node", Name: c.node},
					}, metav1.CreateOptions{})
					if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && !strings.Contains(err.Error(), "already") {
						fmt.Fprintf(os.Stderr, "bind %s/%s: %v\n", p.Namespace, p.Name, err)
					}
				}
			}
		}()
	}
}

func (c *cluster) shutdown() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	for i := len(c.cmds) - 1; i >= 0; i-- {
		cmd := c.cmds[i]
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := c.exited[filepath.Base(cmd.Path)]
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
	if os.Getenv("CORRAL_KUBE_KEEP") == "" {
		os.RemoveAll(c.dir)
	}
}

// namespace creates a fresh namespace with the sandboxes' service account
// and deletes its Pods when the test ends.
func (c *cluster) namespace(t testing.TB) string {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	ns := "t-" + hex.EncodeToString(b)
	ctx := context.Background()
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "corral-sandbox"},
		AutomountServiceAccountToken: new(bool)}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		zero := int64(0)
		_ = c.client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		_ = c.client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	})
	return ns
}

// waitPodsGone polls until namespace ns holds no Pods matching selector.
func (c *cluster) waitPodsGone(t testing.TB, ns, selector string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		l, err := c.client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
		if err == nil && len(l.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Pods %q in %s still there after 2 min: %v %v", selector, ns, len(l.Items), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var errNoAgent = errors.New("no agent for this Pod")
