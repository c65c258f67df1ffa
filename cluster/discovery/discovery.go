// Package discovery finds the cluster's endpoints (the scheduler replicas
// the gateway and the nodes talk to): a static list, or the ready endpoints
// of a Kubernetes headless Service read from its EndpointSlices through a
// client-go informer. A Source reports the whole current list each time it
// changes.
package discovery

import (
	"context"
	"slices"
)

// Source reports endpoints ("host:port") until ctx ends: update is called
// with the full, sorted list first and after every change. Run returns nil
// when ctx ends, or an error when it cannot start.
type Source interface {
	Run(ctx context.Context, update func([]string)) error
}

// Static is a fixed list.
type Static []string

// Run implements Source.
func (s Static) Run(ctx context.Context, update func([]string)) error {
	list := slices.Clone([]string(s))
	slices.Sort(list)
	update(slices.Compact(list))
	<-ctx.Done()
	return nil
}
