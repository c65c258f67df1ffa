package network

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// TestDumpsSurviveConcurrentLinkChanges: link dumps that the kernel marks
// interrupted ("results may be incomplete or inconsistent") because links
// come and go meanwhile, as they do on a busy node, are retried instead of
// failing Shutdown and Cleanup.
func TestDumpsSurviveConcurrentLinkChanges(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	var b [3]byte
	rand.Read(b[:])
	prefix := "d" + hex.EncodeToString(b[:])[:5]
	host := prefix + "-host"
	if err := createNamedNS(host); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNamedNS(host) })
	hns, err := netns.GetFromPath(NetNSPath(host))
	if err != nil {
		t.Fatal(err)
	}
	defer hns.Close()
	h, err := netlink.NewHandleAt(hns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	// Enough links that a dump spans several netlink messages.
	for i := range 60 {
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("pad%d", i)}, PeerName: fmt.Sprintf("pad%dp", i)}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{Prefix: prefix, HostNetNS: NetNSPath(host), DNSUpstream: netip.MustParseAddrPort("192.0.2.53:53")}
	m, err := New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the churn: a link added and removed, again and again
		defer wg.Done()
		ch, err := netlink.NewHandleAt(hns, unix.NETLINK_ROUTE)
		if err != nil {
			return
		}
		defer ch.Close()
		for ctx.Err() == nil {
			l := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "churn0"}, PeerName: "churn1"}
			ch.LinkAdd(l)
			ch.LinkDel(l)
		}
	}()
	var errs []error
	for range 100 {
		if _, err := m.hostVeths(); err != nil {
			errs = append(errs, err)
		}
		if _, err := cleanupLinks(cfg); err != nil {
			errs = append(errs, err)
		}
	}
	err = m.Shutdown(context.Background())
	cancel()
	wg.Wait()
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		t.Fatalf("%d of 201 dumps failed under link churn, first: %v", len(errs), errs[0])
	}
}
