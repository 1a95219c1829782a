package egress

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCAPersisted checks that the CA is created once per installation
// (files with mode 0600, ECDSA P-256, ten-year validity, CN "corral egress
// CA <random>", no IP addresses allowed) and loaded unchanged afterwards,
// so sandboxes keep trusting the same certificate across restarts.
func TestCAPersisted(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	ca, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{CACertFile, CAKeyFile} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", f, st.Mode().Perm())
		}
	}
	if st, _ := os.Stat(dir); st.Mode().Perm() != 0o700 {
		t.Errorf("dir has mode %v, want 0700", st.Mode().Perm())
	}
	c := ca.Certificate()
	if !c.IsCA || !strings.HasPrefix(c.Subject.CommonName, "corral egress CA ") || c.PublicKeyAlgorithm != x509.ECDSA {
		t.Errorf("CA certificate: CA %v, CN %q, key %v", c.IsCA, c.Subject.CommonName, c.PublicKeyAlgorithm)
	}
	if d := c.NotAfter.Sub(c.NotBefore); d < CAValidity || d > CAValidity+2*time.Hour {
		t.Errorf("CA validity %v", d)
	}
	if len(c.ExcludedIPRanges) != 2 || !c.PermittedDNSDomainsCritical {
		t.Errorf("CA name constraints: excluded IPs %v, critical %v", c.ExcludedIPRanges, c.PermittedDNSDomainsCritical)
	}
	if b, _ := pem.Decode(ca.CertPEM()); b == nil || !bytes.Equal(b.Bytes, c.Raw) {
		t.Errorf("CertPEM does not hold the CA certificate")
	}

	again, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.CertPEM(), ca.CertPEM()) {
		t.Fatal("reloaded CA differs from the one created")
	}
	// A leaf of the reloaded CA verifies against the original certificate.
	leaf, err := again.CertFor("api.example.test")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM())
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "api.example.test"}); err != nil {
		t.Fatalf("leaf of reloaded CA: %v", err)
	}
}

// TestCACertFor checks minted leaves: valid for the host only, for 24 h
// from one hour ago, server auth, cached.
func TestCACertFor(t *testing.T) {
	ca, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM())
	leaf, err := ca.CertFor("API.Secret.Test.")
	if err != nil {
		t.Fatal(err)
	}
	l := leaf.Leaf
	if _, err := l.Verify(x509.VerifyOptions{Roots: pool, DNSName: "api.secret.test"}); err != nil {
		t.Fatalf("verify: %v", err)
	}
	if _, err := l.Verify(x509.VerifyOptions{Roots: pool, DNSName: "other.test"}); err == nil {
		t.Fatal("leaf verifies for another name")
	}
	if d := l.NotAfter.Sub(l.NotBefore); d != LeafValidity+LeafBackdate {
		t.Errorf("leaf validity %v, want %v", d, LeafValidity+LeafBackdate)
	}
	if l.IsCA || len(l.ExtKeyUsage) != 1 || l.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth {
		t.Errorf("leaf usage: CA %v, ext %v", l.IsCA, l.ExtKeyUsage)
	}
	again, _ := ca.CertFor("api.secret.test")
	if again != leaf {
		t.Error("second CertFor minted a new leaf, want the cached one")
	}
	for _, bad := range []string{"203.0.113.7", "::1", "", "a..b", "*.x.test"} {
		if _, err := ca.CertFor(bad); err == nil {
			t.Errorf("CertFor(%q) succeeded", bad)
		}
	}
	// The cache is bounded.
	for i := 0; i < MaxCachedLeaves+10; i++ {
		if _, err := ca.CertFor("h" + strings.Repeat("x", i%7) + "-" + strconv.Itoa(i) + ".test"); err != nil {
			t.Fatal(err)
		}
	}
	ca.mu.Lock()
	n := len(ca.cache)
	ca.mu.Unlock()
	if n > MaxCachedLeaves {
		t.Errorf("cache holds %d leaves, want at most %d", n, MaxCachedLeaves)
	}
}

// TestCALoadErrors checks the refusals: a certificate without its key, a
// key readable by others, a key that does not match; and that a key left
// alone by a crash is replaced.
func TestCALoadErrors(t *testing.T) {
	t.Run("cert-without-key", func(t *testing.T) {
		dir := t.TempDir()
		if _, err := LoadOrCreateCA(dir); err != nil {
			t.Fatal(err)
		}
		os.Remove(filepath.Join(dir, CAKeyFile))
		if _, err := LoadOrCreateCA(dir); err == nil {
			t.Fatal("loaded a CA without its key")
		}
	})
	t.Run("key-readable", func(t *testing.T) {
		dir := t.TempDir()
		if _, err := LoadOrCreateCA(dir); err != nil {
			t.Fatal(err)
		}
		os.Chmod(filepath.Join(dir, CAKeyFile), 0o644)
		if _, err := LoadOrCreateCA(dir); err == nil || !strings.Contains(err.Error(), "chmod 600") {
			t.Fatalf("err %v, want a refusal of the world-readable key", err)
		}
	})
	t.Run("mismatch", func(t *testing.T) {
		d1, d2 := t.TempDir(), t.TempDir()
		if _, err := LoadOrCreateCA(d1); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadOrCreateCA(d2); err != nil {
			t.Fatal(err)
		}
		k, _ := os.ReadFile(filepath.Join(d2, CAKeyFile))
		os.WriteFile(filepath.Join(d1, CAKeyFile), k, 0o600)
		if _, err := LoadOrCreateCA(d1); err == nil || !strings.Contains(err.Error(), "does not match") {
			t.Fatalf("err %v, want a mismatch", err)
		}
	})
	t.Run("key-only-recreated", func(t *testing.T) {
		dir := t.TempDir()
		if _, err := LoadOrCreateCA(dir); err != nil {
			t.Fatal(err)
		}
		os.Remove(filepath.Join(dir, CACertFile))
		if _, err := LoadOrCreateCA(dir); err != nil {
			t.Fatalf("recreate: %v", err)
		}
		if _, err := LoadOrCreateCA(dir); err != nil {
			t.Fatalf("reload: %v", err)
		}
	})
}
