package network

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
)

// The guest view, identical in every slot so that snapshot clones keep
// working: the VM is 169.254.0.21/30 behind the gateway 169.254.0.22 (the
// tap's address in the slot; .20 is the network address of the /30 and
// cannot be a gateway).
var (
	GuestIP      = netip.MustParseAddr("169.254.0.21")
	GatewayIP    = netip.MustParseAddr("169.254.0.22")
	GuestNetBits = 30
	// GuestMAC is a locally administered unicast address.
	GuestMAC = net.HardwareAddr{0x02, 0xae, 0x00, 0x00, 0x00, 0x21}
	// GatewayMAC is the tap's address in every slot: a guest restored from
	// a snapshot taken in another slot keeps the gateway in its ARP cache,
	// so the gateway's MAC must not change either.
	GatewayMAC = net.HardwareAddr{0x02, 0xae, 0x00, 0x00, 0x00, 0x22}
	// NameserverIP is where the guest should send DNS. Any address works:
	// the slot redirects every DNS packet to its resolver, which listens here.
	NameserverIP = GatewayIP
)

const (
	// TapName is the VM link's name inside the slot namespace.
	TapName = "tap0"
	// guestIfName is the guest's interface name (kernel ip= argument and the
	// fake guest namespace).
	guestIfName = "eth0"
	// slotUplink is the slot end of the veth pair.
	slotUplink = "eth0"
)

// GuestConfig is the network configuration the guest must boot with.
type GuestConfig struct {
	IP         netip.Addr
	PrefixBits int
	Gateway    netip.Addr
	Nameserver netip.Addr
	MAC        net.HardwareAddr
	GatewayMAC net.HardwareAddr
	// Interface is the guest's device name.
	Interface string
}

// Guest returns the fixed guest configuration every slot serves.
func Guest() GuestConfig {
	return GuestConfig{
		IP: GuestIP, PrefixBits: GuestNetBits, Gateway: GatewayIP,
		Nameserver: NameserverIP, MAC: append(net.HardwareAddr(nil), GuestMAC...),
		GatewayMAC: append(net.HardwareAddr(nil), GatewayMAC...),
		Interface:  guestIfName,
	}
}

// KernelIPArg renders the kernel command-line argument that configures the
// guest's network: ip=<client>::<gw>:<netmask>::<device>:off.
func (g GuestConfig) KernelIPArg() string {
	mask := net.IP(net.CIDRMask(g.PrefixBits, 32)).String()
	return fmt.Sprintf("ip=%s::%s:%s::%s:off", g.IP, g.Gateway, mask, g.Interface)
}

// slotAddrs are the addresses derived from a slot index.
type slotAddrs struct {
	HostIP   netip.Addr // host-interaction address, DNAT'ed to the guest
	VethHost netip.Addr // host end of the veth (/31)
	VethPeer netip.Addr // slot end of the veth (/31)
}

func addrsFor(c *Config, index int) slotAddrs {
	return slotAddrs{
		HostIP:   addOffset(c.HostCIDR.Addr(), uint32(index)),
		VethHost: addOffset(c.VethCIDR.Addr(), uint32(2*index)),
		VethPeer: addOffset(c.VethCIDR.Addr(), uint32(2*index+1)),
	}
}

func addOffset(a netip.Addr, off uint32) netip.Addr {
	b := a.As4()
	v := binary.BigEndian.Uint32(b[:]) + off
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}
}
