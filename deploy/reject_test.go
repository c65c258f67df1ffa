package deploy

import (
	"path/filepath"
	"strings"
	"testing"
)

// The policy checks must catch what they are for: each case breaks one
// rule in a copy of the real file and expects an error naming it.

type mutation struct {
	name, file string // file relative to the repository root
	old, new   string // the first old in the file becomes new
	want       string // a substring of some reported error
}

func mutate(t *testing.T, m mutation) []byte {
	t.Helper()
	text := string(mustRead(t, filepath.Join(repoRoot(t), m.file)))
	if !strings.Contains(text, m.old) {
		t.Fatalf("%s: %q not in %s (update the case)", m.name, m.old, m.file)
	}
	return []byte(strings.Replace(text, m.old, m.new, 1))
}

func expectRejected(t *testing.T, m mutation, c *collector) {
	t.Helper()
	for _, e := range c.errs {
		if strings.Contains(e, m.want) {
			return
		}
	}
	t.Errorf("%s: no error containing %q; got %q", m.name, m.want, c.errs)
}

func TestComposePolicyRejects(t *testing.T) {
	const f = "deploy/compose.yaml"
	for _, m := range []mutation{
		{"privileged", f, "  gateway:\n", "  gateway:\n    privileged: true\n", "gateway: privileged"},
		{"host network", f, "    hostname: node-a\n", "    hostname: node-a\n    network_mode: host\n", "network_mode: host"},
		{"unpinned image", f, "redis:7.4-alpine@sha256:ff02b58f971e7d7d156a1267e283fcbbeee91773b6aa36c49dac28ecfe28eadf", "redis:7.4-alpine", "not pinned by digest"},
		{"implicit port", f, `"127.0.0.1:3000:3000"`, `"3000:3000"`, "HOST_IP:HOST_PORT:CONTAINER_PORT"},
		{"extra capability", f, "cap_add: [NET_ADMIN,", "cap_add: [SYS_MODULE, NET_ADMIN,", "adds SYS_MODULE"},
		{"host bind mount", f, `["node-a-state:/var/lib/aenv"`, `["/var/lib/aenv:/var/lib/aenv"`, "bind-mounts the host's /var/lib/aenv"},
		{"extra device", f, "    - /dev/net/tun:/dev/net/tun\n", "    - /dev/net/tun:/dev/net/tun\n    - /dev/mem:/dev/mem\n", "device /dev/mem"},
		{"unconditional KVM", f, "    - /dev/net/tun:/dev/net/tun\n", "    - /dev/net/tun:/dev/net/tun\n    - /dev/kvm:/dev/kvm\n", "maps /dev/kvm unconditionally"},
		{"writable root", f, "  read_only: true\n", "  read_only: false\n", "root filesystem is writable"},
		{"unknown key", f, "  gateway:\n", "  gateway:\n    cgroup: host\n", "field cgroup not found"},
	} {
		t.Run(m.name, func(t *testing.T) {
			data := mutate(t, m)
			c := &collector{}
			cf, err := decodeComposeErr(data, true)
			if err != nil {
				c.Errorf("%v", err)
			} else {
				checkCompose(c, cf, false)
			}
			expectRejected(t, m, c)
		})
	}
}

func TestWorkflowPolicyRejects(t *testing.T) {
	const f = ".github/workflows/ci.yml"
	for _, m := range []mutation{
		{"tag instead of SHA", f, "actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683", "actions/checkout@v4", "not pinned to a 40-hex commit SHA"},
		{"persisted credentials", f, "persist-credentials: false", "persist-credentials: true", "persist-credentials: false"},
		{"write token", f, "permissions:\n  contents: read\n", "permissions:\n  contents: write\n", "top-level permissions"},
		{"no timeout", f, "    timeout-minutes: 20\n", "", "timeout-minutes 0"},
		{"unpinned tool", f, "govulncheck@v1.9.0", "govulncheck@latest", "not pinned to a version"},
		{"no scanner", f, "osv-scanner@v2.6.0 scan source --recursive .", "true", "no workflow job runs osv-scanner"},
		{"unpinned container", f, "debian:bookworm-slim@sha256:4b50eb66f977b4062683ff434ef18ac191da862dbe966961bc11990cf5791a8d", "debian:bookworm-slim", "not pinned by digest"},
		{"pull_request_target", f, "  pull_request:\n", "  pull_request_target:\n", "pull_request_target"},
	} {
		t.Run(m.name, func(t *testing.T) {
			c := &collector{}
			w, err := decodeWorkflow(mutate(t, m))
			if err != nil {
				c.Errorf("%v", err)
			} else {
				checkWorkflows(c, map[string]workflow{"ci.yml": w})
			}
			expectRejected(t, m, c)
		})
	}
}

func TestKubernetesPolicyRejects(t *testing.T) {
	for _, m := range []mutation{
		{"privileged node", "deploy/k8s/node.yaml", "privileged: false", "privileged: true", "aenvd: privileged"},
		{"host network", "deploy/k8s/node.yaml", "      automountServiceAccountToken: false\n", "      automountServiceAccountToken: false\n      hostNetwork: true\n", "uses a host namespace"},
		{"extra capability", "deploy/k8s/node.yaml", `add: ["NET_ADMIN",`, `add: ["SYS_MODULE", "NET_ADMIN",`, "adds SYS_MODULE"},
		{"wrong probe", "deploy/k8s/node.yaml", "          readinessProbe:\n            httpGet:\n              path: /health", "          readinessProbe:\n            httpGet:\n              path: /healthz", "want GET /health"},
		{"unpinned image", "deploy/k8s/redis.yaml", "@sha256:ff02b58f971e7d7d156a1267e283fcbbeee91773b6aa36c49dac28ecfe28eadf", "", "neither pinned by digest"},
		{"root in restricted", "deploy/k8s/scheduler.yaml", "runAsNonRoot: true", "runAsNonRoot: false", "runAsNonRoot is not true"},
		{"wildcard verb", "deploy/k8s/rbac.yaml", `verbs: ["get", "list", "watch"]`, `verbs: ["*"]`, "verb * on discovery.k8s.io/endpointslices"},
		{"secrets", "deploy/k8s/rbac.yaml", `resources: ["endpointslices"]`, `resources: ["endpointslices", "secrets"]`, "grants discovery.k8s.io/secrets"},
		{"cluster role", "deploy/k8s/rbac.yaml", "kind: Role\nmetadata:\n  name: aenv-node-discovery", "kind: ClusterRole\nmetadata:\n  name: aenv-node-discovery", "cluster-wide RBAC"},
		{"no default deny", "deploy/k8s/networkpolicy.yaml", "  name: default-deny-ingress\n  namespace: aenv-node\nspec:\n  podSelector: {}", "  name: default-deny-ingress\n  namespace: aenv-node\nspec:\n  podSelector: {matchLabels: {x: y}}", "namespace aenv-node has no default-deny"},
		{"closed port", "deploy/k8s/networkpolicy.yaml", "        - port: 3001\n          protocol: TCP\n", "", "port 3001 is closed"},
		{"baseline control plane", "deploy/k8s/namespaces.yaml", "pod-security.kubernetes.io/enforce: restricted", "pod-security.kubernetes.io/enforce: baseline", "does not enforce restricted"},
		{"token mounted", "deploy/k8s/gateway.yaml", "automountServiceAccountToken: false", "automountServiceAccountToken: true", "mounts an API token"},
	} {
		t.Run(m.name, func(t *testing.T) {
			k, _ := loadManifests(t)
			var objs []object
			for _, r := range k.Resources {
				file := "deploy/k8s/" + r
				data := mustRead(t, filepath.Join(repoRoot(t), file))
				if file == m.file {
					data = mutate(t, m)
				}
				objs = append(objs, decodeDocs(t, r, data)...)
			}
			c := &collector{}
			checkManifests(c, k, objs)
			expectRejected(t, m, c)
		})
	}
}
