// Package schedtest serves a scheduler over gRPC on a loopback port for the
// cluster's tests, with a plain client to it: the setup the scheduler's,
// the node agent's and the gateway's tests share.
package schedtest

import (
	"net"
	"testing"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Server is a scheduler served for a test; the test's cleanup stops it.
type Server struct {
	Addr   string
	GRPC   *grpc.Server // Stop it to kill the replica early
	Client pb.SchedulerClient
}

// Serve serves s on a free loopback port until the test ends.
func Serve(t testing.TB, s pb.SchedulerServer) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("schedtest: listen: %v", err)
	}
	srv := grpc.NewServer()
	pb.RegisterSchedulerServer(srv, s)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("schedtest: client of %s: %v", ln.Addr(), err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return &Server{Addr: ln.Addr().String(), GRPC: srv, Client: pb.NewSchedulerClient(cc)}
}
