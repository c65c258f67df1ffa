package schedulerpb

import (
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
)

// Conn is a client connection to every scheduler replica: calls are spread
// round-robin over the replicas that answer, so losing one costs at most
// the calls in flight to it. SetAddrs replaces the replica list (discovery).
type Conn struct {
	*grpc.ClientConn
	r *manual.Resolver
}

// Dial connects to the replicas at addrs (host:port).
func Dial(addrs []string) (*Conn, error) {
	if len(addrs) == 0 {
		return nil, errors.New("dial schedulers: no address")
	}
	r := manual.NewBuilderWithScheme("aenv-scheduler")
	r.InitialState(state(addrs))
	cc, err := grpc.NewClient(r.Scheme()+":///replicas", grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
	if err != nil {
		return nil, fmt.Errorf("dial schedulers %v: %w", addrs, err)
	}
	return &Conn{ClientConn: cc, r: r}, nil
}

func state(addrs []string) resolver.State {
	var st resolver.State
	for _, a := range addrs {
		st.Addresses = append(st.Addresses, resolver.Address{Addr: a})
	}
	return st
}

// SetAddrs replaces the replica addresses.
func (c *Conn) SetAddrs(addrs []string) {
	if len(addrs) > 0 {
		c.r.UpdateState(state(addrs))
	}
}

// Client is the API over the connection.
func (c *Conn) Client() SchedulerClient { return NewSchedulerClient(c.ClientConn) }
