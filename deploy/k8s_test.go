package deploy

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// The real API server of the cluster work is not available yet, so the
// manifests are checked here against the Kubernetes API's Go types (strictly:
// an unknown or misspelt field is an error) and against our policy.

type object struct {
	file string
	kind string
	obj  any
	meta metav1.ObjectMeta
}

func (o object) String() string {
	return fmt.Sprintf("%s %s/%s (%s)", o.kind, o.meta.Namespace, o.meta.Name, o.file)
}

// newTyped returns an empty typed object for apiVersion/kind.
func newTyped(apiVersion, kind string) (any, bool) {
	switch apiVersion + "/" + kind {
	case "v1/Namespace":
		return &corev1.Namespace{}, true
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}, true
	case "v1/Service":
		return &corev1.Service{}, true
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, true
	case "apps/v1/DaemonSet":
		return &appsv1.DaemonSet{}, true
	case "apps/v1/StatefulSet":
		return &appsv1.StatefulSet{}, true
	case "rbac.authorization.k8s.io/v1/Role":
		return &rbacv1.Role{}, true
	case "rbac.authorization.k8s.io/v1/RoleBinding":
		return &rbacv1.RoleBinding{}, true
	case "rbac.authorization.k8s.io/v1/ClusterRole":
		return &rbacv1.ClusterRole{}, true
	case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}, true
	case "networking.k8s.io/v1/NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, true
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, true
	}
	return nil, false
}

// decodeDocs strictly decodes every YAML document of data into its type.
func decodeDocs(t *testing.T, file string, data []byte) []object {
	t.Helper()
	var out []object
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("%s doc %d: %v", file, i, err)
		}
		typed, ok := newTyped(tm.APIVersion, tm.Kind)
		if !ok {
			t.Fatalf("%s doc %d: %s %s is not a kind this check knows", file, i, tm.APIVersion, tm.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), typed); err != nil {
			t.Fatalf("%s doc %d (%s): %v", file, i, tm.Kind, err)
		}
		mo, err := metaOf(typed)
		if err != nil {
			t.Fatal(err)
		}
		if mo.Name == "" {
			t.Errorf("%s doc %d: %s without a name", file, i, tm.Kind)
		}
		out = append(out, object{file: file, kind: tm.Kind, obj: typed, meta: mo})
	}
	return out
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func metaOf(o any) (metav1.ObjectMeta, error) {
	type metaer interface{ GetObjectMeta() metav1.Object }
	m, ok := o.(metaer)
	if !ok {
		return metav1.ObjectMeta{}, fmt.Errorf("%T has no object meta", o)
	}
	om := m.GetObjectMeta()
	return metav1.ObjectMeta{Name: om.GetName(), Namespace: om.GetNamespace(), Labels: om.GetLabels()}, nil
}

// kustomization is the part of kustomize's file format we use, decoded
// strictly so a misspelt key fails.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Labels     []struct {
		Pairs map[string]string `json:"pairs"`
	} `json:"labels"`
	Images []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images"`
}

func loadManifests(t *testing.T) (kustomization, []object) {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "deploy/k8s")
	var k kustomization
	if err := yaml.UnmarshalStrict(mustRead(t, filepath.Join(dir, "kustomization.yaml")), &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Fatalf("kustomization.yaml: %s %s", k.APIVersion, k.Kind)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	var listed []string
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			listed = append(listed, b)
		}
	}
	res := slices.Clone(k.Resources)
	sort.Strings(res)
	if !slices.Equal(res, listed) {
		t.Errorf("kustomization resources %v != the manifest files %v", res, listed)
	}
	var objs []object
	for _, r := range k.Resources {
		objs = append(objs, decodeDocs(t, r, mustRead(t, filepath.Join(dir, r)))...)
	}
	return k, objs
}

type workload struct {
	object
	replicas *int32
	pod      corev1.PodTemplateSpec
}

func workloads(objs []object) []workload {
	var out []workload
	for _, o := range objs {
		switch v := o.obj.(type) {
		case *appsv1.Deployment:
			out = append(out, workload{o, v.Spec.Replicas, v.Spec.Template})
		case *appsv1.DaemonSet:
			out = append(out, workload{o, nil, v.Spec.Template})
		case *appsv1.StatefulSet:
			out = append(out, workload{o, v.Spec.Replicas, v.Spec.Template})
		}
	}
	return out
}

var digestPinned = regexp.MustCompile(`^[a-z0-9./_-]+(:[\w.-]+)?@sha256:[0-9a-f]{64}$`)

func TestKubernetesManifests(t *testing.T) {
	k, objs := loadManifests(t)
	checkManifests(t, k, objs)
	t.Run("kustomize build", func(t *testing.T) {
		kubectl, err := exec.LookPath("kubectl")
		if err != nil {
			t.Skip("kubectl not installed: the kustomize build itself is not run (the files were checked one by one)")
		}
		out := run(t, "", nil, kubectl, "kustomize", filepath.Join(repoRoot(t), "deploy/k8s"))
		built := decodeDocs(t, "kustomize output", []byte(out))
		if len(built) != len(objs) {
			t.Errorf("kustomize built %d objects, the files hold %d", len(built), len(objs))
		}
		for _, o := range built {
			if o.meta.Labels["app.kubernetes.io/part-of"] != "aenv" {
				t.Errorf("%v: kustomize did not label it part-of aenv", o)
			}
		}
		if !bytes.Contains([]byte(out), []byte("image: aenv-node:local")) {
			t.Error("kustomize did not apply the images: section")
		}
	})
}

// checkManifests applies every rule to the decoded objects.
func checkManifests(t reporter, k kustomization, objs []object) {
	t.Helper()
	own := map[string]bool{} // our images: set per cluster with kustomize edit set image
	for _, im := range k.Images {
		own[im.Name] = true
	}
	namespaces := map[string]*corev1.Namespace{}
	for _, o := range objs {
		if ns, ok := o.obj.(*corev1.Namespace); ok {
			namespaces[ns.Name] = ns
		}
	}
	for _, o := range objs {
		if _, isNS := o.obj.(*corev1.Namespace); !isNS && namespaces[o.meta.Namespace] == nil {
			t.Errorf("%v: namespace %q is not one of the manifests' namespaces", o, o.meta.Namespace)
			return
		}
	}
	for name, ns := range namespaces {
		for _, l := range []string{"enforce", "enforce-version", "audit", "warn"} {
			if ns.Labels["pod-security.kubernetes.io/"+l] == "" {
				t.Errorf("namespace %s: no pod-security.kubernetes.io/%s label", name, l)
			}
		}
	}
	if ns := namespaces["aenv"]; ns == nil || ns.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Errorf("the control plane's namespace aenv does not enforce restricted")
	}
	checkWorkloads(t, objs, namespaces, own)
	checkRBAC(t, objs)
	checkNetworkPolicies(t, objs)
	checkServices(t, objs)
}

func checkWorkloads(t reporter, objs []object, namespaces map[string]*corev1.Namespace, own map[string]bool) {
	ws := workloads(objs)
	byName := map[string]workload{}
	for _, w := range ws {
		byName[w.meta.Name] = w
	}
	for name, min := range map[string]int32{"aenv-scheduler": 2, "aenv-gateway": 1} {
		w, ok := byName[name]
		if !ok || w.kind != "Deployment" {
			t.Errorf("no Deployment %s", name)
			continue
		}
		if w.replicas == nil || *w.replicas < min {
			t.Errorf("%s: replicas %v, want >= %d", name, w.replicas, min)
		}
	}
	if w, ok := byName["aenv-node"]; !ok || w.kind != "DaemonSet" {
		t.Errorf("no DaemonSet aenv-node")
	}
	for _, w := range ws {
		spec := w.pod.Spec
		if spec.HostNetwork || spec.HostPID || spec.HostIPC {
			t.Errorf("%v: uses a host namespace", w)
		}
		restricted := namespaces[w.meta.Namespace].Labels["pod-security.kubernetes.io/enforce"] == "restricted"
		if spec.ServiceAccountName == "" || spec.ServiceAccountName == "default" {
			t.Errorf("%v: runs as the default service account", w)
		}
		if spec.AutomountServiceAccountToken == nil || (*spec.AutomountServiceAccountToken && w.meta.Name != "aenv-scheduler") {
			t.Errorf("%v: mounts an API token it does not need", w)
		}
		for _, v := range spec.Volumes {
			if v.HostPath == nil {
				continue
			}
			if restricted || !strings.HasPrefix(v.HostPath.Path, "/var/lib/aenv") && !strings.HasPrefix(v.HostPath.Path, "/var/cache/aenv") {
				t.Errorf("%v: hostPath %s", w, v.HostPath.Path)
			}
		}
		for _, c := range append(spec.InitContainers, spec.Containers...) {
			checkContainer(t, w, c, restricted, own)
		}
	}
	node := byName["aenv-node"]
	if len(node.pod.Spec.Containers) == 0 {
		return
	}
	c := node.pod.Spec.Containers[0]
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/health" {
		t.Errorf("aenv-node: readiness probe %+v, want GET /health", p)
	}
	if node.pod.Spec.TerminationGracePeriodSeconds == nil || *node.pod.Spec.TerminationGracePeriodSeconds < 60 {
		t.Errorf("aenv-node: a graceful stop pauses sandboxes; give it a grace period of a minute or more")
	}
	if gw := byName["aenv-gateway"]; len(gw.pod.Spec.Containers) > 0 {
		if p := gw.pod.Spec.Containers[0].ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/health" {
			t.Errorf("aenv-gateway: readiness probe %+v, want GET /health", p)
		}
	}
}

// nodeCaps are the capabilities a node may add back; see deploy/k8s/node.yaml.
var nodeCaps = []corev1.Capability{"NET_ADMIN", "SYS_ADMIN", "NET_BIND_SERVICE", "SYS_PTRACE", "KILL", "CHOWN",
	"DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "SETFCAP", "MKNOD", "SYS_CHROOT"}

func checkContainer(t reporter, w workload, c corev1.Container, restricted bool, own map[string]bool) {
	name := w.meta.Name + "/" + c.Name
	if !digestPinned.MatchString(c.Image) && !own[c.Image] {
		t.Errorf("%s: image %q is neither pinned by digest nor one of ours set by kustomize", name, c.Image)
	}
	sc := c.SecurityContext
	if sc == nil {
		t.Errorf("%s: no security context", name)
		return
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Errorf("%s: privileged", name)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: allowPrivilegeEscalation is not false", name)
	}
	if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("%s: does not drop ALL capabilities", name)
	}
	if c.Resources.Requests == nil {
		t.Errorf("%s: no resource requests", name)
	}
	if !restricted {
		for _, cp := range sc.Capabilities.Add {
			if !slices.Contains(nodeCaps, cp) {
				t.Errorf("%s: adds %s", name, cp)
			}
		}
		return
	}
	// The restricted Pod Security Standard, checked here as the API server
	// would on admission.
	podSC := w.pod.Spec.SecurityContext
	nonRoot := sc.RunAsNonRoot
	if nonRoot == nil && podSC != nil {
		nonRoot = podSC.RunAsNonRoot
	}
	if nonRoot == nil || !*nonRoot {
		t.Errorf("%s: runAsNonRoot is not true", name)
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil && podSC != nil {
		seccomp = podSC.SeccompProfile
	}
	if seccomp == nil || (seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault && seccomp.Type != corev1.SeccompProfileTypeLocalhost) {
		t.Errorf("%s: no RuntimeDefault or Localhost seccomp profile", name)
	}
	if len(sc.Capabilities.Add) > 0 && !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"NET_BIND_SERVICE"}) {
		t.Errorf("%s: adds capabilities %v", name, sc.Capabilities.Add)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("%s: root filesystem is writable", name)
	}
}

var allowedRules = map[string][]string{ // "group/resource" -> verbs
	"discovery.k8s.io/endpointslices": {"get", "list", "watch"},
	"coordination.k8s.io/leases":      {"get", "create", "update"},
}

func checkRBAC(t reporter, objs []object) {
	var roles []*rbacv1.Role
	for _, o := range objs {
		switch v := o.obj.(type) {
		case *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding:
			t.Errorf("%v: cluster-wide RBAC; namespaced Roles are enough", o)
		case *rbacv1.Role:
			roles = append(roles, v)
		case *rbacv1.RoleBinding:
			if v.RoleRef.Kind != "Role" {
				t.Errorf("%v: binds a %s", o, v.RoleRef.Kind)
			}
			for _, s := range v.Subjects {
				if s.Kind != "ServiceAccount" || s.Name != "aenv-scheduler" {
					t.Errorf("%v: grants to %s %s; only the scheduler talks to the API server", o, s.Kind, s.Name)
				}
			}
		}
	}
	if len(roles) == 0 {
		t.Errorf("no Role for the scheduler's discovery and leases")
	}
	seen := map[string]bool{}
	for _, r := range roles {
		for _, rule := range r.Rules {
			for _, g := range rule.APIGroups {
				for _, res := range rule.Resources {
					key := g + "/" + res
					allowed, ok := allowedRules[key]
					if !ok {
						t.Errorf("role %s: grants %s", r.Name, key)
						continue
					}
					seen[key] = true
					for _, v := range rule.Verbs {
						if !slices.Contains(allowed, v) {
							t.Errorf("role %s: verb %s on %s", r.Name, v, key)
						}
					}
				}
			}
			if slices.Contains(rule.Verbs, "update") && len(rule.ResourceNames) == 0 {
				t.Errorf("role %s: update on any object, not the named lease", r.Name)
			}
		}
	}
	for key := range allowedRules {
		if !seen[key] {
			t.Errorf("no role grants %s, which the scheduler needs", key)
		}
	}
}

func checkNetworkPolicies(t reporter, objs []object) {
	var pols []*networkingv1.NetworkPolicy
	for _, o := range objs {
		if p, ok := o.obj.(*networkingv1.NetworkPolicy); ok {
			pols = append(pols, p)
		}
	}
	denyAll := map[string]bool{}
	for _, p := range pols {
		if len(p.Spec.PodSelector.MatchLabels) == 0 && len(p.Spec.PodSelector.MatchExpressions) == 0 &&
			slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) && len(p.Spec.Ingress) == 0 {
			denyAll[p.Namespace] = true
		}
	}
	for _, w := range workloads(objs) {
		if !denyAll[w.meta.Namespace] {
			t.Errorf("namespace %s has no default-deny ingress policy", w.meta.Namespace)
		}
		// Every workload's ports are opened by a policy naming it, and
		// only those ports.
		var opened []int32
		for _, p := range pols {
			sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
			if err != nil {
				t.Errorf("policy %s/%s: %v", p.Namespace, p.Name, err)
				continue
			}
			if p.Namespace != w.meta.Namespace || len(p.Spec.PodSelector.MatchLabels) == 0 || !sel.Matches(labels.Set(w.pod.Labels)) {
				continue
			}
			for _, r := range p.Spec.Ingress {
				if len(r.Ports) == 0 {
					t.Errorf("policy %s/%s opens every port of %s", p.Namespace, p.Name, w.meta.Name)
				}
				for _, pp := range r.Ports {
					opened = append(opened, pp.Port.IntVal)
				}
			}
		}
		for _, c := range w.pod.Spec.Containers {
			for _, cp := range c.Ports {
				if !slices.Contains(opened, cp.ContainerPort) {
					t.Errorf("%s: port %d is closed by the default deny and no policy opens it", w.meta.Name, cp.ContainerPort)
				}
			}
		}
		for _, port := range opened {
			found := false
			for _, c := range w.pod.Spec.Containers {
				for _, cp := range c.Ports {
					found = found || cp.ContainerPort == port
				}
			}
			if !found {
				t.Errorf("%s: a policy opens port %d, which no container serves", w.meta.Name, port)
			}
		}
	}
}

func checkServices(t reporter, objs []object) {
	var headless bool
	for _, o := range objs {
		s, ok := o.obj.(*corev1.Service)
		if !ok {
			continue
		}
		if s.Spec.Type != "" && s.Spec.Type != corev1.ServiceTypeClusterIP {
			t.Errorf("%v: type %s exposes it outside the cluster; leave that to the operator", o, s.Spec.Type)
		}
		if s.Name == "aenv-node" && s.Spec.ClusterIP == corev1.ClusterIPNone {
			headless = true
		}
		matched := false
		for _, w := range workloads(objs) {
			if w.meta.Namespace == s.Namespace && labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(w.pod.Labels)) {
				matched = true
			}
		}
		if !matched || len(s.Spec.Selector) == 0 {
			t.Errorf("%v: selects no workload", o)
		}
	}
	if !headless {
		t.Errorf("no headless Service aenv-node for node discovery")
	}
}
