package network_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/network/nettest"
)

func TestEgressPolicy(t *testing.T) {
	t.Parallel()
	m, w := newManager(t, func(c *network.Config) { c.GuestNetNS = true })
	w.ServeWorld(t, 80)
	w.ServeDNS(t)
	w.SetRecord("allowed.test", nettest.TestNet1)
	w.SetRecord("a.wild.test", nettest.TestNet2)
	w.SetRecord("blocked.test", nettest.TestNet3)
	w.SetRecord("private.test", nettest.Private)
	s := acquire(t, m)
	guest := s.GuestNetNSPath()
	ctx := t.Context()
	at := func(a netip.Addr) netip.AddrPort { return netip.AddrPortFrom(a, 80) }

	// reach asserts which world addresses the guest can connect to.
	reach := func(t *testing.T, want map[netip.Addr]bool) {
		t.Helper()
		for a, ok := range want {
			if ok && !nettest.Reachable(ctx, guest, at(a)) {
				t.Errorf("connect to %s failed, want it to succeed", a)
			}
			if !ok && !nettest.Blocked(ctx, guest, at(a)) {
				t.Errorf("connect to %s succeeded, want it blocked", a)
			}
		}
	}
	set := func(t *testing.T, p network.Policy) {
		t.Helper()
		if err := s.SetPolicy(ctx, p); err != nil {
			t.Fatalf("SetPolicy(%+v): %v", p, err)
		}
	}
	// resolve asks a nameserver that does not exist: the slot must
	// redirect the query to its own resolver.
	resolve := func(name string) (netip.Addr, error) {
		return nettest.Resolve(ctx, guest, netip.MustParseAddrPort("203.0.113.53:53"), name)
	}
	T1, T2, T3, P := nettest.TestNet1, nettest.TestNet2, nettest.TestNet3, nettest.Private

	cases := []struct {
		name   string
		policy network.Policy
		want   map[netip.Addr]bool
	}{
		{"default: internet yes, private no", network.Policy{},
			map[netip.Addr]bool{T1: true, T2: true, T3: true, P: false}},
		{"no internet but an allowed CIDR", network.Policy{DenyInternet: true, AllowOut: []string{"192.0.2.0/24"}},
			map[netip.Addr]bool{T1: true, T2: false, T3: false, P: false}},
		{"denied CIDR", network.Policy{DenyOut: []string{"203.0.113.0/24"}},
			map[netip.Addr]bool{T1: true, T2: true, T3: false}},
		{"allow wins over deny", network.Policy{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"198.51.100.10"}},
			map[netip.Addr]bool{T1: false, T2: true, T3: false}},
		{"always-denied stays denied", network.Policy{AllowOut: []string{"192.168.0.0/16", "0.0.0.0/0"}},
			map[netip.Addr]bool{T1: true, P: false}},
		{"back to default", network.Policy{},
			map[netip.Addr]bool{T1: true, T2: true, T3: true, P: false}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			set(t, c.policy)
			reach(t, c.want)
		})
	}

	t.Run("domains", func(t *testing.T) {
		set(t, network.Policy{DenyInternet: true, AllowOut: []string{"allowed.test", "*.wild.test", "private.test"}})
		reach(t, map[netip.Addr]bool{T1: false, T2: false}) // nothing resolved yet
		// The second answer finds the address already allowed.
		for range 2 {
			if a, err := resolve("allowed.test"); err != nil || a != T1 {
				t.Fatalf("resolve allowed.test = %v, %v; want %s", a, err, T1)
			}
		}
		// Over TCP, straight to the slot's nameserver address.
		a, err := nettest.ResolveOver(ctx, "tcp4", guest, netip.AddrPortFrom(network.NameserverIP, 53), "A.Wild.Test.")
		if err != nil || a != T2 {
			t.Fatalf("resolve a.wild.test over TCP = %v, %v; want %s", a, err, T2)
		}
		if _, err := resolve("blocked.test"); err == nil || !strings.Contains(err.Error(), "Refused") {
			t.Fatalf("resolve blocked.test: %v, want refused", err)
		}
		if _, err := resolve("wild.test"); err == nil {
			t.Fatalf("*.wild.test must not cover wild.test itself")
		}
		if a, err := resolve("private.test"); err != nil || a != P {
			t.Fatalf("resolve private.test = %v, %v; want %s", a, err, P)
		}
		reach(t, map[netip.Addr]bool{T1: true, T2: true, T3: false, P: false})
	})

	t.Run("runtime replacement revokes and restores", func(t *testing.T) {
		set(t, network.Policy{DenyInternet: true, AllowOut: []string{"*.wild.test"}})
		reach(t, map[netip.Addr]bool{T1: false, T2: true}) // allowed.test's address is gone, a.wild.test's kept
		set(t, network.Policy{DenyInternet: true})
		reach(t, map[netip.Addr]bool{T1: false, T2: false, T3: false})
		set(t, network.Policy{})
		reach(t, map[netip.Addr]bool{T1: true, T2: true, T3: true, P: false})
		if a, err := resolve("blocked.test"); err != nil || a != T3 {
			t.Fatalf("with internet, resolve blocked.test = %v, %v; want %s", a, err, T3)
		}
	})

	t.Run("invalid policies are rejected and change nothing", func(t *testing.T) {
		for _, p := range []network.Policy{
			{DenyOut: []string{"example.com"}},
			{AllowOut: []string{"10.0.0.0/33"}},
			{AllowOut: []string{"::1"}},
			{AllowOut: []string{"bad..name"}},
		} {
			if err := s.SetPolicy(ctx, p); err == nil {
				t.Errorf("SetPolicy(%+v) accepted", p)
			}
		}
		reach(t, map[netip.Addr]bool{T1: true})
	})
}

func TestReleaseScrubsPolicy(t *testing.T) {
	t.Parallel()
	m, w := newManager(t, func(c *network.Config) {
		c.GuestNetNS = true
		c.PoolLow, c.PoolHigh = 0, 2
	})
	w.ServeWorld(t, 80)
	s := acquire(t, m)
	if err := s.SetPolicy(t.Context(), network.Policy{DenyInternet: true}); err != nil {
		t.Fatal(err)
	}
	if got := s.Policy(); !got.DenyInternet {
		t.Fatalf("Policy() = %+v, want the one set", got)
	}
	if err := m.Release(t.Context(), s); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if st := m.Stats(); st.InUse != 0 {
		t.Fatalf("after release: %+v, want none in use", st)
	}
	waitFor(t, "the released slot to be scrubbed into the pool", func() bool { return m.Stats().Pooled == 1 })
	s2 := acquire(t, m)
	if s2 != s {
		t.Fatalf("Acquire did not reuse the pooled slot")
	}
	if got := s2.Policy(); got.DenyInternet {
		t.Fatalf("reused slot reports the previous policy %+v", got)
	}
	if !nettest.Reachable(t.Context(), s2.GuestNetNSPath(), netip.AddrPortFrom(nettest.TestNet1, 80)) {
		t.Fatalf("reused slot kept the previous sandbox's policy")
	}
	if err := m.Release(t.Context(), s2); err != nil {
		t.Fatal(err)
	}
	if err := m.Release(t.Context(), s2); err == nil {
		t.Fatalf("double release accepted")
	}
}

func TestConfigurableAlwaysDenied(t *testing.T) {
	t.Parallel()
	m, w := newManager(t, func(c *network.Config) {
		c.GuestNetNS = true
		c.AlwaysDenied = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
	})
	w.ServeWorld(t, 80)
	s := acquire(t, m)
	ctx := t.Context()
	if err := s.SetPolicy(ctx, network.Policy{AllowOut: []string{"203.0.113.10"}}); err != nil {
		t.Fatal(err)
	}
	if !nettest.Blocked(ctx, s.GuestNetNSPath(), netip.AddrPortFrom(nettest.TestNet3, 80)) {
		t.Errorf("configured always-denied range reachable despite allowOut")
	}
	if !nettest.Reachable(ctx, s.GuestNetNSPath(), netip.AddrPortFrom(nettest.Private, 80)) {
		t.Errorf("private address blocked although the configured list leaves it out")
	}
}
