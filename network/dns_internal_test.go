package network

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os"
	"testing"
	"time"
)

// TestResolvedAddressRenewal drives the dns_allow bookkeeping against a
// real slot: first add, renewal of an ageing entry (delete + add), and
// renewal of an entry the kernel already dropped.
func TestResolvedAddressRenewal(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	var b [3]byte
	rand.Read(b[:])
	prefix := "u" + hex.EncodeToString(b[:])[:5]
	host := prefix + "-host"
	if err := createNamedNS(host); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNamedNS(host) })
	m, err := New(t.Context(), Config{Prefix: prefix, HostNetNS: NetNSPath(host),
		DNSUpstream: netip.MustParseAddrPort("192.0.2.53:53")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Shutdown(context.Background()) })
	s, err := m.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetPolicy(t.Context(), Policy{DenyInternet: true, AllowOut: []string{"x.test"}}); err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr("192.0.2.1")
	ttl := 90 * time.Second

	// kernelLeft returns the element's remaining lifetime in the kernel.
	kernelLeft := func() (time.Duration, bool) {
		t.Helper()
		c, err := s.nft()
		if err != nil {
			t.Fatal(err)
		}
		els, err := c.GetSetElements(s.table.dnsAllow)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range els {
			if netip.AddrFrom4([4]byte(e.Key)) == a {
				return e.Expires, true
			}
		}
		return 0, false
	}
	allow := func() {
		t.Helper()
		if err := s.allowResolved("x.test", map[netip.Addr]time.Duration{a: ttl}); err != nil {
			t.Fatalf("allowResolved: %v", err)
		}
	}
	age := func(left time.Duration) {
		s.dns.mu.Lock()
		s.dns.records[a] = dnsRecord{name: "x.test", expires: time.Now().Add(left)}
		s.dns.mu.Unlock()
	}

	allow()
	if left, ok := kernelLeft(); !ok || left < ttl-10*time.Second {
		t.Fatalf("after first answer: present=%v left=%v, want about %v", ok, left, ttl)
	}
	if err := s.allowResolved("y.test", map[netip.Addr]time.Duration{netip.MustParseAddr("192.0.2.2"): ttl}); err != nil {
		t.Fatal(err)
	}
	if len(s.dns.records) != 1 {
		t.Fatalf("a name the policy does not allow was recorded: %v", s.dns.records)
	}

	// Pretend the entry is old: the kernel entry is replaced with a fresh one.
	c, _ := s.nft()
	c.SetDeleteElements(s.table.dnsAllow, dnsElements(map[netip.Addr]time.Duration{a: ttl}))
	c.SetAddElements(s.table.dnsAllow, dnsElements(map[netip.Addr]time.Duration{a: 5 * time.Second}))
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	age(5 * time.Second)
	allow()
	if left, ok := kernelLeft(); !ok || left < ttl-10*time.Second {
		t.Fatalf("after renewal: present=%v left=%v, want about %v", ok, left, ttl)
	}

	// The kernel dropped it (expiry) but our record still lives: renewal
	// must not fail on the missing element.
	c, _ = s.nft()
	c.SetDeleteElements(s.table.dnsAllow, dnsElements(map[netip.Addr]time.Duration{a: ttl}))
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	age(time.Second)
	allow()
	if _, ok := kernelLeft(); !ok {
		t.Fatalf("renewal after kernel expiry did not re-add the address")
	}
}
