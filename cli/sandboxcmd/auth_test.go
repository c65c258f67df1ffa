package sandboxcmd

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentenv/agentenv/cli/clientcfg"
	"github.com/spf13/cobra"
)

// authNode is a node that accepts only key on GET /nodes; it counts the
// requests that presented it.
func authNode(t *testing.T, key string) (string, *atomic.Int64) {
	var ok atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/nodes" || r.Header.Get("X-API-Key") != key {
			http.Error(w, `{"code":401,"message":"bad key"}`, http.StatusUnauthorized)
			return
		}
		ok.Add(1)
		w.Write([]byte(`[]`))
	}))
	t.Cleanup(srv.Close)
	t.Setenv("HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", "")
	t.Setenv("AENV_URL", "")
	t.Setenv("AENV_API_KEY", "")
	return srv.URL, &ok
}

func runAuth(stdin string, args ...string) (stdout, stderr string, err error) {
	root := &cobra.Command{Use: "aenv", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(authCmd())
	var out, errb bytes.Buffer
	root.SetIn(strings.NewReader(stdin))
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetArgs(append([]string{"auth"}, args...))
	err = root.Execute()
	return out.String(), errb.String(), err
}

// TestAuthReadsKeyFromStdin: the key piped on stdin is checked against the
// node and stored (mode 0600); it is never needed on the command line.
func TestAuthReadsKeyFromStdin(t *testing.T) {
	url, ok := authNode(t, "e2b_secret")
	if _, _, err := runAuth("e2b_secret\n", "--url", url); err != nil {
		t.Fatal(err)
	}
	if ok.Load() != 1 {
		t.Errorf("the node saw the key %d times, want 1 (verification)", ok.Load())
	}
	c, err := clientcfg.Load()
	if err != nil || c.APIKey != "e2b_secret" || c.URL != url {
		t.Fatalf("stored config %+v, %v", c, err)
	}
	p, _ := clientcfg.Path()
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("config file %s: %v, want mode 0600", p, err)
	}
	if _, _, err := runAuth("e2b_wrong\n", "--url", url); err == nil {
		t.Error("a wrong key on stdin was stored")
	}
	_, _, err = runAuth("", "--url", url)
	if err == nil || !strings.Contains(err.Error(), "stdin") || strings.Contains(err.Error(), "--api-key KEY") {
		t.Errorf("no key: %v, want a hint to pipe it on stdin (not to put it in argv)", err)
	}
}

// TestAuthAPIKeyFlagDiscouraged: --api-key still works, but says (in its
// help and on stderr) that a key in argv is visible to every local user.
func TestAuthAPIKeyFlagDiscouraged(t *testing.T) {
	url, _ := authNode(t, "e2b_secret")
	_, stderr, err := runAuth("", "--url", url, "--api-key", "e2b_secret")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, "visible") {
		t.Errorf("--api-key gave no warning on stderr: %q", stderr)
	}
	if c, _ := clientcfg.Load(); c.APIKey != "e2b_secret" {
		t.Errorf("stored key %q", c.APIKey)
	}
	f := authCmd().Flags().Lookup("api-key")
	if f == nil || !strings.Contains(f.Usage, "discouraged") || !strings.Contains(f.Usage, "ps") {
		t.Errorf("--api-key usage %q does not say it is discouraged (visible in ps)", f.Usage)
	}
}

// TestDocsKeepKeyOutOfArgv: the README and the CLI's own hints show the key
// piped on stdin, never as an argument.
func TestDocsKeepKeyOutOfArgv(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "aenv auth") && strings.Contains(l, "--api-key") {
			t.Errorf("README.md:%d puts the API key in argv: %s", i+1, strings.TrimSpace(l))
		}
	}
	t.Setenv("HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", "")
	t.Setenv("AENV_API_KEY", "")
	if _, err := newClient(); err == nil || strings.Contains(err.Error(), "--api-key") {
		t.Errorf("no key configured: %v, want a hint without --api-key", err)
	}
}
