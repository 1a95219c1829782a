package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/egress"
)

// TestKubeConfigValidate: a bad --kube-* setting is refused at start with
// a message naming the flag, before anything touches the cluster.
func TestKubeConfigValidate(t *testing.T) {
	ok := KubeConfig{Image: "img"}
	dir := t.TempDir()
	ca, err := egress.LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(filepath.Join(dir, "ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	caCert, caWithKey := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "both.pem")
	if err := os.WriteFile(caCert, ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(caWithKey, append(ca.CertPEM(), key...), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  KubeConfig
		want string // "" for valid
	}{
		{"image", ok, ""},
		{"images only", KubeConfig{Images: "base=img"}, ""},
		{"pools", KubeConfig{Image: "img", Pools: "base=20, code-interpreter=0"}, ""},
		{"no image", KubeConfig{}, "--kube-image"},
		{"bad images", KubeConfig{Images: "base"}, "--kube-images"},
		{"bad pool size", KubeConfig{Image: "img", Pools: "base=-1"}, "--kube-pools"},
		{"huge pool", KubeConfig{Image: "img", Pools: "base=10001"}, "--kube-pools"},
		{"bad class", KubeConfig{Image: "img", RuntimeClasses: "=x"}, "--kube-runtime-classes"},
		{"egress without dns", KubeConfig{Image: "img", Egress: true}, "--kube-dns"},
		{"egress", KubeConfig{Image: "img", Egress: true, DNS: "10.96.0.53"}, ""},
		{"dns by name", KubeConfig{Image: "img", Egress: true, DNS: "corral-egress.corral.svc"}, "--kube-dns"},
		{"egress CA", KubeConfig{Image: "img", Egress: true, DNS: "10.96.0.53", EgressCA: caCert}, ""},
		{"egress CA without egress", KubeConfig{Image: "img", EgressCA: caCert}, "--kube-egress-ca needs --kube-egress"},
		// The CA's key would let every sandbox forge the proxy's certificates.
		{"egress CA with its key", KubeConfig{Image: "img", Egress: true, DNS: "10.96.0.53", EgressCA: caWithKey}, "never its key"},
		{"egress CA missing", KubeConfig{Image: "img", Egress: true, DNS: "10.96.0.53", EgressCA: filepath.Join(dir, "nope.pem")}, "--kube-egress-ca"},
	} {
		err := tc.cfg.validate()
		if tc.want == "" && err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v; want an error naming %s", tc.name, err, tc.want)
		}
	}
	cfg := Config{Driver: "kubernetes"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `driver "kubernetes"`) {
		t.Errorf("--driver kubernetes: %v", err)
	}
}

// TestKubeProxyEnv: a kube sandbox with a network names the egress
// Service by address (its only resolver, the DNS filter, would refuse the
// Service's name) on the proxy port.
func TestKubeProxyEnv(t *testing.T) {
	env := KubeConfig{Egress: true, DNS: "10.96.0.53"}.proxyEnv()
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
		if env[k] != "http://10.96.0.53:3128" {
			t.Errorf("%s = %q", k, env[k])
		}
	}
}
