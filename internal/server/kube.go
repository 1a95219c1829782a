package server

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/corralhq/corral/internal/egressd"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/runtime/kube"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template/registry"
)

// Drivers `corral serve --driver` accepts.
const (
	DriverOCI  = "oci"
	DriverKube = "kube"
)

// KubeConfig configures the kube driver (--kube-* flags,
// docs/kubernetes.md).
type KubeConfig struct {
	// Kubeconfig is the kubeconfig file; "" means the in-cluster
	// configuration (the Pod's service account).
	Kubeconfig string
	// Namespace holds the sandbox Pods.
	Namespace string
	// Image is the image of templates Images does not name; Images is
	// "template=image,..." .
	Image, Images string
	// AgentImage, when set, holds /corral for the init container that
	// delivers the agent; else the template images hold it.
	AgentImage string
	// RuntimeClass is the RuntimeClass of gVisor sandboxes; RuntimeClasses
	// is "template=class,...".
	RuntimeClass, RuntimeClasses string
	// ReadOnlyRoot is "template,..." whose root may be read-only.
	ReadOnlyRoot string
	// Pools is "template=N,...": ready Pods of each template for creates
	// with the default tier, runtime and user.
	Pools string
	// Egress lets sandbox Pods reach the egress proxy Pods (label
	// app.kubernetes.io/name=corral-egress in the control plane's
	// namespace) on ports 3128 and 53, with DNS as their name server.
	Egress bool
	DNS    string
	// EgressCA is a PEM file of the egress proxy's CA certificate (ca.pem
	// of the corral-egress-ca Secret, never the key): kube sandboxes that
	// use secrets get it installed by their agent (with --kube-egress).
	EgressCA string
	// ControlPlaneNamespace is where the control plane (and the egress
	// proxy) run.
	ControlPlaneNamespace string
	// NetworkPolicyEnforced skips the NetworkPolicy CNI detection.
	NetworkPolicyEnforced bool
	// QPS and Burst bound the driver's API requests.
	QPS   float64
	Burst int
}

// Defaults of the kube flags.
const (
	DefaultKubeNamespace    = "corral-sandboxes"
	DefaultKubeRuntimeClass = "gvisor"
	DefaultKubeCPNamespace  = "corral"
	DefaultKubeQPS          = 100
	DefaultKubeBurst        = 200
)

// parsePairs parses "k=v,k=v" (what the --kube-* map flags take).
func parsePairs(flag, s string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("%s: %q is not TEMPLATE=VALUE", flag, kv)
		}
		out[k] = v
	}
	return out, nil
}

// validate checks the kube settings (only when --driver kube).
func (k KubeConfig) validate() error {
	if k.Image == "" && k.Images == "" {
		return fmt.Errorf("--driver kube needs --kube-image (or --kube-images)")
	}
	for flag, v := range map[string]string{"kube-images": k.Images, "kube-runtime-classes": k.RuntimeClasses, "kube-pools": k.Pools} {
		if _, err := parsePairs("--"+flag, v); err != nil {
			return err
		}
	}
	if _, err := k.poolSizes(); err != nil {
		return err
	}
	if k.Egress && k.DNS == "" {
		return fmt.Errorf("--kube-egress needs --kube-dns (the egress Service's IP: the DNS filter, and the proxy on port 3128)")
	}
	if k.EgressCA != "" && !k.Egress {
		return fmt.Errorf("--kube-egress-ca needs --kube-egress")
	}
	if _, err := k.egressCA(); err != nil {
		return err
	}
	if k.DNS != "" {
		if _, err := netip.ParseAddr(k.DNS); err != nil {
			return fmt.Errorf("--kube-dns %q: an IP address (the egress Service's ClusterIP), not a name", k.DNS)
		}
	}
	return nil
}

// egressCA reads --kube-egress-ca: PEM CERTIFICATE blocks only. A file
// with anything else (the CA's private key above all, which would let
// every sandbox forge the proxy's certificates) is refused.
func (k KubeConfig) egressCA() ([]byte, error) {
	if k.EgressCA == "" {
		return nil, nil
	}
	b, err := os.ReadFile(k.EgressCA)
	if err != nil {
		return nil, fmt.Errorf("--kube-egress-ca: %w", err)
	}
	rest, n := b, 0
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("--kube-egress-ca %s: holds a PEM %q block; give the CA certificate alone (ca.pem), never its key", k.EgressCA, blk.Type)
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			return nil, fmt.Errorf("--kube-egress-ca %s: %w", k.EgressCA, err)
		}
		n++
	}
	if n == 0 || len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("--kube-egress-ca %s: not PEM CERTIFICATE blocks", k.EgressCA)
	}
	return b, nil
}

// poolSizes are the sizes --kube-pools asks for, by template name.
func (k KubeConfig) poolSizes() (map[string]int, error) {
	m, err := parsePairs("--kube-pools", k.Pools)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for tpl, n := range m {
		size, err := strconv.Atoi(n)
		if err != nil || size < 0 || size > 10000 {
			return nil, fmt.Errorf("--kube-pools: %s=%s: the size is a number from 0 to 10000", tpl, n)
		}
		out[tpl] = size
	}
	return out, nil
}

// pools are the warm pools of --kube-pools, for creates that name only
// the template: each Pod is made with what a cold create of the
// template's current version gets (sandbox.TemplateDefaults: its runtime,
// tier, default user, and no privilege escalation unless it offers sudo),
// so that a pool serves its template's creates and a pooled sandbox has
// the settings of a cold one. A template the registry does not hold yet
// (a build still running) gets the settings of one without sudo and a
// warning: its Pods allow no escalation, and creates claim them only if
// the template turns out to match.
func (k KubeConfig) pools(ctx context.Context, reg *registry.Registry, log *slog.Logger) ([]kube.Pool, error) {
	sizes, err := k.poolSizes()
	if err != nil {
		return nil, err
	}
	var out []kube.Pool
	for tpl, size := range sizes {
		var cfg runtime.Config
		tv, err := reg.Resolve(ctx, tpl)
		switch {
		case err == nil:
			cfg = sandbox.TemplateDefaults(tv)
		case errors.Is(err, registry.ErrNotFound):
			cfg = sandbox.TemplateDefaults(&store.TemplateVersion{Name: tpl})
			cfg.NoNewPrivileges = true
			log.Warn("--kube-pools: the template is not in the registry yet; its pool's Pods allow no privilege escalation, and creates claim them only if the template matches",
				"template", tpl)
		default:
			return nil, fmt.Errorf("--kube-pools: template %s: %w", tpl, err)
		}
		out = append(out, kube.Pool{Template: tpl, Runtime: cfg.Runtime, DefaultUser: cfg.DefaultUser, NoNewPrivileges: cfg.NoNewPrivileges,
			Resources: cfg.Resources, Size: size})
	}
	return out, nil
}

// proxyEnv is the environment of a kube sandbox with a network: the
// egress Service (the DNS filter's address, --kube-dns, serves the proxy
// on 3128 too) as its HTTP(S) proxy. An address, not a name: the
// sandbox's only resolver is the DNS filter, which resolves nothing a
// policy does not allow.
func (k KubeConfig) proxyEnv() map[string]string {
	u := "http://" + net.JoinHostPort(k.DNS, strconv.Itoa(egressd.ProxyPort))
	none := "localhost,127.0.0.1,::1"
	return map[string]string{"HTTP_PROXY": u, "HTTPS_PROXY": u, "http_proxy": u, "https_proxy": u, "NO_PROXY": none, "no_proxy": none}
}

// openKube connects to the cluster and starts the kube driver; node
// names this control plane on the Pods it claims.
func openKube(ctx context.Context, k KubeConfig, node string, reg *registry.Registry, log *slog.Logger) (*kube.Driver, error) {
	var rc *rest.Config
	var err error
	if k.Kubeconfig == "" {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", k.Kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("kube: cluster configuration: %w", err)
	}
	rc.QPS, rc.Burst = float32(k.QPS), k.Burst
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube: client: %w", err)
	}
	images, _ := parsePairs("--kube-images", k.Images)
	classes, _ := parsePairs("--kube-runtime-classes", k.RuntimeClasses)
	pools, err := k.pools(ctx, reg, log)
	if err != nil {
		return nil, err
	}
	ro := map[string]bool{}
	for _, t := range strings.Split(k.ReadOnlyRoot, ",") {
		if t = strings.TrimSpace(t); t != "" {
			ro[t] = true
		}
	}
	opts := kube.Options{
		Client: client, Namespace: k.Namespace, DefaultImage: k.Image, Images: images,
		RuntimeClasses: classes, RuntimeClassByRuntime: map[runtime.Runtime]string{runtime.GVisor: k.RuntimeClass},
		ReadOnlyRoot: ro, AgentImage: k.AgentImage, Pools: pools,
		ControlPlaneNamespace: k.ControlPlaneNamespace, NetworkPolicyEnforced: k.NetworkPolicyEnforced,
		Replica: node,
	}
	if k.Egress {
		opts.Egress = &kube.Egress{Namespace: k.ControlPlaneNamespace,
			Selector:  map[string]string{"app.kubernetes.io/name": "corral-egress"},
			ProxyPort: egressd.ProxyPort, DNSPort: egressd.DNSPort, DNS: k.DNS}
	}
	return kube.New(ctx, opts)
}
