package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The host side of the slots: veth ends, their routes and reverse-path
// filters, and the host sockets aenvd reaches guests through (marked, so
// the host rules let only them into slot addresses).

func (m *Manager) hostLinkAdd(l netlink.Link) error {
	m.hostMu.Lock()
	defer m.hostMu.Unlock()
	return m.hostNL.LinkAdd(l)
}

func (m *Manager) hostLinkDel(name string) error {
	m.hostMu.Lock()
	defer m.hostMu.Unlock()
	l, err := m.hostNL.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := m.hostNL.LinkDel(l); err != nil {
		if errors.Is(err, unix.ENODEV) {
			return nil // the kernel finished dismantling it meanwhile
		}
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

func (m *Manager) hostVethExists(name string) error {
	m.hostMu.Lock()
	defer m.hostMu.Unlock()
	if _, err := m.hostNL.LinkByName(name); err != nil {
		return fmt.Errorf("find %s: %w", name, err)
	}
	return nil
}

func (m *Manager) hostVethUp(s *Slot) error {
	m.hostMu.Lock()
	defer m.hostMu.Unlock()
	l, err := m.hostNL.LinkByName(s.HostVeth)
	if err != nil {
		return fmt.Errorf("find %s: %w", s.HostVeth, err)
	}
	if err := m.hostNL.AddrAdd(l, &netlink.Addr{IPNet: ipNet(s.VethHostIP, 31)}); err != nil {
		return fmt.Errorf("address %s: %w", s.HostVeth, err)
	}
	if err := m.hostNL.LinkSetUp(l); err != nil {
		return fmt.Errorf("up %s: %w", s.HostVeth, err)
	}
	return m.hostRPFilter(s.HostVeth)
}

// hostRPFilter makes reverse-path filtering strict on a host veth (the
// kernel applies the larger of "all" and the interface's value, so the
// host's other interfaces keep theirs): only the slot's own addresses come
// in through it. The slot's rules already drop what its guest spoofs; this
// is the second line (a host whose "all" is 2, loose, keeps loose).
func (m *Manager) hostRPFilter(veth string) error {
	set := func() error { return writeSysctl("net/ipv4/conf/"+veth+"/rp_filter", "1") }
	if m.hostNS < 0 {
		return set()
	}
	return runInHandle(m.hostNS, set)
}

func (m *Manager) hostRouteAdd(s *Slot) error {
	m.hostMu.Lock()
	defer m.hostMu.Unlock()
	l, err := m.hostNL.LinkByName(s.HostVeth)
	if err != nil {
		return fmt.Errorf("find %s: %w", s.HostVeth, err)
	}
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet(s.HostIP, 32), Gw: s.VethPeerIP.AsSlice()}
	if err := m.hostNL.RouteAdd(r); err != nil {
		return fmt.Errorf("route %s via %s: %w", s.HostIP, s.HostVeth, err)
	}
	return nil
}

// DialContext dials addr from the host namespace with the manager's socket
// mark, as the sandbox proxy does; it fits http.Transport.DialContext. Only
// sockets with that mark reach slot addresses (see Config.SocketMark):
// every connection of the node server to a guest must come from here or
// from Slot.DialGuest.
func (m *Manager) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return m.dialHost(ctx, network, addr, true)
}

// dialHost dials from the host namespace; marked dials carry the socket
// mark that opens the slot addresses.
func (m *Manager) dialHost(ctx context.Context, network, addr string, marked bool) (net.Conn, error) {
	var d net.Dialer
	if marked {
		d.Control = markSocket(m.cfg.SocketMark)
	}
	if m.hostNS < 0 {
		return d.DialContext(ctx, network, addr)
	}
	var c net.Conn
	err := runInHandle(m.hostNS, func() error {
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// markSocket sets SO_MARK (needs CAP_NET_ADMIN, which is the point: an
// unprivileged process cannot forge it).
func markSocket(mark uint32) func(string, string, syscall.RawConn) error {
	return func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark))
		})
		if err == nil && serr != nil {
			err = fmt.Errorf("set socket mark: %w", serr)
		}
		return err
	}
}
