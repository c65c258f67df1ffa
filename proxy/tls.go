package proxy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
)

// TLS for host routing (https://{port}-{id}.{domain}, the SDK's default):
// a configured certificate, or a local CA that the node generates once in
// its data directory and a certificate for *.{domain} it signs. Clients
// trust the CA's certificate (CAFile) to reach sandboxes over HTTPS.

// The files of the local CA, under <data dir>/tls.
const (
	CAFile      = "ca.pem"
	caKeyFile   = "ca-key.pem"
	leafFile    = "proxy.pem"
	leafKeyFile = "proxy-key.pem"
)

// leafLifetime is the validity of the generated proxy certificate; it is
// made again when less than a third of it is left.
const leafLifetime = 90 * 24 * time.Hour

// TLSConfig returns the proxy's TLS configuration: the configured
// certificate and key (both set), else one signed by the local CA in dir.
func TLSConfig(domain, certFile, keyFile, dir string) (*tls.Config, error) {
	var cert tls.Certificate
	var err error
	switch {
	case certFile != "" && keyFile != "":
		cert, err = tls.LoadX509KeyPair(certFile, keyFile)
	case certFile != "" || keyFile != "":
		return nil, errors.New("proxy tls: set both the certificate and the key, or neither")
	default:
		cert, err = LocalCA(dir, domain)
	}
	if err != nil {
		return nil, fmt.Errorf("proxy tls: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}, nil
}

// LocalCA loads the local CA from dir (creating it on first use) and
// returns a certificate for domain and *.domain that it signed (made again
// when missing, for another domain, or near its end).
func LocalCA(dir, domain string) (tls.Certificate, error) {
	if domain == "" {
		return tls.Certificate{}, errors.New("local CA: host routing needs a domain")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tls.Certificate{}, fmt.Errorf("local CA dir %s: %w", dir, err)
	}
	ca, caKey, err := loadOrCreateCA(dir)
	if err != nil {
		return tls.Certificate{}, err
	}
	if leaf, err := tls.LoadX509KeyPair(filepath.Join(dir, leafFile), filepath.Join(dir, leafKeyFile)); err == nil && leafUsable(leaf, ca, domain) {
		return leaf, nil
	}
	return issueLeaf(dir, domain, ca, caKey)
}

// leafUsable: the stored certificate is the CA's, for domain, and not
// near its end.
func leafUsable(c tls.Certificate, ca *x509.Certificate, domain string) bool {
	if len(c.Certificate) == 0 {
		return false
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil || leaf.CheckSignatureFrom(ca) != nil {
		return false
	}
	return slices.Contains(leaf.DNSNames, "*."+domain) && time.Until(leaf.NotAfter) > leafLifetime/3
}

func loadOrCreateCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certPEM, cerr := os.ReadFile(filepath.Join(dir, CAFile))
	keyPEM, kerr := os.ReadFile(filepath.Join(dir, caKeyFile))
	if cerr == nil && kerr == nil {
		return parseCA(certPEM, keyPEM)
	}
	if !os.IsNotExist(cerr) && cerr != nil || !os.IsNotExist(kerr) && kerr != nil {
		return nil, nil, fmt.Errorf("local CA in %s: %w", dir, errors.Join(cerr, kerr))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("local CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "aenvd local CA", Organization: []string{"AgentENV"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().AddDate(10, 0, 0),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("local CA certificate: %w", err)
	}
	// The key first: a CA certificate on disk always has its key.
	if err := writeKey(filepath.Join(dir, caKeyFile), key); err != nil {
		return nil, nil, err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, CAFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return nil, nil, fmt.Errorf("write local CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	return ca, key, err
}

func parseCA(certPEM, keyPEM []byte) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, errors.New("local CA: not PEM")
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("local CA certificate: %w", err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("local CA key: %w", err)
	}
	if !ca.IsCA || !key.PublicKey.Equal(ca.PublicKey) {
		return nil, nil, errors.New("local CA: the key does not belong to the CA certificate")
	}
	return ca, key, nil
}

func issueLeaf(dir, domain string, ca *x509.Certificate, caKey *ecdsa.PrivateKey) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("proxy key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "*." + domain},
		DNSNames:  []string{domain, "*." + domain},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(leafLifetime),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("proxy certificate: %w", err)
	}
	if err := writeKey(filepath.Join(dir, leafKeyFile), key); err != nil {
		return tls.Certificate{}, err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, leafFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return tls.Certificate{}, fmt.Errorf("write proxy certificate: %w", err)
	}
	return tls.LoadX509KeyPair(filepath.Join(dir, leafFile), filepath.Join(dir, leafKeyFile))
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("encode key %s: %w", path, err)
	}
	if err := atomicfile.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("write key %s: %w", path, err)
	}
	return nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}
