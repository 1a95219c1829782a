package kube

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/corralhq/corral/internal/idgen"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/proto/agentproto"
)

// Labels and annotations of sandbox Pods. The keys follow the
// Kubernetes conventions (app.kubernetes.io/*, a DNS prefix of our own),
// as kubernetes-sigs/agent-sandbox's do under agents.x-k8s.io/
// (docs/kubernetes.md maps one onto the other).
const (
	LabelName      = "app.kubernetes.io/name"
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelSandbox   = "corral.dev/sandbox-id"
	LabelTeam      = "corral.dev/team"
	LabelTemplate  = "corral.dev/template"
	// LabelPool is the warm pool a Pod was started for (its key).
	LabelPool = "corral.dev/pool"
	// LabelState is "idle" for a ready pool Pod nobody holds and
	// "claimed" for a sandbox's Pod.
	LabelState = "corral.dev/state"
	// LabelEgress is "true" on the Pod of a sandbox that may reach the
	// egress proxy (runtime.Config.Egress): the NetworkPolicy
	// PolicyEgressName admits only such Pods to the proxy and DNS filter.
	LabelEgress = "corral.dev/egress"
	egressOn    = "true"

	AnnotationTemplate  = "corral.dev/template-ref"
	AnnotationClaimedBy = "corral.dev/claimed-by"

	nameValue      = "corral-sandbox"
	managedByValue = "corral"
	stateIdle      = "idle"
	stateClaimed   = "claimed"

	containerName = "sandbox"
	agentPort     = agentproto.Port
)

// selectorAll selects every Pod the driver manages.
const selectorAll = LabelManagedBy + "=" + managedByValue + "," + LabelName + "=" + nameValue

var idRE = regexp.MustCompile(`^[a-z0-9]{1,32}$`)

// labelValue makes s a valid label value (at most 63 characters of
// [A-Za-z0-9_.-], alphanumeric at both ends); a template reference's
// ':' becomes '_'.
func labelValue(s string) string {
	b := []byte(s)
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
		if !ok {
			b[i] = '_'
		}
	}
	v := strings.Trim(string(b), "_.-")
	if len(v) > 63 {
		sum := sha256.Sum256([]byte(s))
		v = strings.Trim(v[:52], "_.-") + "-" + hex.EncodeToString(sum[:5])
	}
	return v
}

// templateName is the name part of a template reference (name:version).
func templateName(ref string) string {
	name, _, _ := strings.Cut(ref, ":")
	return name
}

// podSpec is the part of a sandbox's Pod that depends on its Config: what
// a pool Pod must share with a Start to serve it. Template is the
// template's name (a pool serves every version of it the image holds).
type podSpec struct {
	Template        string
	Runtime         runtime.Runtime
	Resources       runtime.Resources
	DefaultUser     string
	NoNewPrivileges bool
}

func specOf(cfg runtime.Config) podSpec {
	return podSpec{Template: templateName(cfg.Template), Runtime: cfg.Runtime, Resources: cfg.Resources,
		DefaultUser: cfg.DefaultUser, NoNewPrivileges: cfg.NoNewPrivileges}
}

func (p Pool) spec() podSpec {
	return podSpec{Template: templateName(p.Template), Runtime: p.Runtime, Resources: p.Resources,
		DefaultUser: p.DefaultUser, NoNewPrivileges: p.NoNewPrivileges}
}

// Serves reports whether a Start of cfg claims a Pod of this pool (its
// spec is cfg's: same template name, runtime, limits, default user and
// privilege escalation), whatever its size.
func (p Pool) Serves(cfg runtime.Config) bool { return p.spec() == specOf(cfg) }

// key is a short digest of the spec: the pool label of its Pods.
func (s podSpec) key() string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%q|%q|%+v|%q|%v", s.Template, s.Runtime, s.Resources, s.DefaultUser, s.NoNewPrivileges))
	return hex.EncodeToString(sum[:10])
}

// newPod returns the Pod of a sandbox of spec s, named name, with
// bootstrap as its agent's one-time init token. A sandbox's own labels
// (id, team) are added by the caller for a direct start, or by the claim.
//
// The shape is a plain PodTemplateSpec (agent-sandbox's
// SandboxTemplate.spec.podTemplate takes it as it is). What it defends
// against, field by field: no service-account token (sandbox code must
// not call the API server as anyone), no service links (no cluster
// addresses in the environment), no host namespaces, no privilege
// escalation when the template offers no sudo, the runtime's default
// seccomp profile, CAP_NET_RAW dropped (no raw packets to spoof the
// proxy), requests = limits (Guaranteed QoS: a sandbox cannot take a
// neighbour's memory), a size-capped emptyDir for every writable path and
// restartPolicy Never (a sandbox that died is not started again with a
// fresh agent waiting for init).
func (d *Driver) newPod(name string, s podSpec, bootstrap string) *corev1.Pod {
	o := &d.opts
	tname := s.Template
	image := o.Images[tname]
	if image == "" {
		image = o.DefaultImage
	}
	rc := o.RuntimeClasses[tname]
	if rc == "" {
		rc = o.RuntimeClassByRuntime[s.Runtime]
	}
	user := s.DefaultUser
	if user == "" {
		user = "user"
	}
	readOnly := o.ReadOnlyRoot[tname]
	res := corev1.ResourceList{}
	if s.Resources.CPU > 0 {
		res[corev1.ResourceCPU] = *resource.NewMilliQuantity(int64(s.Resources.CPU*1000+0.5), resource.DecimalSI)
	}
	if s.Resources.MemoryBytes > 0 {
		res[corev1.ResourceMemory] = *resource.NewQuantity(s.Resources.MemoryBytes, resource.BinarySI)
	}
	var writable *resource.Quantity
	if s.Resources.DiskBytes > 0 {
		writable = resource.NewQuantity(s.Resources.DiskBytes, resource.BinarySI)
		// The container's own layer (logs, a writable root) counts too.
		res[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(s.Resources.DiskBytes+(64<<20), resource.BinarySI)
	}
	falseV, trueV := false, true
	rootUID := int64(0)
	grace := int64(3)
	mounts := []corev1.VolumeMount{
		{Name: "writable", MountPath: "/tmp", SubPath: "tmp"},
		{Name: "writable", MountPath: "/home", SubPath: "home"},
	}
	volumes := []corev1.Volume{{Name: "writable", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: writable}}}}
	agentPath := o.AgentPath
	var inits []corev1.Container
	if o.AgentImage != "" {
		agentPath = "/opt/corral/corral"
		volumes = append(volumes, corev1.Volume{Name: "agent", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: resource.NewQuantity(256<<20, resource.BinarySI)}}})
		mounts = append(mounts, corev1.VolumeMount{Name: "agent", MountPath: "/opt/corral", ReadOnly: true})
		inits = append(inits, corev1.Container{
			Name: "corral-agent-install", Image: o.AgentImage,
			Command:         []string{"cp", "/corral", "/opt/corral/corral"},
			VolumeMounts:    []corev1.VolumeMount{{Name: "agent", MountPath: "/opt/corral"}},
			Resources:       corev1.ResourceRequirements{Requests: res, Limits: res},
			SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: &falseV, ReadOnlyRootFilesystem: &trueV, Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
		})
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: o.Namespace,
			Labels: map[string]string{
				LabelName: nameValue, LabelManagedBy: managedByValue,
				LabelTemplate: labelValue(tname), LabelPool: s.key(),
			},
			Annotations: map[string]string{},
		},
		Spec: corev1.PodSpec{
			ServiceAccountName:            o.ServiceAccount,
			AutomountServiceAccountToken:  &falseV,
			EnableServiceLinks:            &falseV,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			InitContainers:                inits,
			Containers: []corev1.Container{{
				Name: containerName, Image: image,
				Command: []string{agentPath, "agent", "--listen", fmt.Sprintf(":%d", agentPort), "--default-user", user},
				Env:     []corev1.EnvVar{{Name: agentproto.BootstrapTokenEnv, Value: bootstrap}},
				Ports:   []corev1.ContainerPort{{Name: "agent", ContainerPort: agentPort, Protocol: corev1.ProtocolTCP}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromInt32(agentPort)}},
					PeriodSeconds: 1, FailureThreshold: 3,
				},
				Resources:    corev1.ResourceRequirements{Requests: res, Limits: res},
				VolumeMounts: mounts,
				SecurityContext: &corev1.SecurityContext{
					RunAsUser:                &rootUID,
					AllowPrivilegeEscalation: ptr(!s.NoNewPrivileges),
					ReadOnlyRootFilesystem:   &readOnly,
					Privileged:               &falseV,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"NET_RAW"}},
					SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
			}},
			Volumes: volumes,
		},
	}
	if rc != "" {
		pod.Spec.RuntimeClassName = &rc
	}
	if e := o.Egress; e != nil && e.DNS != "" {
		pod.Spec.DNSPolicy = corev1.DNSNone
		pod.Spec.DNSConfig = &corev1.PodDNSConfig{Nameservers: []string{e.DNS}}
	}
	return pod
}

func ptr[T any](v T) *T { return &v }

// bootstrapOf is the bootstrap token in a Pod's spec.
func bootstrapOf(p *corev1.Pod) string {
	for _, c := range p.Spec.Containers {
		if c.Name != containerName {
			continue
		}
		for _, e := range c.Env {
			if e.Name == agentproto.BootstrapTokenEnv {
				return e.Value
			}
		}
	}
	return ""
}

// newBootstrap returns a fresh bootstrap token.
func newBootstrap() string { return idgen.Token() }
