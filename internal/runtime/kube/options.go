package kube

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/corralhq/corral/internal/runtime"
)

// Options configure the driver.
type Options struct {
	// Client talks to the cluster's API server.
	Client kubernetes.Interface
	// Namespace holds the sandbox Pods (and their NetworkPolicy).
	Namespace string
	// Images maps a template name to the image of its sandboxes;
	// DefaultImage serves templates it does not name. The image holds the
	// template's root file system (and the agent at AgentPath when
	// AgentImage is empty).
	Images       map[string]string
	DefaultImage string
	// RuntimeClasses maps a template name to its RuntimeClass; a template
	// it does not name gets RuntimeClassByRuntime[cfg.Runtime] (default:
	// "gvisor" for runtime.GVisor, none for runtime.Runc, the cluster's
	// default runtime).
	RuntimeClasses        map[string]string
	RuntimeClassByRuntime map[runtime.Runtime]string
	// ReadOnlyRoot lists the templates whose root file system may be
	// mounted read-only (their writes go to /tmp and /home, emptyDirs).
	ReadOnlyRoot map[string]bool
	// AgentImage, when set, is an image holding the static corral binary
	// at /corral (and cp); an init container copies it into the Pod. When
	// empty the template image must hold it at AgentPath.
	AgentImage string
	// AgentPath is where the agent binary is inside the sandbox
	// container (default /opt/corral/corral).
	AgentPath string
	// ServiceAccount is the (permissionless) service account of sandbox
	// Pods; its token is never mounted. Default "corral-sandbox".
	ServiceAccount string
	// Egress, when set, lets sandbox Pods reach corral's egress proxy and
	// DNS filter and nothing else; when nil the NetworkPolicy lets them
	// reach nothing. Either way the driver creates the policy.
	Egress *Egress
	// NetworkPolicyEnforced overrides the detection of a CNI that
	// enforces NetworkPolicy (netpol.go): with Egress set, the driver
	// refuses to start unless it detects one or this is true.
	NetworkPolicyEnforced bool
	// ControlPlane selects the control-plane Pods (labels in
	// ControlPlaneNamespace) that may reach the agents; default
	// app.kubernetes.io/name=corral in the namespace "corral".
	ControlPlane          map[string]string
	ControlPlaneNamespace string
	// Pools are the warm pools: ready Pods per template and limits.
	Pools []Pool
	// Replica names this control plane on the Pods it claims (the
	// claimed-by annotation); default the host name.
	Replica string
	// ReadyTimeout bounds the wait for a new Pod to be ready (default 5 min).
	ReadyTimeout time.Duration
	// AgentAddr returns the address of a Pod's agent; default its Pod IP
	// and agentproto.Port. Tests point it at an agent on 127.0.0.1.
	AgentAddr func(pod *corev1.Pod) string
	// Log receives the driver's logs (default slog.Default()).
	Log *slog.Logger
}

// Egress is where sandbox Pods may send traffic: the egress proxy's and
// DNS filter's Pods (the proxy tells sandboxes apart by source Pod IP).
type Egress struct {
	// Namespace and Selector pick the proxy's Pods.
	Namespace string
	Selector  map[string]string
	// ProxyPort and DNSPort are their TCP and UDP+TCP ports.
	ProxyPort, DNSPort int32
	// DNS is the DNS filter's Service IP, made the Pods' only name server.
	DNS string
}

// Pool is one warm pool: Size ready Pods of a template with the given
// runtime, limits and default user. A Start whose Config matches them
// claims one instead of creating a Pod.
type Pool struct {
	Template    string
	Runtime     runtime.Runtime
	Resources   runtime.Resources
	DefaultUser string
	// NoNewPrivileges as in runtime.Config.
	NoNewPrivileges bool
	Size            int
}

func (o *Options) defaults() error {
	if o.Client == nil {
		return errors.New("kube: no API client")
	}
	if o.Namespace == "" {
		return errors.New("kube: no namespace")
	}
	if o.DefaultImage == "" && len(o.Images) == 0 {
		return errors.New("kube: no sandbox image (--kube-image)")
	}
	if o.AgentPath == "" {
		o.AgentPath = "/opt/corral/corral"
	}
	if o.ServiceAccount == "" {
		o.ServiceAccount = "corral-sandbox"
	}
	if o.RuntimeClassByRuntime == nil {
		o.RuntimeClassByRuntime = map[runtime.Runtime]string{runtime.GVisor: "gvisor"}
	}
	if o.ControlPlane == nil {
		o.ControlPlane = map[string]string{"app.kubernetes.io/name": "corral"}
	}
	if o.ControlPlaneNamespace == "" {
		o.ControlPlaneNamespace = "corral"
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = 5 * time.Minute
	}
	if o.AgentAddr == nil {
		o.AgentAddr = func(p *corev1.Pod) string {
			return net.JoinHostPort(p.Status.PodIP, fmt.Sprint(agentPort))
		}
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	for i, p := range o.Pools {
		if p.Size < 0 || p.Template == "" {
			return fmt.Errorf("kube: pool %d: needs a template and a size >= 0", i)
		}
	}
	if o.Egress != nil && (o.Egress.ProxyPort <= 0 || o.Egress.DNSPort <= 0 || len(o.Egress.Selector) == 0) {
		return errors.New("kube: egress needs the proxy's selector, proxy port and DNS port")
	}
	return nil
}
