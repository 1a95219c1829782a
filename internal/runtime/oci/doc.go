// Package oci is the runtime driver for OCI runtimes driven by binary:
// runc (default) and runsc (gVisor). For each sandbox it mounts an overlay
// of the template over a writable layer on a size-capped tmpfs, writes an
// OCI bundle with corral's hardening defaults, and runs the in-sandbox
// agent as the container's init. It never sets up namespaces, pivot_root or
// seccomp itself: the runtime does.
package oci
