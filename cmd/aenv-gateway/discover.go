package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/agentenv/agentenv/cluster/discovery"
	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"github.com/agentenv/agentenv/internal/daemon"
	"k8s.io/client-go/kubernetes"
)

// dialSchedulers connects to the static --schedulers, or to the endpoints
// of --schedulers-service as they change; stop ends the watch.
func dialSchedulers(ctx context.Context, f flags, log *slog.Logger) (*pb.Conn, func(), error) {
	if f.k8sService == "" {
		conn, err := pb.Dial(daemon.SplitList(f.schedulers))
		return conn, func() {}, err
	}
	ns, name, err := discovery.ParseService(f.k8sService)
	if err != nil {
		return nil, nil, fmt.Errorf("--schedulers-service: %w", err)
	}
	cfg, err := discovery.RESTConfig(f.kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client: %w", err)
	}
	src := &discovery.Kubernetes{Client: client, Namespace: ns, Service: name, Port: f.k8sPort, Logger: log}
	first := make(chan []string, 1)
	var conn *pb.Conn
	var mu sync.Mutex
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := src.Run(wctx, func(addrs []string) {
			log.Info("scheduler endpoints", "service", f.k8sService, "endpoints", addrs)
			mu.Lock()
			defer mu.Unlock()
			if conn != nil {
				conn.SetAddrs(addrs)
			} else if len(addrs) > 0 {
				select {
				case first <- addrs:
				default:
				}
			}
		})
		if err != nil {
			log.Error("scheduler discovery", "err", err)
		}
	}()
	stop := func() { cancel(); wg.Wait() }
	select {
	case addrs := <-first:
		mu.Lock()
		conn, err = pb.Dial(addrs)
		if err == nil {
			select { // a change reported while dialing
			case addrs := <-first:
				conn.SetAddrs(addrs)
			default:
			}
		}
		mu.Unlock()
		if err != nil {
			stop()
			return nil, nil, err
		}
		return conn, stop, nil
	case <-ctx.Done():
		stop()
		return nil, nil, fmt.Errorf("no ready endpoint of %s before shutdown: %w", f.k8sService, ctx.Err())
	}
}
