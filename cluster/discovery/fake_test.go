package discovery

import (
	"testing"

	"k8s.io/client-go/kubernetes/fake"
)

// TestKubernetesFakeClientset runs the EndpointSlice check against
// client-go's fake clientset (a fake: an in-memory object tracker, no API
// server), which runs everywhere; TestKubernetesAPIServer runs the same
// check against a real kube-apiserver where one is built.
func TestKubernetesFakeClientset(t *testing.T) {
	testKubernetes(t, fake.NewClientset())
}
