package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
)

// TestHostRoutingOverTLS: with the local CA, the proxy answers
// https://{port}-{id}.{domain} for a client that trusts only the CA file
// the node wrote; the name resolves to loopback in the test's own dialer.
func TestHostRoutingOverTLS(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	cfg, err := TLSConfig("sbx.test", "", "", dir)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(New(&sandboxes{}, "sbx.test", nil))
	srv.TLS = cfg
	srv.StartTLS()
	defer srv.Close()

	caPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("the CA file holds no certificate")
	}
	addr := srv.Listener.Addr().String()
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool},
		ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr) // *.sbx.test is loopback here
		},
	}}
	resp, err := client.Get("https://49983-gone.sbx.test/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != http.StatusBadGateway || body["sandboxId"] != "gone" || resp.ProtoMajor != 2 {
		t.Errorf("status %d proto %s body %v: want E2B's 502 for the sandbox the host names, over HTTP/2", resp.StatusCode, resp.Proto, body)
	}
	if _, err := client.Get("https://other.test/"); err == nil {
		t.Error("a name outside *.sbx.test verified")
	}

	// A second start keeps the CA (clients trust it) and the certificate.
	cfg2, err := TLSConfig("sbx.test", "", "", dir)
	if err != nil {
		t.Fatal(err)
	}
	if string(cfg2.Certificates[0].Certificate[0]) != string(cfg.Certificates[0].Certificate[0]) {
		t.Error("a restart made a new certificate although the old one is valid")
	}
	again, _ := os.ReadFile(filepath.Join(dir, CAFile))
	if string(again) != string(caPEM) {
		t.Error("a restart made a new CA")
	}
	// Another domain: same CA, a new certificate for it.
	cfg3, err := TLSConfig("other.test", "", "", dir)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(cfg3.Certificates[0].Certificate[0])
	if leaf.VerifyHostname("8080-x.other.test") != nil {
		t.Errorf("certificate for %v, want *.other.test", leaf.DNSNames)
	}
	if fi, err := os.Stat(filepath.Join(dir, caKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("CA key mode %v (%v), want 0600", fi.Mode(), err)
	}
	// A configured pair is used as given; half a pair is an error.
	if _, err := TLSConfig("sbx.test", filepath.Join(dir, leafFile), "", dir); err == nil {
		t.Error("a certificate without its key was accepted")
	}
	if c, err := TLSConfig("sbx.test", filepath.Join(dir, leafFile), filepath.Join(dir, leafKeyFile), t.TempDir()); err != nil || len(c.Certificates) != 1 {
		t.Errorf("configured pair: %v", err)
	}
}
