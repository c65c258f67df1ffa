package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Slot is one sandbox network: a namespace with a veth to the host and a tap
// for the VM. A slot is used by one sandbox at a time.
type Slot struct {
	// Index is the slot's number; its addresses derive from it.
	Index int
	// Name is the namespace name ("<prefix>-<index>").
	Name string
	// HostVeth is the host end of the veth pair.
	HostVeth string
	// HostIP is the host-interaction address: the host (the sandbox proxy)
	// reaches guest port P at HostIP:P, and the guest's egress leaves the
	// slot with HostIP as its source.
	HostIP netip.Addr
	// VethHostIP and VethPeerIP are the /31 transit addresses.
	VethHostIP, VethPeerIP netip.Addr

	m     *Manager
	ns    netns.NsHandle
	table *slotTable
	dns   *resolver

	mu     sync.Mutex
	policy *compiledPolicy
	raw    Policy // as last set, for reporting
}

// NetNSPath is the slot namespace's bind-mount path (for `ip netns exec`).
func (s *Slot) NetNSPath() string { return NetNSPath(s.Name) }

// GuestNetNSPath is the namespace that plays the VM when the manager runs
// with Config.GuestNetNS; empty otherwise.
func (s *Slot) GuestNetNSPath() string {
	if !s.m.cfg.GuestNetNS {
		return ""
	}
	return NetNSPath(s.Name + "g")
}

// Guest returns the guest network configuration (the same for every slot).
func (s *Slot) Guest() GuestConfig { return Guest() }

// KernelIPArg renders the guest's kernel ip= argument (see GuestConfig).
func (s *Slot) KernelIPArg() string { return Guest().KernelIPArg() }

// GuestAddr is where the host dials to reach the guest's port.
func (s *Slot) GuestAddr(port uint16) netip.AddrPort { return netip.AddrPortFrom(s.HostIP, port) }

// DialGuest connects from the host namespace to the guest's port through
// the slot's host-interaction address.
func (s *Slot) DialGuest(ctx context.Context, network string, port uint16) (net.Conn, error) {
	return s.m.dialHost(ctx, network, s.GuestAddr(port).String(), true)
}

// OpenTap opens the slot's tap device for a VMM: an open /dev/net/tun file
// attached to tap0 with IFF_TAP|IFF_NO_PI|IFF_VNET_HDR. The file descriptor
// is blocking, as VMMs expect; the caller owns and closes it.
func (s *Slot) OpenTap() (*os.File, error) {
	if s.m.cfg.GuestNetNS {
		return nil, fmt.Errorf("open tap of slot %s: the slot has a guest namespace, not a tap", s.Name)
	}
	var fd int
	err := runInHandle(s.ns, func() error {
		var err error
		fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open tap of slot %s: %w", s.Name, err)
	}
	if err := attachTap(fd, TapName); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EBUSY) {
			// Someone still has the tap attached: name them, this is a bug.
			err = fmt.Errorf("%w (holders of the slot's %s: %s)", err, TapName, s.tapHolders())
		}
		return nil, fmt.Errorf("open tap of slot %s: %w", s.Name, err)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun:"+TapName), nil
}

func attachTap(fd int, name string) error {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return fmt.Errorf("TUNSETIFF %s: %w", name, err)
	}
	return nil
}

// createPersistentTap creates tap0 in the current thread's namespace; it
// outlives the file descriptor until the namespace goes.
func createPersistentTap(name string) error {
	// No fork while the descriptor is open: a child forked meanwhile would
	// hold the tap attached until it execs, and a slot handed out at once
	// then finds its tap busy (seen under load with children starting
	// concurrently, as VMMs do).
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /dev/net/tun: %w", err)
	}
	defer unix.Close(fd)
	if err := attachTap(fd, name); err != nil {
		return err
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
		return fmt.Errorf("TUNSETPERSIST %s: %w", name, err)
	}
	return nil
}

// SetPolicy replaces the slot's egress policy atomically.
func (s *Slot) SetPolicy(ctx context.Context, p Policy) error {
	cp, err := compilePolicy(p)
	if err != nil {
		return fmt.Errorf("set policy of slot %s: %w", s.Name, err)
	}
	if err := s.applyPolicy(ctx, cp); err != nil {
		return err
	}
	s.mu.Lock()
	s.raw = Policy{DenyInternet: p.DenyInternet, AllowOut: slices.Clone(p.AllowOut), DenyOut: slices.Clone(p.DenyOut)}
	s.mu.Unlock()
	return nil
}

// Policy returns the policy last set (the zero Policy after Acquire).
func (s *Slot) Policy() Policy {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Policy{DenyInternet: s.raw.DenyInternet, AllowOut: slices.Clone(s.raw.AllowOut), DenyOut: slices.Clone(s.raw.DenyOut)}
}

// applyPolicy installs cp and then ends the guest's connections that cp
// no longer permits: the rules accept packets of established connections
// before they look at the policy, so without this a tightened policy
// would only apply to new connections.
func (s *Slot) applyPolicy(_ context.Context, cp *compiledPolicy) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.nft()
	if err != nil {
		return err
	}
	keep := s.dns.keepFor(cp)
	if err := s.table.setPolicy(c, cp, keep); err != nil {
		return fmt.Errorf("set policy of slot %s: %w", s.Name, err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("set policy of slot %s: %w", s.Name, err)
	}
	s.policy = cp
	if err := s.cutDenied(cp, keep); err != nil {
		return fmt.Errorf("set policy of slot %s: %w", s.Name, err)
	}
	return nil
}

// cutDenied deletes the conntrack entries of guest connections to
// destinations cp does not permit; their next packet is then a new one,
// which the egress rules refuse. Called with s.mu held.
func (s *Slot) cutDenied(cp *compiledPolicy, keep map[netip.Addr]time.Duration) error {
	h, err := netlink.NewHandleAt(s.ns, unix.NETLINK_NETFILTER)
	if err != nil {
		return fmt.Errorf("conntrack: %w", err)
	}
	defer h.Close()
	f := deniedFlows{p: cp, denied: s.m.denied, keep: keep}
	_, err = retryDump(func() (uint, error) { return h.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, f) })
	if err != nil {
		return fmt.Errorf("cut denied connections: %w", err)
	}
	return nil
}

// deniedFlows matches the guest's connections to destinations a policy
// does not permit.
type deniedFlows struct {
	p      *compiledPolicy
	denied []ipRange
	keep   map[netip.Addr]time.Duration
}

func (f deniedFlows) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	src, ok1 := netip.AddrFromSlice(flow.Forward.SrcIP.To4())
	dst, ok2 := netip.AddrFromSlice(flow.Forward.DstIP.To4())
	if !ok1 || !ok2 || src != GuestIP {
		return false
	}
	_, resolved := f.keep[dst]
	return !f.p.permits(dst, f.denied, resolved)
}

func (s *Slot) currentPolicy() *compiledPolicy {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.policy
}

func (s *Slot) nft() (*nftables.Conn, error) {
	if s.ns < 0 {
		// Never fall back to the current namespace: that is the host's.
		return nil, fmt.Errorf("nftables in slot %s: slot is destroyed", s.Name)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(s.ns)))
	if err != nil {
		return nil, fmt.Errorf("nftables in slot %s: %w", s.Name, err)
	}
	return c, nil
}

// ---- creation and destruction ----

func (m *Manager) newSlot(index int) *Slot {
	a := addrsFor(&m.cfg, index)
	return &Slot{
		Index: index, Name: m.cfg.Prefix + "-" + strconv.Itoa(index),
		HostVeth: m.cfg.Prefix + "v" + strconv.Itoa(index),
		HostIP:   a.HostIP, VethHostIP: a.VethHost, VethPeerIP: a.VethPeer,
		m: m, ns: -1, table: newSlotTable(m.cfg.Prefix),
	}
}

// build creates everything of the slot; on error the caller destroys it.
// The rules go in first, so no packet ever crosses an unfiltered slot.
func (s *Slot) build(ctx context.Context) error {
	if err := createNamedNS(s.Name); err != nil {
		return err
	}
	if err := s.openNS(); err != nil {
		return err
	}
	if err := s.installRules(); err != nil {
		return err
	}
	if err := s.buildVeth(); err != nil {
		return err
	}
	if err := s.buildInside(); err != nil {
		return err
	}
	if err := s.m.hostRouteAdd(s); err != nil {
		return err
	}
	s.dns.start(ctx)
	return nil
}

func (s *Slot) openNS() error {
	ns, err := netns.GetFromPath(s.NetNSPath())
	if err != nil {
		return fmt.Errorf("open netns %s: %w", s.Name, err)
	}
	s.ns = ns
	return nil
}

func (s *Slot) installRules() error {
	s.policy = &compiledPolicy{}
	c, err := s.nft()
	if err != nil {
		return err
	}
	a := slotAddrs{HostIP: s.HostIP, VethHost: s.VethHostIP, VethPeer: s.VethPeerIP}
	if err := s.table.install(c, s.m.denied, a, s.policy); err != nil {
		return fmt.Errorf("install nft table in slot %s: %w", s.Name, err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install nft table in slot %s: %w", s.Name, err)
	}
	return nil
}

// buildVeth creates the veth pair with its slot end already in the slot
// and configures the host end.
func (s *Slot) buildVeth() error {
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: s.HostVeth}, PeerName: slotUplink, PeerNamespace: netlink.NsFd(int(s.ns)),
	}
	err := s.m.hostLinkAdd(veth)
	if errors.Is(err, unix.EEXIST) {
		// The veth of a destroyed slot with this index is still being
		// dismantled by the kernel: remove it now.
		if err = s.m.hostLinkDel(s.HostVeth); err == nil {
			err = s.m.hostLinkAdd(veth)
		}
	}
	if err != nil {
		return fmt.Errorf("create veth %s: %w", s.HostVeth, err)
	}
	return s.m.hostVethUp(s)
}

// buildInside configures the slot namespace (and the guest namespace when
// there is one).
func (s *Slot) buildInside() error {
	var guestNS netns.NsHandle = -1
	if s.m.cfg.GuestNetNS {
		var err error
		if guestNS, err = s.buildGuestNS(); err != nil {
			return err
		}
		defer guestNS.Close()
	}
	s.dns = newResolver(s)
	if err := runInHandle(s.ns, func() error { return s.configureInside(guestNS) }); err != nil {
		return fmt.Errorf("configure slot %s: %w", s.Name, err)
	}
	if guestNS >= 0 {
		if err := runInHandle(guestNS, configureGuestNS); err != nil {
			return fmt.Errorf("configure guest of slot %s: %w", s.Name, err)
		}
	}
	return nil
}

// configureInside runs on a thread inside the slot namespace.
func (s *Slot) configureInside(guestNS netns.NsHandle) error {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE) // one socket, in this namespace
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	// The guest only has IPv4; without IPv6 on the slot's devices it has
	// no IPv6 path into the slot either. Kernels without IPv6 lack the knob.
	for _, k := range []string{"net/ipv6/conf/all/disable_ipv6", "net/ipv6/conf/default/disable_ipv6"} {
		if err := writeSysctl(k, "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := setRPFilter(); err != nil {
		return err
	}
	if err := linkUpByName(h, "lo"); err != nil {
		return err
	}
	uplink, err := h.LinkByName(slotUplink)
	if err != nil {
		return fmt.Errorf("find %s: %w", slotUplink, err)
	}
	if err := h.AddrAdd(uplink, &netlink.Addr{IPNet: ipNet(s.VethPeerIP, 31)}); err != nil {
		return fmt.Errorf("address %s: %w", slotUplink, err)
	}
	if err := h.LinkSetUp(uplink); err != nil {
		return fmt.Errorf("up %s: %w", slotUplink, err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: uplink.Attrs().Index, Gw: s.VethHostIP.AsSlice()}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	if err := s.createVMLink(h, guestNS); err != nil {
		return err
	}
	vmLink, err := h.LinkByName(TapName)
	if err != nil {
		return fmt.Errorf("find %s: %w", TapName, err)
	}
	if err := h.LinkSetHardwareAddr(vmLink, GatewayMAC); err != nil {
		return fmt.Errorf("set MAC of %s: %w", TapName, err)
	}
	if err := h.AddrAdd(vmLink, &netlink.Addr{IPNet: ipNet(GatewayIP, GuestNetBits)}); err != nil {
		return fmt.Errorf("address %s: %w", TapName, err)
	}
	if err := h.LinkSetUp(vmLink); err != nil {
		return fmt.Errorf("up %s: %w", TapName, err)
	}
	if err := writeSysctl("net/ipv4/ip_forward", "1"); err != nil {
		return err
	}
	// The resolver's sockets are created here so they live in the slot.
	return s.dns.listen()
}

// setRPFilter turns on strict reverse-path filtering in the current
// thread's namespace: a packet arriving on an interface its source would
// not be routed back through (a guest claiming an address that is not its
// own) is dropped. The kernel applies the larger of "all" and the
// interface's value, so "all" covers the interfaces that exist already.
func setRPFilter() error {
	for _, k := range []string{"net/ipv4/conf/all/rp_filter", "net/ipv4/conf/default/rp_filter"} {
		if err := writeSysctl(k, "1"); err != nil {
			return err
		}
	}
	return nil
}

func (s *Slot) createVMLink(h *netlink.Handle, guestNS netns.NsHandle) error {
	if guestNS < 0 {
		return createPersistentTap(TapName)
	}
	err := h.LinkAdd(&netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: TapName}, PeerName: guestIfName,
		PeerHardwareAddr: GuestMAC, PeerNamespace: netlink.NsFd(int(guestNS)),
	})
	if err != nil {
		return fmt.Errorf("create guest veth: %w", err)
	}
	return nil
}

// buildGuestNS creates the namespace that plays the VM.
func (s *Slot) buildGuestNS() (netns.NsHandle, error) {
	name := s.Name + "g"
	if err := createNamedNS(name); err != nil {
		return -1, err
	}
	h, err := netns.GetFromPath(NetNSPath(name))
	if err != nil {
		return -1, fmt.Errorf("open netns %s: %w", name, err)
	}
	return h, nil
}

func linkUpByName(h *netlink.Handle, name string) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("up %s: %w", name, err)
	}
	return nil
}

// configureGuestNS gives the fake guest the address a VM gets from the
// kernel's ip= argument. Runs inside the guest namespace.
func configureGuestNS() error {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	if err := linkUpByName(h, "lo"); err != nil {
		return err
	}
	l, err := h.LinkByName(guestIfName)
	if err != nil {
		return fmt.Errorf("find guest %s: %w", guestIfName, err)
	}
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipNet(GuestIP, GuestNetBits)}); err != nil {
		return fmt.Errorf("address guest: %w", err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("up guest: %w", err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: GatewayIP.AsSlice()}); err != nil {
		return fmt.Errorf("guest default route: %w", err)
	}
	return nil
}

// scrub returns a used slot to its pristine state: default policy, no
// resolved addresses, no connection tracking state of the last guest.
func (s *Slot) scrub(ctx context.Context) error {
	s.dns.reset()
	s.mu.Lock()
	s.raw = Policy{}
	s.mu.Unlock()
	if err := s.applyPolicy(ctx, &compiledPolicy{}); err != nil {
		return err
	}
	s.mu.Lock()
	h, err := netlink.NewHandleAt(s.ns, unix.NETLINK_NETFILTER)
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("scrub slot %s: %w", s.Name, err)
	}
	defer h.Close()
	if err := h.ConntrackTableFlush(netlink.ConntrackTable); err != nil {
		return fmt.Errorf("scrub slot %s: flush conntrack: %w", s.Name, err)
	}
	return nil
}

// destroy removes everything of the slot; safe on a partly built slot.
// It only drops the namespaces: the kernel then dismantles their devices
// (and the host end of the veth with them) asynchronously, in batches,
// which is several times cheaper than deleting each veth synchronously.
// The host veth's name may linger for a moment; create copes with that.
func (s *Slot) destroy() error {
	var errs []error
	if s.dns != nil {
		s.dns.close() // its sockets hold the namespace
	}
	s.mu.Lock()
	if s.ns >= 0 {
		s.ns.Close()
		s.ns = -1
	}
	s.mu.Unlock()
	errs = append(errs, deleteNamedNS(s.Name))
	if s.m.cfg.GuestNetNS {
		errs = append(errs, deleteNamedNS(s.Name+"g"))
	}
	return errors.Join(errs...)
}
