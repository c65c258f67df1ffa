package network_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/network/nettest"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"
)

// TestOpenTapCarriesGuestFrames plays the VM at the Ethernet level on the
// file OpenTap returns: it sends a DNS query frame from the guest address,
// answers the slot's ARP request for the guest, and expects the DNS answer
// frame back, resolved through the slot's resolver and the world's server.
func TestOpenTapCarriesGuestFrames(t *testing.T) {
	t.Parallel()
	m, w := newManager(t, nil)
	w.ServeDNS(t)
	w.SetRecord("tap.test", nettest.TestNet1)
	s := acquire(t, m)
	tap, err := s.OpenTap()
	if err != nil {
		t.Fatalf("OpenTap: %v", err)
	}
	defer tap.Close()
	fd := int(tap.Fd())

	var gwMAC net.HardwareAddr
	err = network.RunInNetNS(s.NetNSPath(), func() error {
		l, err := netlink.LinkByName(network.TapName)
		if err == nil {
			gwMAC = l.Attrs().HardwareAddr
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if gwMAC.String() != network.GatewayMAC.String() {
		t.Fatalf("tap MAC %s, want the fixed gateway MAC %s", gwMAC, network.GatewayMAC)
	}
	guestMAC := network.Guest().MAC
	query := dnsQuery(t, "tap.test")
	frame := ethFrame(gwMAC, guestMAC, 0x0800, ipv4UDP(network.GuestIP, network.GatewayIP, 40000, 53, query))
	if _, err := unix.Write(fd, append(make([]byte, vnetHdrLen), frame...)); err != nil {
		t.Fatalf("write frame to tap: %v", err)
	}

	deadline := time.Now().Add(5 * time.Second)
	buf := make([]byte, 65536)
	for time.Now().Before(deadline) {
		n := readFrame(t, fd, buf)
		if n < vnetHdrLen+14 {
			continue
		}
		eth := buf[vnetHdrLen:n]
		switch binary.BigEndian.Uint16(eth[12:14]) {
		case 0x0806: // ARP: the slot looks for the guest before answering
			if reply := arpReply(eth, guestMAC, network.GuestIP); reply != nil {
				unix.Write(fd, append(make([]byte, vnetHdrLen), reply...))
			}
		case 0x0800:
			if a, ok := dnsAnswerIn(eth[14:]); ok {
				if a != nettest.TestNet1 {
					t.Fatalf("DNS over the tap answered %s, want %s", a, nettest.TestNet1)
				}
				return
			}
		}
	}
	t.Fatalf("no DNS answer frame on the tap")
}

const vnetHdrLen = 10 // struct virtio_net_hdr, IFF_VNET_HDR's default

func readFrame(t *testing.T, fd int, buf []byte) int {
	t.Helper()
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if n, err := unix.Poll(pfd, 200); err != nil || n == 0 {
		return 0
	}
	n, err := unix.Read(fd, buf)
	if err != nil {
		t.Fatalf("read tap: %v", err)
	}
	return n
}

func dnsQuery(t *testing.T, name string) []byte {
	n := dnsmessage.MustNewName(name + ".")
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: n, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	q, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func ethFrame(dst, src net.HardwareAddr, typ uint16, payload []byte) []byte {
	f := append(append(append([]byte(nil), dst...), src...), byte(typ>>8), byte(typ))
	return append(f, payload...)
}

func ipv4UDP(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	ip := make([]byte, 20, 28+len(payload))
	ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[2:], uint16(28+len(payload)))
	s4, d4 := src.As4(), dst.As4()
	copy(ip[12:], s4[:])
	copy(ip[16:], d4[:])
	binary.BigEndian.PutUint16(ip[10:], checksum(ip))
	udp := binary.BigEndian.AppendUint16(nil, sport)
	udp = binary.BigEndian.AppendUint16(udp, dport)
	udp = binary.BigEndian.AppendUint16(udp, uint16(8+len(payload)))
	udp = append(udp, 0, 0) // no UDP checksum (allowed for IPv4)
	return append(append(ip, udp...), payload...)
}

func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// arpReply answers an ARP request for ip with mac; nil if eth is not one.
func arpReply(eth []byte, mac net.HardwareAddr, ip netip.Addr) []byte {
	arp := eth[14:]
	ip4 := ip.As4()
	if len(arp) < 28 || binary.BigEndian.Uint16(arp[6:]) != 1 || !bytes.Equal(arp[24:28], ip4[:]) {
		return nil
	}
	reply := append([]byte(nil), arp[:28]...)
	binary.BigEndian.PutUint16(reply[6:], 2)
	copy(reply[8:14], mac)
	copy(reply[14:18], ip4[:])
	copy(reply[18:24], arp[8:14])  // requester's MAC
	copy(reply[24:28], arp[14:18]) // requester's IP
	return ethFrame(net.HardwareAddr(arp[8:14]), mac, 0x0806, reply)
}

// dnsAnswerIn returns the A record of a DNS answer carried in the IPv4/UDP
// packet ip.
func dnsAnswerIn(ip []byte) (netip.Addr, bool) {
	if len(ip) < 28 || ip[9] != unix.IPPROTO_UDP {
		return netip.Addr{}, false
	}
	hl := int(ip[0]&0x0f) * 4
	if len(ip) < hl+8 || binary.BigEndian.Uint16(ip[hl:]) != 53 {
		return netip.Addr{}, false
	}
	var p dnsmessage.Parser
	if _, err := p.Start(ip[hl+8:]); err != nil {
		return netip.Addr{}, false
	}
	p.SkipAllQuestions()
	for {
		h, err := p.AnswerHeader()
		if err != nil {
			return netip.Addr{}, false
		}
		if h.Type != dnsmessage.TypeA {
			p.SkipAnswer()
			continue
		}
		r, err := p.AResource()
		if err != nil {
			return netip.Addr{}, false
		}
		return netip.AddrFrom4(r.A), true
	}
}

// TestOpenTapBusyNamesTheHolder: a slot's tap attached twice fails with
// EBUSY, and the error names the one descriptor attached to this slot's
// tap (this process's), not another slot's tap of the same name.
func TestOpenTapBusyNamesTheHolder(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, nil)
	a, b := acquire(t, m), acquire(t, m)
	tapA, err := a.OpenTap()
	if err != nil {
		t.Fatalf("OpenTap %s: %v", a.Name, err)
	}
	defer tapA.Close()
	tapB, err := b.OpenTap()
	if err != nil {
		t.Fatalf("OpenTap %s: %v", b.Name, err)
	}
	defer tapB.Close()
	_, err = a.OpenTap()
	if !errors.Is(err, unix.EBUSY) {
		t.Fatalf("second OpenTap of %s: %v, want EBUSY", a.Name, err)
	}
	want := fmt.Sprintf("%d (%s, fd %d,", os.Getpid(), selfComm(t), tapA.Fd())
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name the holder %q", err, want)
	}
	if other := fmt.Sprintf("fd %d,", tapB.Fd()); strings.Contains(err.Error(), other) {
		t.Fatalf("error %q names the other slot's tap (%s)", err, other)
	}
}

func selfComm(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
