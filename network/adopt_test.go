package network_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/network/nettest"
)

// TestAdoptHelper is the process that dies holding a slot in use. It only
// runs when TestAdoptAfterCrash starts it.
func TestAdoptHelper(t *testing.T) {
	prefix := os.Getenv(crashPrefixEnv + "_ADOPT")
	if prefix == "" {
		t.Skip("helper process of TestAdoptAfterCrash")
	}
	m, err := network.New(context.Background(), network.Config{
		Prefix: prefix, HostNetNS: os.Getenv(crashHostEnv), GuestNetNS: true, PoolLow: 1, PoolHigh: 2,
	})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	s, err := m.Acquire(context.Background())
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	fmt.Println("SLOT", s.Index)
	select {}
}

// TestAdoptAfterCrash: a process holding a slot in use dies (kill -9); a
// new manager keeps that slot through its cleanup, adopts it (the guest is
// reached through the same host address, DNS answers again, the policy is
// set anew), removes everything else the dead process left, and Shutdown
// leaves nothing.
func TestAdoptAfterCrash(t *testing.T) {
	t.Parallel()
	nettest.RequireRoot(t)
	w := nettest.NewWorld(t, nettest.Prefix())
	w.ServeDNS(t)
	w.SetRecord("adopted.test", nettest.TestNet1)
	cfg := w.Config()
	cfg.GuestNetNS = true
	t.Cleanup(func() { network.Cleanup(context.Background(), cfg) })

	cmd, line := startHelper(t, "TestAdoptHelper", []string{crashPrefixEnv + "_ADOPT=" + cfg.Prefix, crashHostEnv + "=" + cfg.HostNetNS},
		func(l string) bool { return strings.HasPrefix(l, "SLOT ") })
	index, err := strconv.Atoi(strings.TrimPrefix(line, "SLOT "))
	if err != nil {
		t.Fatalf("helper: %s", line)
	}
	time.Sleep(200 * time.Millisecond) // let its pool refill build another slot
	cmd.Process.Kill()
	cmd.Wait()

	cfg.Keep = []int{index}
	m, err := network.New(t.Context(), cfg)
	if err != nil {
		t.Fatalf("New keeping slot %d: %v", index, err)
	}
	guestNS := network.NetNSPath(fmt.Sprintf("%s-%dg", cfg.Prefix, index))
	if _, err := os.Stat(guestNS); err != nil {
		t.Fatalf("the kept slot's guest is gone: %v", err)
	}
	nettest.ServeHello(nettest.Listen(t, guestNS, guestAddr(8080)), "kept")
	s, err := m.Adopt(t.Context(), index)
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	ctx := t.Context()
	line, err = nettest.HelloVia(ctx, func(ctx context.Context) (net.Conn, error) { return s.DialGuest(ctx, "tcp", 8080) })
	if err != nil || !strings.HasPrefix(line, "hello kept ") {
		t.Fatalf("host -> adopted guest: %q %v", line, err)
	}
	if a, err := nettest.Resolve(ctx, guestNS, netip.AddrPortFrom(network.NameserverIP, 53), "adopted.test"); err != nil || a != nettest.TestNet1 {
		t.Fatalf("DNS in the adopted slot: %v %v", a, err)
	}
	if err := s.SetPolicy(ctx, network.Policy{DenyInternet: true}); err != nil {
		t.Fatalf("policy of the adopted slot: %v", err)
	}
	if !nettest.Blocked(ctx, guestNS, netip.AddrPortFrom(nettest.TestNet1, 80)) {
		t.Error("the adopted slot's new policy does not hold")
	}
	if _, err := m.Adopt(ctx, index); err == nil {
		t.Error("a slot was adopted twice")
	}
	// A fresh slot does not take the adopted index.
	fresh, err := m.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fresh.Index == index {
		t.Fatalf("fresh slot reuses the adopted index %d", index)
	}
	if err := m.Release(ctx, s); err != nil {
		t.Fatalf("release the adopted slot: %v", err)
	}
	if err := m.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	left, err := nettest.Leftovers(cfg.Prefix, cfg.HostNetNS)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Fatalf("left after adopt and shutdown: %v", left)
	}
}

// TestForgetKeptSlot: a kept slot whose VM is gone is destroyed by Forget,
// and one neither adopted nor forgotten by Shutdown.
func TestForgetKeptSlot(t *testing.T) {
	t.Parallel()
	nettest.RequireRoot(t)
	w := nettest.NewWorld(t, nettest.Prefix())
	cfg := w.Config()
	cfg.GuestNetNS = true
	m1, err := network.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	a, b := acquire(t, m1), acquire(t, m1)
	// Simulate a crash of m1: a new manager takes over with both kept.
	cfg.Keep = []int{a.Index, b.Index}
	m2, err := network.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m2.Forget(a.Index); err != nil {
		t.Fatalf("Forget: %v", err)
	}
	if _, err := os.Stat(a.NetNSPath()); !os.IsNotExist(err) {
		t.Fatalf("forgotten slot's namespace: %v", err)
	}
	if _, err := os.Stat(b.NetNSPath()); err != nil {
		t.Fatalf("kept slot's namespace: %v", err)
	}
	if err := m2.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	left, err := nettest.Leftovers(cfg.Prefix, cfg.HostNetNS)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Fatalf("left after shutdown with a kept slot: %v", left)
	}
}

// TestDetachSurvivesShutdown: a slot detached before a graceful Shutdown
// (its VM runs on) keeps its namespaces and veth through Shutdown and is
// adopted by the next manager, the guest reachable as before; Shutdown of
// the slots still in use removes them.
func TestDetachSurvivesShutdown(t *testing.T) {
	t.Parallel()
	nettest.RequireRoot(t)
	w := nettest.NewWorld(t, nettest.Prefix())
	cfg := w.Config()
	cfg.GuestNetNS = true
	t.Cleanup(func() { network.Cleanup(context.Background(), cfg) })
	m1, err := network.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	kept, other := acquire(t, m1), acquire(t, m1)
	guestNS := kept.GuestNetNSPath()
	nettest.ServeHello(nettest.Listen(t, guestNS, guestAddr(8080)), "detached")
	m1.Detach(kept)
	if err := m1.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown with a detached slot: %v", err)
	}
	if _, err := os.Stat(other.NetNSPath()); err == nil {
		t.Fatalf("Shutdown left the slot still in use (%s)", other.Name)
	}
	cfg.Keep = []int{kept.Index}
	m2, err := network.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := m2.Adopt(t.Context(), kept.Index)
	if err != nil {
		t.Fatalf("Adopt the detached slot: %v", err)
	}
	line, err := nettest.HelloVia(t.Context(), func(ctx context.Context) (net.Conn, error) { return s.DialGuest(ctx, "tcp", 8080) })
	if err != nil || !strings.HasPrefix(line, "hello detached ") {
		t.Fatalf("host -> guest of the detached slot after the restart: %q %v", line, err)
	}
	if err := m2.Release(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	if err := m2.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}
