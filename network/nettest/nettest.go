// Package nettest builds disposable network worlds for the tests and
// benchmarks of package network: a namespace that plays the host, and one
// that plays the internet (TEST-NET addresses, a DNS server), joined by a
// veth. Nothing it creates touches the machine's own namespace except
// bind mounts under /run/netns, all named with a per-test prefix.
package nettest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/network"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"
)

// TB is the part of testing.TB the helpers use.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
	Logf(format string, args ...any)
}

// RequireRoot skips t unless the process can create namespaces.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		t.Skip("no network namespace support")
	}
}

// Prefix returns a fresh manager prefix ("t" + 5 hex digits), unique enough
// that parallel test processes never share one.
func Prefix() string {
	var b [3]byte
	rand.Read(b[:])
	return "t" + hex.EncodeToString(b[:])[:5]
}

// Addresses of the fake internet.
var (
	HostUplink  = netip.MustParseAddr("198.18.0.1") // host end of the uplink
	WorldUplink = netip.MustParseAddr("198.18.0.2")
	TestNet1    = netip.MustParseAddr("192.0.2.10")    // TEST-NET-1
	TestNet2    = netip.MustParseAddr("198.51.100.10") // TEST-NET-2
	TestNet3    = netip.MustParseAddr("203.0.113.10")  // TEST-NET-3
	// Private is a private address in the world: always denied.
	Private = netip.MustParseAddr("192.168.77.10")
	// DNS is the world's DNS server.
	DNS = netip.MustParseAddr("198.51.100.53")
	// Special is a special-purpose address (IETF protocol assignments,
	// RFC 6890) in the world: always denied.
	Special = netip.MustParseAddr("192.0.0.9")
	// LANHost and LANNode are the two ends of the link AddLAN creates.
	LANNode = netip.MustParseAddr("198.18.1.1")
	LANHost = netip.MustParseAddr("198.18.1.2")
)

// worldRanges are the special-purpose ranges the fake internet is built
// from; a manager in the world must let guests reach them.
var worldRanges = []netip.Addr{TestNet1, TestNet2, TestNet3, DNS, HostUplink}

// AlwaysDenied is network.DefaultAlwaysDenied without the ranges the fake
// internet lives in (TEST-NETs, the benchmarking range of the uplink).
func AlwaysDenied() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range network.DefaultAlwaysDenied {
		keep := true
		for _, a := range worldRanges {
			if p.Contains(a) {
				keep = false
			}
		}
		if keep {
			out = append(out, p)
		}
	}
	return out
}

// World is a host namespace and an internet namespace.
type World struct {
	Prefix   string
	HostNS   string // path: pass as network.Config.HostNetNS
	WorldNS  string // path
	hostName string
	wldName  string

	mu      sync.Mutex
	records map[string]netip.Addr
}

// NewWorld creates the two namespaces, the uplink and routes; t.Cleanup
// removes them.
func NewWorld(t TB, prefix string) *World {
	t.Helper()
	w := &World{Prefix: prefix, hostName: prefix + "-host", wldName: prefix + "-world", records: map[string]netip.Addr{}}
	w.HostNS, w.WorldNS = network.NetNSPath(w.hostName), network.NetNSPath(w.wldName)
	for _, n := range []string{w.hostName, w.wldName} {
		if err := network.CreateNamedNetNS(n); err != nil {
			t.Fatalf("create netns %s: %v", n, err)
		}
		t.Cleanup(func() { network.DeleteNamedNetNS(n) })
	}
	if err := w.wire(); err != nil {
		t.Fatalf("wire world %s: %v", prefix, err)
	}
	return w
}

func (w *World) wire() error {
	wns, err := netns.GetFromPath(w.WorldNS)
	if err != nil {
		return err
	}
	defer wns.Close()
	err = network.RunInNetNS(w.HostNS, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"},
			PeerName: "up0", PeerNamespace: netlink.NsFd(int(wns))}); err != nil {
			return fmt.Errorf("uplink veth: %w", err)
		}
		return configure("up0", []netip.Prefix{netip.PrefixFrom(HostUplink, 30)}, WorldUplink)
	})
	if err != nil {
		return err
	}
	return network.RunInNetNS(w.WorldNS, func() error {
		var ps []netip.Prefix
		ps = append(ps, netip.PrefixFrom(WorldUplink, 30))
		for _, a := range []netip.Addr{TestNet1, TestNet2, TestNet3, Private, DNS, Special} {
			ps = append(ps, netip.PrefixFrom(a, 32))
		}
		return configure("up0", ps, HostUplink)
	})
}

// configure sets addresses on link, brings it and lo up and adds a default
// route via gw, in the current thread's namespace.
func configure(link string, addrs []netip.Prefix, gw netip.Addr) error {
	for _, n := range []string{"lo", link} {
		l, err := netlink.LinkByName(n)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
	}
	l, err := netlink.LinkByName(link)
	if err != nil {
		return err
	}
	for _, p := range addrs {
		ipn := &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipn}); err != nil {
			return fmt.Errorf("address %s: %w", p, err)
		}
	}
	return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()})
}

// Config returns a network.Config for a manager living in this world.
func (w *World) Config() network.Config {
	return network.Config{
		Prefix: w.Prefix, HostNetNS: w.HostNS,
		DNSUpstream: netip.AddrPortFrom(DNS, 53), AlwaysDenied: AlwaysDenied(),
	}
}

// AddLAN creates a namespace "<prefix>-lan" that plays a neighbour on the
// host's LAN: linked to the host namespace (LANHost here, LANNode on the
// host) with routes for routed (the slot ranges) through the host, as an
// attacker on the same network would set up. It returns its path;
// t.Cleanup removes it.
func (w *World) AddLAN(t TB, routed ...netip.Prefix) string {
	t.Helper()
	name := w.Prefix + "-lan"
	if err := network.CreateNamedNetNS(name); err != nil {
		t.Fatalf("create netns %s: %v", name, err)
	}
	t.Cleanup(func() { network.DeleteNamedNetNS(name) })
	path := network.NetNSPath(name)
	lns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatalf("open netns %s: %v", name, err)
	}
	defer lns.Close()
	err = network.RunInNetNS(w.HostNS, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lan0"},
			PeerName: "lan0", PeerNamespace: netlink.NsFd(int(lns))}); err != nil {
			return fmt.Errorf("lan veth: %w", err)
		}
		l, err := netlink.LinkByName("lan0")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: LANNode.AsSlice(), Mask: net.CIDRMask(30, 32)}}); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		t.Fatalf("wire lan: %v", err)
	}
	err = network.RunInNetNS(path, func() error {
		if err := configure("lan0", []netip.Prefix{netip.PrefixFrom(LANHost, 30)}, LANNode); err != nil {
			return err
		}
		l, err := netlink.LinkByName("lan0")
		if err != nil {
			return err
		}
		for _, p := range routed {
			r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)},
				Gw: LANNode.AsSlice()}
			if err := netlink.RouteReplace(r); err != nil {
				return fmt.Errorf("route %s: %w", p, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("configure lan: %v", err)
	}
	return path
}

// Listen opens a TCP listener at addr inside the namespace at nsPath.
func Listen(t TB, nsPath string, addr netip.AddrPort) net.Listener {
	t.Helper()
	var l net.Listener
	err := network.RunInNetNS(nsPath, func() error {
		var err error
		l, err = net.Listen("tcp4", addr.String())
		return err
	})
	if err != nil {
		t.Fatalf("listen %s in %s: %v", addr, nsPath, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// ServeHello answers every connection on l with "hello <tag> <peer>\n"
// (peer is the client's address as seen here), then echoes what it gets.
func ServeHello(l net.Listener, tag string) {
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				fmt.Fprintf(c, "hello %s %s\n", tag, c.RemoteAddr())
				io.Copy(c, c)
			}()
		}
	}()
}

// ServeWorld listens on port in the world at each TEST-NET and private
// address, each answering with its own address as tag.
func (w *World) ServeWorld(t TB, port uint16) {
	t.Helper()
	for _, a := range []netip.Addr{TestNet1, TestNet2, TestNet3, Private, Special} {
		ServeHello(Listen(t, w.WorldNS, netip.AddrPortFrom(a, port)), a.String())
	}
}

// Hello dials addr from the namespace at nsPath and returns the greeting
// line ("hello <tag> <peer>"), or an error if the connection fails.
// Slot addresses answer only the manager's dialers: use HelloVia for them.
func Hello(ctx context.Context, nsPath string, addr netip.AddrPort) (string, error) {
	return HelloVia(ctx, func(ctx context.Context) (net.Conn, error) {
		return DialIn(ctx, nsPath, "tcp4", addr.String())
	})
}

// HelloVia is Hello over a connection dial opens (Slot.DialGuest,
// Manager.DialContext).
func HelloVia(ctx context.Context, dial func(context.Context) (net.Conn, error)) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := dial(ctx)
	if err != nil {
		return "", err
	}
	addr := c.RemoteAddr()
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 128)
	n, err := c.Read(buf)
	if err != nil {
		return "", fmt.Errorf("read greeting from %s: %w", addr, err)
	}
	return strings.TrimSpace(string(buf[:n])), nil
}

// Blocked reports whether a TCP connection from the namespace at nsPath to
// addr fails (refused, or no answer within a short time: inside
// namespaces an answer takes microseconds).
func Blocked(ctx context.Context, nsPath string, addr netip.AddrPort) bool {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	c, err := DialIn(ctx, nsPath, "tcp4", addr.String())
	if err != nil {
		return true
	}
	c.Close()
	return false
}

// Reachable reports whether a TCP connection from the namespace at nsPath
// to addr succeeds, allowing a loaded machine a few seconds.
func Reachable(ctx context.Context, nsPath string, addr netip.AddrPort) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := DialIn(ctx, nsPath, "tcp4", addr.String())
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// DialIn dials from the namespace at nsPath.
func DialIn(ctx context.Context, nsPath, network_, addr string) (net.Conn, error) {
	var c net.Conn
	err := network.RunInNetNS(nsPath, func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network_, addr)
		return err
	})
	return c, err
}

// ---- DNS ----

// SetRecord makes the world's DNS server answer name with an A record.
func (w *World) SetRecord(name string, a netip.Addr) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.records[strings.ToLower(strings.TrimSuffix(name, "."))] = a
}

// ServeDNS starts the world's DNS server (UDP and TCP) at DNS:53.
func (w *World) ServeDNS(t TB) {
	t.Helper()
	var pc net.PacketConn
	var l net.Listener
	err := network.RunInNetNS(w.WorldNS, func() error {
		var err error
		if pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(DNS, 53).String()); err != nil {
			return err
		}
		l, err = net.Listen("tcp4", netip.AddrPortFrom(DNS, 53).String())
		return err
	})
	if err != nil {
		t.Fatalf("listen dns in world: %v", err)
	}
	t.Cleanup(func() { pc.Close(); l.Close() })
	go w.serveDNSTCP(l)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if resp, err := w.answer(buf[:n]); err == nil {
				pc.WriteTo(resp, from)
			}
		}
	}()
}

func (w *World) serveDNSTCP(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			q, err := readMsg(c)
			if err != nil {
				return
			}
			if resp, err := w.answer(q); err == nil {
				writeMsg(c, resp)
			}
		}()
	}
}

func readMsg(r io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	msg := make([]byte, int(l[0])<<8|int(l[1]))
	_, err := io.ReadFull(r, msg)
	return msg, err
}

func writeMsg(w io.Writer, msg []byte) error {
	_, err := w.Write(append([]byte{byte(len(msg) >> 8), byte(len(msg))}, msg...))
	return err
}

func (w *World) answer(q []byte) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil, err
	}
	question, err := p.Question()
	if err != nil {
		return nil, err
	}
	name := strings.ToLower(strings.TrimSuffix(question.Name.String(), "."))
	w.mu.Lock()
	a, ok := w.records[name]
	w.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	if !ok {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(question); err != nil {
		return nil, err
	}
	if ok && question.Type == dnsmessage.TypeA {
		if err := b.StartAnswers(); err != nil {
			return nil, err
		}
		rr := dnsmessage.ResourceHeader{Name: question.Name, Class: dnsmessage.ClassINET, TTL: 300}
		if err := b.AResource(rr, dnsmessage.AResource{A: a.As4()}); err != nil {
			return nil, err
		}
	}
	return b.Finish()
}

// Resolve asks the DNS server at server for name's A record over UDP, from
// the namespace at nsPath. It returns the address or an error naming the
// rcode.
func Resolve(ctx context.Context, nsPath string, server netip.AddrPort, name string) (netip.Addr, error) {
	return ResolveOver(ctx, "udp4", nsPath, server, name)
}

// ResolveOver is Resolve over "udp4" or "tcp4".
func ResolveOver(ctx context.Context, network_, nsPath string, server netip.AddrPort, name string) (netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := DialIn(ctx, nsPath, network_, server.String())
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	n, err := dnsmessage.NewName(strings.TrimSuffix(name, ".") + ".")
	if err != nil {
		return netip.Addr{}, err
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 0x4242, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: n, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	q, err := b.Finish()
	if err != nil {
		return netip.Addr{}, err
	}
	var resp []byte
	if network_ == "tcp4" {
		if err := writeMsg(c, q); err != nil {
			return netip.Addr{}, err
		}
		resp, err = readMsg(c)
	} else {
		if _, err := c.Write(q); err != nil {
			return netip.Addr{}, err
		}
		buf := make([]byte, 4096)
		var m int
		m, err = c.Read(buf)
		resp = buf[:m]
	}
	if err != nil {
		return netip.Addr{}, err
	}
	var p dnsmessage.Parser
	h, err := p.Start(resp)
	if err != nil {
		return netip.Addr{}, err
	}
	if h.RCode != dnsmessage.RCodeSuccess {
		return netip.Addr{}, fmt.Errorf("resolve %s: %s", name, h.RCode)
	}
	p.SkipAllQuestions()
	for {
		ah, err := p.AnswerHeader()
		if err != nil {
			return netip.Addr{}, fmt.Errorf("resolve %s: no A record", name)
		}
		if ah.Type != dnsmessage.TypeA {
			p.SkipAnswer()
			continue
		}
		r, err := p.AResource()
		if err != nil {
			return netip.Addr{}, err
		}
		return netip.AddrFrom4(r.A), nil
	}
}

// Leftovers lists what of prefix remains: namespaces under /run/netns,
// links "<prefix>v*" and nft tables named prefix in the host namespace at
// hostNS ("" for the process's own).
func Leftovers(prefix, hostNS string) ([]string, error) {
	var out []string
	entries, err := os.ReadDir(network.NetNSDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix+"-") && e.Name() != prefix+"-host" && e.Name() != prefix+"-world" && e.Name() != prefix+"-lan" {
			out = append(out, "netns "+e.Name())
		}
	}
	err = network.RunInNetNS(hostNS, func() error {
		links, err := netlink.LinkList()
		for i := 0; errors.Is(err, netlink.ErrDumpInterrupted) && i < 30; i++ {
			links, err = netlink.LinkList() // links of other slots came and went meanwhile
		}
		if err != nil {
			return err
		}
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, prefix+"v") {
				out = append(out, "link "+l.Attrs().Name)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	tables, err := listTables(hostNS)
	if err != nil {
		return nil, err
	}
	for _, t := range tables {
		if t == prefix {
			out = append(out, "nft table "+t)
		}
	}
	return out, nil
}
