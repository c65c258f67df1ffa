package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// RESTConfig is the API server configuration from a kubeconfig file, or
// with path "" the in-cluster service account's.
func RESTConfig(path string) (*rest.Config, error) {
	if path != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster kubernetes config: %w", err)
	}
	return cfg, nil
}

// ParseService splits "namespace/name".
func ParseService(s string) (namespace, name string, err error) {
	ns, n, ok := strings.Cut(s, "/")
	if !ok || ns == "" || n == "" {
		return "", "", fmt.Errorf("service %q: want namespace/name", s)
	}
	return ns, n, nil
}

// Kubernetes watches the EndpointSlices of one Service (a headless Service
// in front of the scheduler replicas).
type Kubernetes struct {
	Client    kubernetes.Interface
	Namespace string
	Service   string
	// Port is the port's name in the slices; "" takes the first port.
	Port string
	// Resync is the informer's resync period (0: none).
	Resync time.Duration
	Logger *slog.Logger
}

// Run implements Source.
func (k *Kubernetes) Run(ctx context.Context, update func([]string)) error {
	if k.Client == nil || k.Namespace == "" || k.Service == "" {
		return fmt.Errorf("discovery: kubernetes needs a client, a namespace and a service")
	}
	log := k.Logger
	if log == nil {
		log = slog.Default()
	}
	sel := labels.Set{discoveryv1.LabelServiceName: k.Service}.AsSelector().String()
	f := informers.NewSharedInformerFactoryWithOptions(k.Client, k.Resync, informers.WithNamespace(k.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
	inf := f.Discovery().V1().EndpointSlices()
	lister := inf.Lister().EndpointSlices(k.Namespace)
	var mu sync.Mutex
	var last []string
	push := func() {
		slices, err := lister.List(labels.Everything())
		if err != nil {
			log.Warn("list endpoint slices", "service", k.Service, "err", err)
			return
		}
		list := k.endpoints(slices)
		mu.Lock()
		defer mu.Unlock()
		if last != nil && equal(last, list) {
			return
		}
		last = list
		update(list)
	}
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { push() },
		UpdateFunc: func(any, any) { push() },
		DeleteFunc: func(any) { push() },
	}
	if _, err := inf.Informer().AddEventHandler(h); err != nil {
		return fmt.Errorf("discovery: watch service %s/%s: %w", k.Namespace, k.Service, err)
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return nil // ctx ended first
	}
	push() // the first list, even when empty
	<-ctx.Done()
	return nil
}

// endpoints are the ready addresses of the slices with the chosen port.
func (k *Kubernetes) endpoints(list []*discoveryv1.EndpointSlice) []string {
	out := []string{}
	for _, s := range list {
		port, ok := k.port(s)
		if !ok {
			continue
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			for _, a := range e.Addresses {
				out = append(out, net.JoinHostPort(a, strconv.Itoa(int(port))))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func (k *Kubernetes) port(s *discoveryv1.EndpointSlice) (int32, bool) {
	for _, p := range s.Ports {
		if p.Port == nil {
			continue
		}
		if k.Port == "" || (p.Name != nil && *p.Name == k.Port) {
			return *p.Port, true
		}
	}
	return 0, false
}

func equal(a, b []string) bool { return slices.Equal(a, b) }
