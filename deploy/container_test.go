package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestNodeContainer runs the node image as Compose and the Kubernetes
// DaemonSet run it, on this host without KVM and without a container
// engine (deploy/nspawn/container.sh): the image's packages, files,
// environment and entrypoint, exactly the capabilities of compose.yaml's
// node service, no_new_privs, /dev/net/tun, a private network namespace and
// read-only control groups as an engine mounts them. The node must answer,
// run a sandbox (QEMU under TCG) with its VMM in a group under the
// container's, and keep it across a `docker stop` and a new container over
// the same state volume. It boots a VM: run it under the shared VM lock.
// Before the entrypoint made the container's groups writable, aenvd
// refused to start: "sandbox.cgroups = true: ... mounted read-only".
func TestNodeContainer(t *testing.T) {
	repo, bin := nspawnPrereqs(t, "runs the node image's contents under systemd-nspawn and boots a VM")
	caps := nodeCapabilities(t, repo)
	env := dockerfileEnv(t, filepath.Join(repo, "deploy/docker/node.Dockerfile"))
	cmd := exec.Command(filepath.Join(repo, "deploy/nspawn/container.sh"), bin)
	cmd.Env = append(os.Environ(), "CAPS="+strings.Join(caps, ","), "NODE_ENV="+strings.Join(env, "\n"))
	out, err := cmd.CombinedOutput()
	t.Logf("container.sh (capabilities %v):\n%s", caps, out)
	if err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), "PASS") {
		t.Fatalf("the node image did not run as a container: %v", err)
	}
}

// nodeCapabilities are the capabilities compose.yaml gives a node (after
// dropping all), lower case without the CAP_ prefix, as setpriv takes them;
// the DaemonSet must add the same.
func nodeCapabilities(t *testing.T, repo string) []string {
	t.Helper()
	cf := decodeCompose(t, "deploy/compose.yaml", mustRead(t, filepath.Join(repo, "deploy/compose.yaml")), false)
	node, ok := cf.Services["node-a"]
	if !ok || len(node.CapDrop) != 1 || node.CapDrop[0] != "ALL" || len(node.CapAdd) == 0 {
		t.Fatalf("compose.yaml: node-a drops %v and adds %v, want ALL dropped and some added", node.CapDrop, node.CapAdd)
	}
	k8s := string(mustRead(t, filepath.Join(repo, "deploy/k8s/node.yaml")))
	var caps []string
	for _, c := range node.CapAdd {
		if !strings.Contains(k8s, `"`+c+`"`) {
			t.Errorf("deploy/k8s/node.yaml does not add %s, which compose.yaml's node has", c)
		}
		caps = append(caps, strings.ToLower(strings.TrimPrefix(c, "CAP_")))
	}
	return caps
}

// dockerfileEnv is the KEY=VALUE list of a Dockerfile's ENV instructions
// (the unquoted KEY=VALUE form this project's Dockerfiles use).
func dockerfileEnv(t *testing.T, path string) []string {
	t.Helper()
	joined := strings.ReplaceAll(string(mustRead(t, path)), "\\\n", " ")
	var env []string
	for _, line := range strings.Split(joined, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "ENV ")
		if !ok {
			continue
		}
		for _, kv := range strings.Fields(rest) {
			if !regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=\S*$`).MatchString(kv) {
				t.Fatalf("%s: ENV %q is not in the KEY=VALUE form", path, kv)
			}
			env = append(env, kv)
		}
	}
	if len(env) == 0 {
		t.Fatalf("%s sets no environment", path)
	}
	return env
}
