package discovery

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The versions internal/k8stools/build.sh builds and caches.
const (
	apiserverVersion = "v1.37.2"
	etcdVersion      = "v3.7.3"
)

// k8sBinaries finds kube-apiserver and etcd in build.sh's cache.
func k8sBinaries(t *testing.T) (apiserver, etcd string) {
	cache := os.Getenv("AENV_K8S_CACHE")
	if cache == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			t.Skipf("no cache directory: %v", err)
		}
		cache = filepath.Join(dir, "agentenv", "k8s")
	}
	apiserver = filepath.Join(cache, "kube-apiserver-"+apiserverVersion)
	etcd = filepath.Join(cache, "etcd-"+etcdVersion)
	for _, p := range []string{apiserver, etcd} {
		if _, err := os.Stat(p); err != nil && os.Getenv("AENV_K8S_REQUIRED") != "" {
			t.Fatalf("%s is not built, and AENV_K8S_REQUIRED is set (make test-k8s builds it first): %v", p, err)
		} else if err != nil {
			t.Skipf("%s is not built (cluster/discovery/internal/k8stools/build.sh builds kube-apiserver %s and etcd %s from the Go module proxy, about 20 minutes once on a busy 2-core machine; make test-k8s builds and runs it)",
				p, apiserverVersion, etcdVersion)
		}
	}
	return apiserver, etcd
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func startProcess(t *testing.T, name, dir string, bin string, args ...string) {
	log, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("%s log tail:\n%s", name, b)
		}
	})
}

func waitOK(t *testing.T, c *http.Client, url string) {
	deadline := time.Now().Add(90 * time.Second)
	last := ""
	for {
		resp, err := c.Get(url)
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready: %s", url, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

const testToken = "aenv-discovery-test-token"

// bearer adds the test token to readiness probes.
type bearer struct{ rt http.RoundTripper }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+testToken)
	return b.rt.RoundTrip(r)
}

// startAPIServer runs etcd and kube-apiserver on loopback ports in a
// temporary directory (one static token, every request allowed).
func startAPIServer(t *testing.T) *rest.Config {
	apiserver, etcd := k8sBinaries(t)
	dir := t.TempDir()
	client, peer := freePort(t), freePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", client)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	startProcess(t, "etcd", dir, etcd, "--name", "default", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL, "--initial-cluster", "default="+peerURL)
	waitOK(t, http.DefaultClient, etcdURL+"/health")

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	saKey := filepath.Join(dir, "sa.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(saKey, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	// A static token for the test's client: anonymous requests are refused.
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(testToken+",admin,admin-uid,system:masters\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	startProcess(t, "kube-apiserver", dir, apiserver, "--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", fmt.Sprint(port),
		"--cert-dir", filepath.Join(dir, "certs"), "--service-cluster-ip-range", "10.96.0.0/16",
		"--service-account-issuer", "https://kubernetes.default.svc", "--service-account-key-file", saKey,
		"--service-account-signing-key-file", saKey, "--authorization-mode", "AlwaysAllow", "--token-auth-file", tokens,
		"--endpoint-reconciler-type", "none") // no kubernetes Service endpoints for a loopback address
	host := fmt.Sprintf("https://127.0.0.1:%d", port)
	insecure := &http.Client{Timeout: 5 * time.Second, Transport: bearer{&http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}}
	waitOK(t, insecure, host+"/readyz")
	return &rest.Config{Host: host, BearerToken: testToken, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
}

// TestKubernetesAPIServer runs the EndpointSlice check against a real
// kube-apiserver over a real etcd.
func TestKubernetesAPIServer(t *testing.T) {
	cfg := startAPIServer(t)
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	testKubernetes(t, c)
}
