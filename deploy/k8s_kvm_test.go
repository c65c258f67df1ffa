package deploy

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/yaml"
)

// kvmResource is the KVM device plugin's resource.
const kvmResource = "devices.kubevirt.io/kvm"

// overlay is the part of kustomize's format the KVM overlay uses.
type overlay struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Patches    []struct {
		Path string `json:"path"`
	} `json:"patches"`
}

// nodeDaemonSet finds the node DaemonSet among the base's objects.
func nodeDaemonSet(t *testing.T, objs []object) *appsv1.DaemonSet {
	t.Helper()
	for _, o := range objs {
		if ds, ok := o.obj.(*appsv1.DaemonSet); ok && o.meta.Name == "aenv-node" {
			return ds
		}
	}
	t.Fatal("no DaemonSet aenv-node in deploy/k8s")
	return nil
}

// TestKubernetesWithoutKVM: the base runs on any labelled machine, with no
// KVM device plugin; the overlay for KVM hosts adds exactly the KVM node
// selector and device request (applied here as kustomize would, as a
// strategic merge patch), and the result still passes every manifest rule.
func TestKubernetesWithoutKVM(t *testing.T) {
	k, objs := loadManifests(t)
	base := nodeDaemonSet(t, objs)
	for _, c := range base.Spec.Template.Spec.Containers {
		for name := range c.Resources.Limits {
			if strings.Contains(string(name), "kvm") {
				t.Errorf("base DaemonSet container %s requests %s: TCG hosts could not run it (the kvm overlay requests it)", c.Name, name)
			}
		}
	}
	if sel := base.Spec.Template.Spec.NodeSelector; sel["aenv.dev/kvm"] != "" || sel["aenv.dev/node"] != "true" {
		t.Errorf("base node selector %v, want aenv.dev/node=true only", sel)
	}

	dir := filepath.Join(repoRoot(t), "deploy/k8s-kvm")
	var ov overlay
	if err := yaml.UnmarshalStrict(mustRead(t, filepath.Join(dir, "kustomization.yaml")), &ov); err != nil {
		t.Fatalf("k8s-kvm/kustomization.yaml: %v", err)
	}
	if ov.Kind != "Kustomization" || len(ov.Resources) != 1 || ov.Resources[0] != "../k8s" || len(ov.Patches) != 1 {
		t.Fatalf("k8s-kvm/kustomization.yaml: %+v, want the base as its one resource and one patch", ov)
	}
	patchYAML := mustRead(t, filepath.Join(dir, ov.Patches[0].Path))
	patch, err := yaml.YAMLToJSON(patchYAML)
	if err != nil {
		t.Fatalf("kvm patch: %v", err)
	}
	orig, err := json.Marshal(base)
	if err != nil {
		t.Fatal(err)
	}
	merged, err := strategicpatch.StrategicMergePatch(orig, patch, appsv1.DaemonSet{})
	if err != nil {
		t.Fatalf("apply the kvm patch: %v", err)
	}
	var kvm appsv1.DaemonSet
	if err := json.Unmarshal(merged, &kvm); err != nil {
		t.Fatal(err)
	}
	spec := kvm.Spec.Template.Spec
	if spec.NodeSelector["aenv.dev/kvm"] != "true" || spec.NodeSelector["aenv.dev/node"] != "true" {
		t.Errorf("kvm node selector %v, want aenv.dev/node and aenv.dev/kvm", spec.NodeSelector)
	}
	if len(spec.Containers) != len(base.Spec.Template.Spec.Containers) {
		t.Fatalf("the kvm patch changed the containers: %d, base %d", len(spec.Containers), len(base.Spec.Template.Spec.Containers))
	}
	if q, ok := spec.Containers[0].Resources.Limits[kvmResource]; !ok || q.String() != "1" {
		t.Errorf("kvm container limits %v, want %s: 1", spec.Containers[0].Resources.Limits, kvmResource)
	}
	if spec.Containers[0].SecurityContext == nil || spec.Containers[0].Image != base.Spec.Template.Spec.Containers[0].Image {
		t.Error("the kvm patch lost the container's security context or image")
	}
	for i := range objs {
		if objs[i].obj == base {
			objs[i].obj = &kvm
		}
	}
	checkManifests(t, k, objs)

	t.Run("kustomize build", func(t *testing.T) {
		kubectl, err := exec.LookPath("kubectl")
		if err != nil {
			t.Skip("kubectl not installed: the overlay was applied by the strategic merge patch above only")
		}
		out := run(t, "", nil, kubectl, "kustomize", dir)
		built := decodeDocs(t, "kustomize output (kvm)", []byte(out))
		if len(built) != len(objs) {
			t.Errorf("kustomize built %d objects from the overlay, the base holds %d", len(built), len(objs))
		}
		ds := nodeDaemonSet(t, built)
		got := ds.Spec.Template.Spec
		if got.NodeSelector["aenv.dev/kvm"] != "true" || got.Containers[0].Resources.Limits.Name(kvmResource, "").String() != "1" {
			t.Errorf("kustomize's overlay: node selector %v, limits %v", got.NodeSelector, got.Containers[0].Resources.Limits)
		}
	})
}
