package egress

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha1"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// CA file names inside the directory given to [LoadOrCreateCA].
const (
	// CACertFile holds the CA certificate (PEM), the file sandboxes trust.
	CACertFile = "ca.pem"
	// CAKeyFile holds the CA private key (PKCS#8 PEM), mode 0600.
	CAKeyFile = "ca-key.pem"
)

// Validity of the certificates a [CA] makes.
const (
	// CAValidity is the lifetime of a new CA certificate.
	CAValidity = 10 * 365 * 24 * time.Hour
	// LeafValidity is the lifetime of a leaf minted by [CA.CertFor],
	// which is also backdated by [LeafBackdate] against clock skew.
	LeafValidity = 24 * time.Hour
	// LeafBackdate is how far before now a leaf's validity starts.
	LeafBackdate = time.Hour
	// MaxCachedLeaves bounds the leaf cache of a [CA].
	MaxCachedLeaves = 1024
)

// CA is the installation's TLS interception authority: the proxy
// terminates TLS with a leaf it mints for the requested name, so that it
// can inject secrets into HTTPS requests (threat-model.md #20). Sandboxes trust
// [CA.CertPEM]; nothing else should.
//
// The CA certificate carries a critical name constraint excluding every IP
// address (it can vouch for DNS names only). A CA is safe for concurrent
// use.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey
	// leafKey is the key of every leaf (one per process, never stored).
	leafKey *ecdsa.PrivateKey
	now     func() time.Time

	// mu guards cache and order.
	mu    sync.Mutex
	cache map[string]*tls.Certificate
	order []string // insertion order, for eviction
}

// LoadOrCreateCA loads the CA from dir/ca.pem and dir/ca-key.pem, creating
// both (and dir, mode 0700) on first use: an ECDSA P-256 key, a
// self-signed certificate valid for ten years with common name
// "corral egress CA <random>". Both files are written with mode 0600
// through a temporary file and a rename. A key left without a certificate
// (a crash during creation) is replaced; a certificate without its key, a
// key readable by group or others, or a key that does not match the
// certificate is an error.
func LoadOrCreateCA(dir string) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("egress: CA dir: %w", err)
	}
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	_, certErr := os.Stat(certPath)
	_, keyErr := os.Stat(keyPath)
	switch {
	case certErr == nil && keyErr == nil:
		return loadCA(certPath, keyPath)
	case certErr == nil:
		return nil, fmt.Errorf("egress: CA certificate %s exists but its key %s does not", certPath, CAKeyFile)
	case !errors.Is(certErr, fs.ErrNotExist):
		return nil, fmt.Errorf("egress: CA certificate: %w", certErr)
	case keyErr != nil && !errors.Is(keyErr, fs.ErrNotExist):
		return nil, fmt.Errorf("egress: CA key: %w", keyErr)
	}
	return createCA(certPath, keyPath)
}

func createCA(certPath, keyPath string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("egress: CA key: %w", err)
	}
	var tag [6]byte
	if _, err := rand.Read(tag[:]); err != nil {
		return nil, err
	}
	serial, err := randSerial()
	if err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, err
	}
	ski := sha1.Sum(pub)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "corral egress CA " + hex.EncodeToString(tag[:]), Organization: []string{"corral"}},
		NotBefore:             now.Add(-LeafBackdate),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
		SubjectKeyId:          ski[:],
		// DNS names only: no leaf of this CA is valid for an IP address.
		PermittedDNSDomainsCritical: true,
		ExcludedIPRanges: []*net.IPNet{
			{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
			{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
		},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("egress: CA certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	// The key first: a certificate on disk always has its key.
	if err := writeFileAtomic(keyPath, keyPEM); err != nil {
		return nil, fmt.Errorf("egress: write CA key: %w", err)
	}
	if err := writeFileAtomic(certPath, certPEM); err != nil {
		return nil, fmt.Errorf("egress: write CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return newCA(cert, certPEM, key)
}

// writeFileAtomic writes data to path with mode 0600 via a temporary file
// in the same directory, synced, then renamed over path.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func loadCA(certPath, keyPath string) (*CA, error) {
	st, err := os.Stat(keyPath)
	if err != nil {
		return nil, fmt.Errorf("egress: CA key: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("egress: CA key %s has mode %v; it must not be readable by group or others (chmod 600)", keyPath, st.Mode().Perm())
	}
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("egress: CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("egress: CA key: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("egress: %s holds no PEM certificate", certPath)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("egress: CA certificate %s: %w", certPath, err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, fmt.Errorf("egress: %s holds no PEM key", keyPath)
	}
	var key *ecdsa.PrivateKey
	switch kb.Type {
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
		if err != nil {
			return nil, fmt.Errorf("egress: CA key %s: %w", keyPath, err)
		}
		ek, ok := k.(*ecdsa.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("egress: CA key %s is not an ECDSA key", keyPath)
		}
		key = ek
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(kb.Bytes)
		if err != nil {
			return nil, fmt.Errorf("egress: CA key %s: %w", keyPath, err)
		}
	default:
		return nil, fmt.Errorf("egress: CA key %s: unexpected PEM type %q", keyPath, kb.Type)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("egress: %s is not a CA certificate", certPath)
	}
	if pk, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || !pk.Equal(&key.PublicKey) {
		return nil, fmt.Errorf("egress: CA key %s does not match certificate %s", keyPath, certPath)
	}
	return newCA(cert, certPEM, key)
}

func newCA(cert *x509.Certificate, certPEM []byte, key *ecdsa.PrivateKey) (*CA, error) {
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return &CA{
		cert:    cert,
		certPEM: bytes.Clone(certPEM),
		key:     key,
		leafKey: leafKey,
		now:     time.Now,
		cache:   map[string]*tls.Certificate{},
	}, nil
}

func randSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// CertPEM returns the CA certificate in PEM form, for the sandboxes' trust
// store.
func (c *CA) CertPEM() []byte { return bytes.Clone(c.certPEM) }

// Certificate returns the parsed CA certificate.
func (c *CA) Certificate() *x509.Certificate { return c.cert }

// CertFor returns a leaf certificate for host (a DNS name; IP literals are
// refused), signed by the CA, valid for [LeafValidity] from
// [LeafBackdate] ago (and never past the CA's own expiry). Leaves are
// cached, at most [MaxCachedLeaves], and re-minted when less than a
// quarter of their validity remains.
func (c *CA) CertFor(host string) (*tls.Certificate, error) {
	h := normalizeHost(host)
	if err := checkName(h); err != nil {
		return nil, fmt.Errorf("egress: certificate for %q: %w", oneLine(host), err)
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if lc, ok := c.cache[h]; ok && lc.Leaf != nil && now.Before(lc.Leaf.NotAfter.Add(-LeafValidity/4)) {
		return lc, nil
	}
	serial, err := randSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(LeafValidity)
	if notAfter.After(c.cert.NotAfter) {
		notAfter = c.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: h},
		DNSNames:              []string{h},
		NotBefore:             now.Add(-LeafBackdate),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &c.leafKey.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("egress: certificate for %s: %w", h, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	tc := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: c.leafKey, Leaf: leaf}
	if _, ok := c.cache[h]; !ok {
		if len(c.order) >= MaxCachedLeaves {
			delete(c.cache, c.order[0])
			c.order = c.order[1:]
		}
		c.order = append(c.order, h)
	}
	c.cache[h] = tc
	return tc, nil
}
