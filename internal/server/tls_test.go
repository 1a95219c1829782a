package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeCert writes a self-signed certificate for 127.0.0.1 and its key
// as PEM files in dir, named prefix.crt and prefix.key.
func writeCert(t *testing.T, dir, prefix string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "corral test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, prefix+".crt"), filepath.Join(dir, prefix+".key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestValidateTLS defends against API keys and sandbox tokens crossing a
// network in clear text (a plain-HTTP listener on a non-loopback address,
// including ":7420" and 0.0.0.0, is refused unless --insecure, with a
// message saying why and how to fix it), and against a TLS setting that
// would only fail at the first handshake: a certificate without its key,
// a certificate and key that are not a pair, or an unreadable file are
// refused at start, naming the file and never printing the key.
func TestValidateTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key := writeCert(t, dir, "a")
	_, otherKey := writeCert(t, dir, "b")
	keyPEM, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.key")
	const why = "API keys and sandbox tokens would cross the network in clear text; give --tls-cert and --tls-key, or --insecure"
	for _, tc := range []struct {
		name              string
		listen, cert, key string
		insecure          bool
		want              []string // nil: accepted
	}{
		{"default loopback plain", "", "", "", false, nil},
		{"127.0.0.1 plain", "127.0.0.1:7420", "", "", false, nil},
		{"127.8.9.10 plain", "127.8.9.10:7420", "", "", false, nil},
		{"::1 plain", "[::1]:7420", "", "", false, nil},
		{"localhost plain", "localhost:7420", "", "", false, nil},
		{"empty host plain", ":7420", "", "", false, []string{`listen ":7420" is not a loopback address`, why}},
		{"0.0.0.0 plain", "0.0.0.0:7420", "", "", false, []string{`listen "0.0.0.0:7420" is not a loopback address`, why}},
		{":: plain", "[::]:7420", "", "", false, []string{"is not a loopback address", why}},
		{"lan address plain", "192.168.1.5:7420", "", "", false, []string{"is not a loopback address", why}},
		{"host name plain", "corral.example:7420", "", "", false, []string{"is not a loopback address", why}},
		{"0.0.0.0 insecure", "0.0.0.0:7420", "", "", true, nil},
		{"0.0.0.0 tls", "0.0.0.0:7420", cert, key, false, nil},
		{"loopback tls", "127.0.0.1:7420", cert, key, false, nil},
		{"cert without key", "127.0.0.1:7420", cert, "", false, []string{"tls-cert is set without tls-key"}},
		{"key without cert", "127.0.0.1:7420", "", key, false, []string{"tls-key is set without tls-cert"}},
		{"cert without key, insecure", "0.0.0.0:7420", cert, "", true, []string{"tls-cert is set without tls-key"}},
		{"bad pair", "0.0.0.0:7420", cert, otherKey, false, []string{"not a valid certificate and private key pair", cert, otherKey}},
		{"key as cert", "0.0.0.0:7420", key, key, false, []string{"not a valid certificate and private key pair"}},
		{"unreadable key", "0.0.0.0:7420", cert, missing, false, []string{"tls-key " + missing}},
		{"unreadable cert", "0.0.0.0:7420", missing, key, false, []string{"tls-cert " + missing}},
		{"bad listen", "7420", "", "", false, []string{`listen "7420"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Listen: tc.listen, TLSCert: tc.cert, TLSKey: tc.key, Insecure: tc.insecure}
			err := c.Validate()
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted, want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if c.Listen != tc.listen {
				t.Errorf("refused Config changed: listen %q", c.Listen)
			}
			body := strings.TrimSpace(strings.Split(strings.SplitN(string(keyPEM), "\n", 2)[1], "-----END")[0])
			for _, line := range strings.Split(body, "\n") {
				if len(line) > 16 && strings.Contains(err.Error(), line) {
					t.Errorf("error prints key material: %v", err)
				}
			}
		})
	}
}
