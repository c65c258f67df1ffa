package deploy

import (
	"path/filepath"
	"reflect"
	"regexp"
	"testing"

	"github.com/agentenv/agentenv/config"
)

// pendingEnv are settings the deployments already pass to aenvd that its
// configuration does not have yet, with the work that adds them.
var pendingEnv = map[string]string{}

// envTags collects aenvd's environment variables from config's `env` tags.
func envTags(t reflect.Type, into map[string]bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if tag := f.Tag.Get("env"); tag != "" {
			into[tag] = true
		}
		if f.Type.Kind() == reflect.Struct {
			envTags(f.Type, into)
		}
	}
}

// TestAenvdEnvironment checks every AENVD_* variable the Dockerfile, the
// compose file and the Kubernetes manifests set is one aenvd reads: a
// misspelt one would be ignored silently and the node would run on its
// loopback defaults.
func TestAenvdEnvironment(t *testing.T) {
	known := map[string]bool{}
	envTags(reflect.TypeOf(config.Config{}), known)
	if len(known) < 10 {
		t.Fatalf("found only %d env tags in config.Config", len(known))
	}
	re := regexp.MustCompile(`\bAENVD_[A-Z0-9_]+`)
	repo := repoRoot(t)
	files := []string{"deploy/docker/node.Dockerfile", "deploy/compose.yaml", "deploy/k8s/node.yaml"}
	seen := 0
	for _, f := range files {
		for _, v := range re.FindAllString(string(mustRead(t, filepath.Join(repo, f))), -1) {
			seen++
			switch {
			case known[v]:
			case pendingEnv[v] != "":
				t.Logf("%s: %s is not read by aenvd yet (%s)", f, v, pendingEnv[v])
			default:
				t.Errorf("%s: %s is not an aenvd setting (aenvd --print-default-config lists them)", f, v)
			}
		}
	}
	if seen == 0 {
		t.Error("no AENVD_ variable found; the deployments must move aenvd off its loopback defaults")
	}
	for v := range pendingEnv {
		if known[v] {
			t.Errorf("%s is an aenvd setting now: drop it from pendingEnv", v)
		}
	}
}
