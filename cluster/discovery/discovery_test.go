package discovery

import (
	"context"
	"slices"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// updates collects what a Source reports.
type updates chan []string

func (u updates) next(t *testing.T, want []string) {
	t.Helper()
	select {
	case got := <-u:
		if !slices.Equal(got, want) {
			t.Fatalf("endpoints %v, want %v", got, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no update; want %v", want)
	}
}

// runSource starts s and returns its updates; the source stops, and Run
// must return, when the test ends.
func runSource(t *testing.T, s Source) updates {
	t.Helper()
	u := make(updates, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, func(l []string) { u <- l }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
	return u
}

func TestStatic(t *testing.T) {
	u := runSource(t, Static{"10.0.0.2:7070", "10.0.0.1:7070", "10.0.0.2:7070"})
	u.next(t, []string{"10.0.0.1:7070", "10.0.0.2:7070"})
}

func ptr[T any](v T) *T { return &v }

func slice(name string, port int32, ready map[string]bool) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "aenv-scheduler"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("metrics"), Port: ptr(int32(9090))}, {Name: ptr("grpc"), Port: ptr(port)}},
	}
	for _, a := range slices.Sorted(func(yield func(string) bool) {
		for a := range ready {
			if !yield(a) {
				return
			}
		}
	}) {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready[a])}})
	}
	return s
}

// testKubernetes is one check of the Kubernetes source against any API
// server client: the fake clientset or a real kube-apiserver.
func testKubernetes(t *testing.T, c kubernetes.Interface) {
	ctx := context.Background()
	es := c.DiscoveryV1().EndpointSlices("default")
	if _, err := es.Create(ctx, slice("sched-a", 7070, map[string]bool{"10.1.0.1": true, "10.1.0.2": false}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other := slice("other", 80, map[string]bool{"10.9.9.9": true})
	other.Labels[discoveryv1.LabelServiceName] = "another-service"
	if _, err := es.Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	u := runSource(t, &Kubernetes{Client: c, Namespace: "default", Service: "aenv-scheduler", Port: "grpc"})
	u.next(t, []string{"10.1.0.1:7070"}) // the not-ready one and the other service left out
	if _, err := es.Update(ctx, slice("sched-a", 7070, map[string]bool{"10.1.0.1": true, "10.1.0.2": true}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	u.next(t, []string{"10.1.0.1:7070", "10.1.0.2:7070"})
	if _, err := es.Create(ctx, slice("sched-b", 7071, map[string]bool{"10.1.0.3": true}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	u.next(t, []string{"10.1.0.1:7070", "10.1.0.2:7070", "10.1.0.3:7071"})
	if err := es.Delete(ctx, "sched-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	u.next(t, []string{"10.1.0.3:7071"})
}
