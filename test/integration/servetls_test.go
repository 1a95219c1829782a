package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corral "github.com/corralhq/corral/sdk/go"
)

// selfSignedCert writes a self-signed certificate for 127.0.0.1 (its own
// CA) and its key as PEM files in dir.
func selfSignedCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "corral test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// startTLSServe starts `corral serve` with a self-signed certificate for
// 127.0.0.1 made in the test; it returns the server, the certificate's
// file (the CA clients trust) and a pool holding it.
func startTLSServe(t *testing.T) (p *serveProc, cert string, pool *x509.CertPool) {
	t.Helper()
	tmp := t.TempDir()
	for d := tmp; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o711) // sandbox root must traverse to its rootfs
	}
	cert, key := selfSignedCert(t, tmp)
	pool, err := corral.LoadCAFile(cert)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	addr := freeAddr(t)
	p = startServeURL(t, filepath.Join(tmp, "data"), addr, "https://"+addr, hc,
		"--tls-cert", cert, "--tls-key", key, "--no-network", "--kill-on-shutdown")
	t.Cleanup(func() {
		if p.running() {
			_ = p.signal(t, syscall.SIGTERM)
		}
		if t.Failed() {
			t.Logf("corral serve log (tail):\n%s", logTail(p.log.String(), 60))
		}
	})
	return p, cert, pool
}

// TestServeTLS proves that `corral serve --tls-cert --tls-key` serves the
// API over HTTPS only (issue 12: API keys and sandbox tokens must not
// cross a network in clear text): the Go SDK trusting the test's CA and
// the CLI with CORRAL_CA_FILE list sandboxes over https://127.0.0.1, the
// CLI without the CA refuses the unknown certificate, a plain-HTTP
// request with the admin key to the TLS port is not served (no 200, no
// sandbox list), and TLS 1.1 is refused.
func TestServeTLS(t *testing.T) {
	need(t)
	ctx := context.Background()
	p, cert, pool := startTLSServe(t)

	c := corral.New(p.url, p.key, corral.WithRootCAs(pool))
	if _, err := c.List(ctx, corral.ListOptions{}); err != nil {
		t.Errorf("Go SDK list over https with the CA: %v", err)
	}

	cli := func(caFile string) (string, error) {
		cmd := exec.Command(env.bin, "sandbox", "ls")
		cmd.Env = append(os.Environ(), "CORRAL_URL="+p.url, "CORRAL_API_KEY="+p.key, "CORRAL_CA_FILE="+caFile)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := cli(cert); err != nil {
		t.Errorf("corral sandbox ls over https with CORRAL_CA_FILE: %v\n%s", err, out)
	}
	if out, err := cli(""); err == nil || !strings.Contains(out, "certificate") {
		t.Errorf("corral sandbox ls without the CA: %v, want a certificate error\n%s", err, out)
	}

	req, err := http.NewRequest("GET", "http://"+strings.TrimPrefix(p.url, "https://")+"/v1/sandboxes", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+p.key)
	req.Header.Set("X-API-Key", p.key)
	if resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "HTTPS") {
			t.Errorf("plain http to the TLS port: %d %q, want 400 naming HTTPS", resp.StatusCode, body)
		}
	}

	old := &tls.Config{RootCAs: pool, MaxVersion: tls.VersionTLS11}
	if conn, err := tls.Dial("tcp", strings.TrimPrefix(p.url, "https://"), old); err == nil {
		conn.Close()
		t.Errorf("a TLS 1.1 handshake succeeded, want TLS 1.2 or later only")
	}
}

// TestServeRefusesPlainNonLoopback proves that `corral serve --listen
// 0.0.0.0:PORT` without TLS or --insecure (issue 12: API keys and sandbox
// tokens would cross the network in clear text) exits with status 2 and
// a message saying why and how to fix it, before it creates its data
// directory or binds the port: nothing listens on PORT afterwards (no
// traffic is sent anywhere; only /proc/net/tcp is read).
func TestServeRefusesPlainNonLoopback(t *testing.T) {
	need(t)
	tmp := t.TempDir()
	data := filepath.Join(tmp, "data")
	_, port, err := net.SplitHostPort(freeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, listen := range []string{"0.0.0.0:" + port, ":" + port} {
		cmd := exec.Command(env.bin, "serve", "--data", data, "--listen", listen, "--no-network")
		cmd.Env = append(os.Environ(), "CORRAL_CONFIG=", "CORRAL_LISTEN=")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("serve --listen %s without TLS: %v, want exit status 2\n%s", listen, err, out)
		}
		for _, w := range []string{"not a loopback address", "in clear text", "--tls-cert and --tls-key, or --insecure"} {
			if !strings.Contains(string(out), w) {
				t.Errorf("serve --listen %s: message does not say %q:\n%s", listen, w, out)
			}
		}
		if _, err := os.Stat(data); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the refused server made its data dir: %v", err)
		}
	}
	tcp, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(tcp), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 3 && f[3] == "0A" && strings.HasSuffix(strings.ToLower(f[1]), ":"+strings.ToLower(hexPort(port))) {
			t.Errorf("something listens on port %s: %s", port, line)
		}
	}
}

// hexPort is a decimal port as /proc/net/tcp writes it (4 hex digits).
func hexPort(port string) string {
	var n int
	for _, c := range port {
		n = n*10 + int(c-'0')
	}
	const digits = "0123456789ABCDEF"
	return string([]byte{digits[n>>12&15], digits[n>>8&15], digits[n>>4&15], digits[n&15]})
}

// TestE2BSDKOverTLS proves that the unmodified e2b JS SDK works against
// `corral serve --tls-cert --tls-key` with https:// URLs and the test CA
// in NODE_EXTRA_CA_CERTS (create, run a command, kill: REST and envd over
// TLS), and refuses the server's certificate without that CA: the SDK
// verifies what it connects to, so its API key is not sent to a server
// it cannot authenticate.
func TestE2BSDKOverTLS(t *testing.T) {
	need(t)
	node := e2bNode(t)
	p, cert, _ := startTLSServe(t)
	const script = `import { Sandbox } from 'e2b'
const sbx = await Sandbox.create({ timeoutMs: 120000 })
try {
  const r = await sbx.commands.run('echo tls-$((40+2))')
  console.log('out=' + r.stdout.trim())
} finally {
  await sbx.kill()
}`
	run := func(extra ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, node, "--input-type=module", "-e", script)
		cmd.Dir = e2bDir
		cmd.Env = append(e2bEnvFor(p.url, p.key), extra...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("NODE_EXTRA_CA_CERTS=" + cert)
	t.Logf("with the CA: %s", out)
	if err != nil || !strings.Contains(out, "out=tls-42") {
		t.Errorf("e2b SDK over https with NODE_EXTRA_CA_CERTS: %v\n%s", err, out)
	}
	out, err = run()
	t.Logf("without the CA: %s", logTail(out, 5))
	if err == nil || strings.Contains(out, "out=tls-42") || !strings.Contains(out, "certificate") {
		t.Errorf("e2b SDK over https without the CA: %v, want a certificate failure\n%s", err, out)
	}
}
