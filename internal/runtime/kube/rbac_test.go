package kube

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// manifestObjects decodes every object of a deploy/kubernetes file; one
// that does not decode fails the test.
func manifestObjects(t *testing.T, file string) []k8sruntime.Object {
	t.Helper()
	b, err := os.ReadFile("../../../deploy/kubernetes/" + file)
	if err != nil {
		t.Fatal(err)
	}
	var objs []k8sruntime.Object
	for _, doc := range bytes.Split(b, []byte("\n---")) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		objs = append(objs, obj)
	}
	return objs
}

// createObjects creates objs of a deploy/kubernetes file (the kinds the
// RBAC tests need) as the cluster admin; one that exists already is
// kept, a kind it cannot create fails the test.
func createObjects(t *testing.T, c *cluster, file string, objs []k8sruntime.Object) {
	t.Helper()
	ctx := context.Background()
	for _, obj := range objs {
		var err error
		switch o := obj.(type) {
		case *corev1.Namespace:
			_, err = c.client.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{})
		case *corev1.ServiceAccount:
			_, err = c.client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = c.client.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = c.client.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("%s: kind %T not applied by this test", file, obj)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("%s: create %T: %v", file, obj, err)
		}
	}
}

// clientAs is a client of c that acts as the service account of
// namespace corral (deploy/kubernetes), with a token of its own.
func clientAs(t *testing.T, c *cluster, account string) *kubernetes.Clientset {
	t.Helper()
	tok, err := c.client.CoreV1().ServiceAccounts("corral").CreateToken(context.Background(), account, &authv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rc := rest.CopyConfig(c.config)
	rc.BearerToken = tok.Status.Token
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// applyManifest creates every object of a deploy/kubernetes file
// (createObjects).
func applyManifest(t *testing.T, c *cluster, file string) {
	t.Helper()
	createObjects(t, c, file, manifestObjects(t, file))
}

// TestRBAC: the driver works with exactly the rules of
// deploy/kubernetes/rbac.yaml (the least verbs documented there):
// NetworkPolicy, the Pod watch, pool Pods, a claim (patch), a create, a
// kill; and the CNI detection may list DaemonSets. A verb the driver
// needs and the manifest lacks fails here as forbidden, so the manifest
// cannot drift from the code.
func TestRBAC(t *testing.T) {
	c := testCluster(t)
	applyManifest(t, c, "namespace.yaml")
	applyManifest(t, c, "rbac.yaml")
	ctx := context.Background()
	const ns = "corral-sandboxes"
	t.Cleanup(func() {
		zero := int64(0)
		_ = c.client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	})
	client := clientAs(t, c, "corral")
	// More than it needs is refused: the account cannot read Secrets.
	if _, err := client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the control plane's account lists Secrets: %v; want forbidden", err)
	}
	ag := startAgents(t, c, ns, "")
	cfg := testConfig("rbacbox1")
	pool := Pool{Template: cfg.Template, Runtime: cfg.Runtime, Resources: cfg.Resources, DefaultUser: cfg.DefaultUser, Size: 1}
	opts := Options{Client: client, Namespace: ns, DefaultImage: "x", AgentAddr: ag.addr,
		Egress: &Egress{Selector: map[string]string{"app.kubernetes.io/name": "corral-egress"}, ProxyPort: 3128, DNSPort: 53}}
	// The detection may list DaemonSets (and finds no CNI here).
	if _, err := New(ctx, opts); err == nil || strings.Contains(err.Error(), "forbidden") || !strings.Contains(err.Error(), "no CNI") {
		t.Fatalf("CNI detection as the control plane's account: %v", err)
	}
	opts.Egress, opts.Pools = nil, []Pool{pool}
	d, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	waitPool(t, d, 1)
	for _, id := range []string{"rbacbox1", "rbacbox2"} { // a claim, then a create
		cfg := testConfig(id)
		if id == "rbacbox2" {
			cfg.Resources.CPU = 1 // no pool serves it
		}
		if _, err := d.Start(ctx, cfg); err != nil {
			t.Fatalf("start %s: %v", id, err)
		}
		if err := agentList(d, id, cfg.AccessToken); err != nil {
			t.Fatalf("agent of %s: %v", id, err)
		}
		if err := d.Stop(ctx, id, 0); err != nil {
			t.Fatalf("stop %s: %v", id, err)
		}
	}
}
