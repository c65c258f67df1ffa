// Command aenv-netcheck checks that a host can run AgentENV network slots,
// and removes slot leftovers.
//
//	aenv-netcheck selftest            build a throwaway host and internet in namespaces,
//	                                  a slot in it, and check paths and egress policy
//	aenv-netcheck cleanup [-prefix aenv] [-host-netns PATH]
//	                                  remove what a crashed node left behind
//
// The self-test sends traffic only between namespaces it creates.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/network/nettest"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "selftest":
		err = selftest(context.Background())
	case "cleanup":
		err = cleanup(context.Background(), os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "aenv-netcheck:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: aenv-netcheck selftest | cleanup [-prefix aenv] [-host-netns PATH]")
	os.Exit(2)
}

func cleanup(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("cleanup", flag.ExitOnError)
	prefix := fs.String("prefix", "aenv", "name prefix of the node's slots")
	hostNS := fs.String("host-netns", "", "host namespace path (default: this process's)")
	fs.Parse(args)
	n, err := network.Cleanup(ctx, network.Config{Prefix: *prefix, HostNetNS: *hostNS})
	fmt.Printf("removed %d objects\n", n)
	return err
}

// harness adapts nettest's helpers to a command: Fatalf aborts the run,
// Cleanup functions run at the end.
type harness struct{ cleanups []func() }

type fatal string

func (h *harness) Helper()                   {}
func (h *harness) Logf(f string, a ...any)   { fmt.Printf(f+"\n", a...) }
func (h *harness) Fatalf(f string, a ...any) { panic(fatal(fmt.Sprintf(f, a...))) }
func (h *harness) Cleanup(f func())          { h.cleanups = append(h.cleanups, f) }
func (h *harness) close() {
	for i := len(h.cleanups) - 1; i >= 0; i-- {
		h.cleanups[i]()
	}
}

func selftest(ctx context.Context) (err error) {
	if os.Geteuid() != 0 {
		return fmt.Errorf("selftest needs root (it creates network namespaces)")
	}
	h := &harness{}
	defer h.close()
	defer func() {
		if f, ok := recover().(fatal); ok {
			err = fmt.Errorf("%s", string(f))
		}
	}()
	w := nettest.NewWorld(h, nettest.Prefix())
	w.ServeWorld(h, 80)
	w.ServeDNS(h)
	w.SetRecord("allowed.test", nettest.TestNet1)
	cfg := w.Config()
	cfg.GuestNetNS = true
	m, err := network.New(ctx, cfg)
	if err != nil {
		return err
	}
	h.Cleanup(func() { m.Shutdown(context.Background()) })
	start := time.Now()
	s, err := m.Acquire(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("slot %s created in %v (host address %s)\n", s.Name, time.Since(start), s.HostIP)
	nettest.ServeHello(nettest.Listen(h, s.GuestNetNSPath(), netip.AddrPortFrom(network.GuestIP, 8080)), "guest")
	return runChecks(ctx, w, s)
}

func runChecks(ctx context.Context, w *nettest.World, s *network.Slot) error {
	guest := s.GuestNetNSPath()
	world := func(a netip.Addr) netip.AddrPort { return netip.AddrPortFrom(a, 80) }
	setPolicy := func(p network.Policy) bool { return s.SetPolicy(ctx, p) == nil }
	checks := []struct {
		name string
		ok   func() bool
	}{
		{"host reaches the guest through its host address", func() bool {
			_, err := nettest.HelloVia(ctx, func(ctx context.Context) (net.Conn, error) { return s.DialGuest(ctx, "tcp", 8080) })
			return err == nil
		}},
		{"other host sockets (no socket mark) do not reach the guest", func() bool {
			return nettest.Blocked(ctx, w.HostNS, s.GuestAddr(8080))
		}},
		{"guest reaches the internet", func() bool { return nettest.Reachable(ctx, guest, world(nettest.TestNet2)) }},
		{"guest cannot reach a private range", func() bool { return nettest.Blocked(ctx, guest, world(nettest.Private)) }},
		{"policy without internet blocks", func() bool {
			return setPolicy(network.Policy{DenyInternet: true, AllowOut: []string{"allowed.test"}}) &&
				nettest.Blocked(ctx, guest, world(nettest.TestNet1))
		}},
		{"allowed domain opens after DNS", func() bool {
			a, err := nettest.Resolve(ctx, guest, netip.AddrPortFrom(network.NameserverIP, 53), "allowed.test")
			return err == nil && a == nettest.TestNet1 && nettest.Reachable(ctx, guest, world(nettest.TestNet1))
		}},
		{"other addresses stay blocked", func() bool { return nettest.Blocked(ctx, guest, world(nettest.TestNet3)) }},
	}
	failed := 0
	for _, c := range checks {
		status := "ok  "
		if !c.ok() {
			status, failed = "FAIL", failed+1
		}
		fmt.Printf("%s %s\n", status, c.name)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d checks failed", failed, len(checks))
	}
	return nil
}
