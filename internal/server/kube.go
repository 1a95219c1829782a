package server

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/runtime/kube"
	"github.com/corralhq/corral/internal/sandbox"
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
	if _, err := k.pools(); err != nil {
		return err
	}
	if k.Egress && k.DNS == "" {
		return fmt.Errorf("--kube-egress needs --kube-dns (the DNS filter's Service IP)")
	}
	return nil
}

// pools are the warm pools of --kube-pools, for creates with the default
// tier, runtime and user.
func (k KubeConfig) pools() ([]kube.Pool, error) {
	m, err := parsePairs("--kube-pools", k.Pools)
	if err != nil {
		return nil, err
	}
	res := sandbox.Tiers[sandbox.DefaultTier].Resources
	var out []kube.Pool
	for tpl, n := range m {
		size, err := strconv.Atoi(n)
		if err != nil || size < 0 || size > 10000 {
			return nil, fmt.Errorf("--kube-pools: %s=%s: the size is a number from 0 to 10000", tpl, n)
		}
		out = append(out, kube.Pool{Template: tpl, Runtime: runtime.Runc, DefaultUser: "user", Size: size,
			Resources: runtime.Resources{CPU: res.CPU, MemoryBytes: res.MemoryMB << 20, DiskBytes: res.DiskMB << 20, Pids: res.Pids, Nofile: res.Nofile}})
	}
	return out, nil
}

// openKube connects to the cluster and starts the kube driver; node
// names this control plane on the Pods it claims.
func openKube(ctx context.Context, k KubeConfig, node string) (*kube.Driver, error) {
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
	pools, _ := k.pools()
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
			ProxyPort: 3128, DNSPort: 53, DNS: k.DNS}
	}
	return kube.New(ctx, opts)
}
