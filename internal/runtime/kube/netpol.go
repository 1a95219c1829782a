package kube

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// The NetworkPolicies the driver applies to its namespace: PolicyName
// denies every sandbox Pod all egress, PolicyEgressName admits the Pods
// labelled LabelEgress=true to the egress proxy.
const (
	PolicyName       = "corral-sandboxes"
	PolicyEgressName = "corral-sandboxes-egress"
)

// policyCNIs are the DaemonSets (in kube-system) of CNI plugins that
// enforce NetworkPolicy, by name: Calico, Cilium (and GKE Dataplane V2's
// anetd), Antrea, kube-router, Weave Net, Canal, Kube-OVN, the AWS VPC
// CNI's network policy agent and kube-network-policies.
var policyCNIs = []string{
	"calico-node", "cilium", "anetd", "antrea-agent", "kube-router", "weave-net",
	"canal", "kube-ovn-cni", "aws-network-policy-agent", "kube-network-policies",
}

// DetectPolicyCNI looks for a CNI that enforces NetworkPolicy: a
// DaemonSet in kube-system named as one of policyCNIs. Without one, a
// NetworkPolicy is an object nobody enforces and a sandbox Pod could
// reach anything the cluster network reaches (other Pods, the cloud's
// metadata address, the internet): the kube driver refuses to run with
// egress on rather than pretend. The error says how to override
// (--kube-networkpolicy-enforced) for a CNI this list does not know.
func DetectPolicyCNI(ctx context.Context, c kubernetes.Interface) error {
	list, err := c.AppsV1().DaemonSets("kube-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("kube: egress is on, and detecting a CNI that enforces NetworkPolicy failed (list DaemonSets in kube-system: %w); "+
			"grant the driver list on daemonsets in kube-system, or pass --kube-networkpolicy-enforced if the cluster's CNI enforces NetworkPolicy", err)
	}
	var seen []string
	for _, ds := range list.Items {
		for _, n := range policyCNIs {
			if ds.Name == n {
				return nil
			}
		}
		seen = append(seen, ds.Name)
	}
	sort.Strings(seen)
	return fmt.Errorf("kube: refusing to start with egress on: no CNI that enforces NetworkPolicy was detected "+
		"(looked for the DaemonSets %s in kube-system; found %q). Without one, sandbox Pods could reach every address the cluster network reaches. "+
		"Install such a CNI, or pass --kube-networkpolicy-enforced if yours enforces NetworkPolicy and is not in this list",
		strings.Join(policyCNIs, ", "), seen)
}

// networkPolicy is the default-deny policy of every sandbox Pod of the
// namespace: ingress only from the control plane to the agent port, no
// egress at all. It defends against a sandbox talking to anything but
// corral's proxy (another sandbox, the API server, the node, the metadata
// service), where the proxy's allowlists and audit cannot see it, and,
// with egressPolicy, against a sandbox with network none (or an idle
// pool Pod) reaching the proxy at all.
func networkPolicy(o Options) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	agent := intstr.FromInt32(agentPort)
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: PolicyName, Namespace: o.Namespace,
			Labels: map[string]string{LabelManagedBy: managedByValue}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelName: nameValue, LabelManagedBy: managedByValue}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: nsSelector(o.ControlPlaneNamespace),
					PodSelector:       &metav1.LabelSelector{MatchLabels: o.ControlPlane},
				}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &agent}},
			}},
			Egress: []networkingv1.NetworkPolicyEgressRule{},
		},
	}
}

// egressPolicy admits the sandbox Pods labelled LabelEgress=true (those
// whose network is not none, runtime.Config.Egress) to the egress
// proxy's Pods and its DNS filter, and nothing else; without egress it
// admits nothing. NetworkPolicies are additive: a Pod without the label
// keeps networkPolicy's deny-all egress.
func egressPolicy(o Options) *networkingv1.NetworkPolicy {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: PolicyEgressName, Namespace: o.Namespace,
			Labels: map[string]string{LabelManagedBy: managedByValue}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelName: nameValue, LabelManagedBy: managedByValue, LabelEgress: egressOn}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress:      []networkingv1.NetworkPolicyEgressRule{},
		},
	}
	if e := o.Egress; e != nil {
		proxy, dns := intstr.FromInt32(e.ProxyPort), intstr.FromInt32(e.DNSPort)
		ns := e.Namespace
		if ns == "" {
			ns = o.ControlPlaneNamespace
		}
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{
			To: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: nsSelector(ns),
				PodSelector:       &metav1.LabelSelector{MatchLabels: e.Selector},
			}},
			Ports: []networkingv1.NetworkPolicyPort{
				{Protocol: &tcp, Port: &proxy}, {Protocol: &udp, Port: &dns}, {Protocol: &tcp, Port: &dns},
			},
		}}
	}
	return np
}

func nsSelector(ns string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}
}

// ensureNetworkPolicy creates the namespace's policies (the default deny,
// then the egress admission) or brings them to what o says.
func ensureNetworkPolicy(ctx context.Context, o Options) error {
	for _, want := range []*networkingv1.NetworkPolicy{networkPolicy(o), egressPolicy(o)} {
		if err := ensurePolicy(ctx, o, want); err != nil {
			return err
		}
	}
	return nil
}

func ensurePolicy(ctx context.Context, o Options, want *networkingv1.NetworkPolicy) error {
	api := o.Client.NetworkingV1().NetworkPolicies(o.Namespace)
	cur, err := api.Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if _, err := api.Create(ctx, want, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("kube: create NetworkPolicy %s/%s: %w", o.Namespace, want.Name, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("kube: read NetworkPolicy %s/%s: %w", o.Namespace, want.Name, err)
	}
	cur.Spec = want.Spec
	if _, err := api.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("kube: update NetworkPolicy %s/%s: %w", o.Namespace, want.Name, err)
	}
	return nil
}
