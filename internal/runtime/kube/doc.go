// Package kube is the Kubernetes runtime driver: a sandbox is a Pod whose
// container runs the corral agent as its entrypoint under a sandbox
// RuntimeClass (gVisor, Kata), reached over TCP at the Pod IP with the
// per-sandbox access token. Warm pools are ready Pods the control plane
// owns, claimed by a label patch with a resourceVersion precondition, so
// that two control-plane replicas never hand out the same Pod; the
// sandbox's token and environment are pushed to the agent after the
// claim (POST /init, authenticated with the Pod's bootstrap token).
// A default-deny NetworkPolicy confines every sandbox Pod's traffic to
// corral's egress proxy and DNS filter. See docs/kubernetes.md.
package kube
