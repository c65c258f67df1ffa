package network_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/network/nettest"
	"github.com/vishvananda/netlink"
)

const dialHelperEnv = "AENV_NETTEST_DIAL_ADDR"

// TestDialHelper is the unprivileged local user of TestOnlyManagerReachesSlots:
// it dials the address in its environment and prints CONNECTED or FAILED.
func TestDialHelper(t *testing.T) {
	addr := os.Getenv(dialHelperEnv)
	if addr == "" {
		t.Skip("helper process of TestOnlyManagerReachesSlots")
	}
	c, err := net.DialTimeout("tcp4", addr, time.Second)
	if err != nil {
		fmt.Println("FAILED", err)
		return
	}
	c.Close()
	fmt.Println("CONNECTED uid", os.Getuid())
}

// dialAsNobody runs TestDialHelper as uid/gid 65534 inside the namespace at
// nsPath and returns its verdict line.
func dialAsNobody(t *testing.T, nsPath string, addr netip.AddrPort) string {
	t.Helper()
	// The test binary sits in a private build directory: give the
	// unprivileged user a copy it can execute.
	dir, err := os.MkdirTemp("", "aenv-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "helper.test")
	if err := copyFile(os.Args[0], bin); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestDialHelper$", "-test.count=1")
	cmd.Dir = dir
	cmd.Env = []string{dialHelperEnv + "=" + addr.String(), "HOME=/", "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	// Started from a thread inside the namespace, the child lives there.
	if err := network.RunInNetNS(nsPath, cmd.Start); err != nil {
		t.Fatalf("start helper: %v", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v\n%s", err, out.String())
	}
	for l := range strings.Lines(out.String()) {
		if strings.HasPrefix(l, "CONNECTED") || strings.HasPrefix(l, "FAILED") {
			return strings.TrimSpace(l)
		}
	}
	t.Fatalf("helper printed no verdict:\n%s", out.String())
	return ""
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// TestOnlyManagerReachesSlots: the slot addresses answer the manager's own
// dialer only: not an unprivileged local user, not another root process
// without the socket mark, not a LAN neighbour routing the slot ranges
// through the node.
func TestOnlyManagerReachesSlots(t *testing.T) {
	t.Parallel()
	var cfg network.Config
	m, w := newManager(t, func(c *network.Config) { c.GuestNetNS = true; cfg = *c })
	s := acquire(t, m)
	var mu sync.Mutex
	accepted := 0
	l := nettest.Listen(t, s.GuestNetNSPath(), guestAddr(8080))
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted++
			mu.Unlock()
			c.Close()
		}
	}()
	ctx := t.Context()
	hostCIDR, vethCIDR := netip.MustParsePrefix("10.11.0.0/16"), netip.MustParsePrefix("10.12.0.0/16")
	if cfg.HostCIDR.IsValid() {
		hostCIDR, vethCIDR = cfg.HostCIDR, cfg.VethCIDR
	}
	lan := w.AddLAN(t, hostCIDR, vethCIDR)

	t.Run("the manager's dialers connect", func(t *testing.T) {
		c, err := s.DialGuest(ctx, "tcp", 8080)
		if err != nil {
			t.Fatalf("DialGuest: %v", err)
		}
		c.Close()
		c, err = m.DialContext(ctx, "tcp", s.GuestAddr(8080).String())
		if err != nil {
			t.Fatalf("Manager.DialContext: %v", err)
		}
		c.Close()
	})
	t.Run("an unprivileged local user does not", func(t *testing.T) {
		if got := dialAsNobody(t, w.HostNS, s.GuestAddr(8080)); !strings.HasPrefix(got, "FAILED") {
			t.Fatalf("uid 65534 dialling %s: %s", s.GuestAddr(8080), got)
		}
	})
	t.Run("another host process without the mark does not", func(t *testing.T) {
		if !nettest.Blocked(ctx, w.HostNS, s.GuestAddr(8080)) {
			t.Fatalf("a plain socket in the host namespace reached the guest")
		}
	})
	t.Run("a LAN neighbour routing the slot ranges through the node does not", func(t *testing.T) {
		for _, a := range []netip.AddrPort{s.GuestAddr(8080), netip.AddrPortFrom(s.VethPeerIP, 8080),
			netip.AddrPortFrom(network.GuestIP, 8080)} {
			if !nettest.Blocked(ctx, lan, a) {
				t.Errorf("LAN host reached %s", a)
			}
		}
		// The LAN itself works, so the checks fail for the right reason.
		nettest.ServeHello(nettest.Listen(t, w.HostNS, netip.AddrPortFrom(nettest.LANNode, 2222)), "node")
		if _, err := nettest.Hello(ctx, lan, netip.AddrPortFrom(nettest.LANNode, 2222)); err != nil {
			t.Fatalf("LAN host cannot reach the node at all: %v", err)
		}
	})
	mu.Lock()
	defer mu.Unlock()
	if accepted != 2 {
		t.Errorf("guest accepted %d connections, want the manager's 2", accepted)
	}
}

// TestAntiSpoofing: a guest sending with another slot's address (or any
// address but its own) gets nothing out of its slot.
func TestAntiSpoofing(t *testing.T) {
	t.Parallel()
	m, w := newManager(t, func(c *network.Config) { c.GuestNetNS = true })
	a, b := acquire(t, m), acquire(t, m)
	// The world counts datagrams by payload.
	var pc net.PacketConn
	err := network.RunInNetNS(w.WorldNS, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(nettest.TestNet1, 9999).String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	got := make(chan string, 16)
	go func() {
		buf := make([]byte, 512)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			got <- string(buf[:n])
		}
	}()
	spoofed := []netip.Addr{b.HostIP, b.VethPeerIP, netip.MustParseAddr("198.51.100.77")}
	err = network.RunInNetNS(a.GuestNetNSPath(), func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, ip := range spoofed {
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("add the spoofed addresses to guest A: %v", err)
	}
	send := func(from netip.Addr, payload string) {
		t.Helper()
		err := network.RunInNetNS(a.GuestNetNSPath(), func() error {
			c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(from, 0)),
				net.UDPAddrFromAddrPort(netip.AddrPortFrom(nettest.TestNet1, 9999)))
			if err != nil {
				return err
			}
			defer c.Close()
			for range 3 {
				if _, err := c.Write([]byte(payload)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("send from %s: %v", from, err)
		}
	}
	for _, ip := range spoofed {
		send(ip, "spoofed "+ip.String())
	}
	send(network.GuestIP, "legit")
	deadline := time.After(2 * time.Second)
	for {
		select {
		case p := <-got:
			if p != "legit" {
				t.Fatalf("the world received a spoofed datagram: %q", p)
			}
			// Spoofed ones were sent first: give stragglers a moment.
			time.Sleep(200 * time.Millisecond)
			select {
			case p := <-got:
				if p != "legit" {
					t.Fatalf("the world received a spoofed datagram: %q", p)
				}
			default:
			}
			checkRPFilter(t, a.NetNSPath(), "all", network.TapName)
			checkRPFilter(t, w.HostNS, a.HostVeth)
			return
		case <-deadline:
			t.Fatalf("not even the guest's own datagram arrived")
		}
	}
}

func checkRPFilter(t *testing.T, nsPath string, devs ...string) {
	t.Helper()
	err := network.RunInNetNS(nsPath, func() error {
		for _, dev := range devs {
			b, err := os.ReadFile("/proc/sys/net/ipv4/conf/" + dev + "/rp_filter")
			if err != nil {
				return err
			}
			if strings.TrimSpace(string(b)) != "1" {
				return fmt.Errorf("rp_filter of %s is %s, want 1 (strict)", dev, strings.TrimSpace(string(b)))
			}
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// TestSpecialPurposeDenied: the special-purpose ranges and the host's own
// addresses stay closed whatever the policy allows.
func TestSpecialPurposeDenied(t *testing.T) {
	t.Parallel()
	m, w := newManager(t, func(c *network.Config) { c.GuestNetNS = true })
	w.ServeWorld(t, 80)
	nettest.ServeHello(nettest.Listen(t, w.HostNS, netip.AddrPortFrom(nettest.HostUplink, 80)), "host")
	s := acquire(t, m)
	ctx := t.Context()
	if err := s.SetPolicy(ctx, network.Policy{AllowOut: []string{"0.0.0.0/0", "192.0.0.0/24", nettest.HostUplink.String()}}); err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{nettest.Special, nettest.HostUplink, nettest.Private} {
		if !nettest.Blocked(ctx, s.GuestNetNSPath(), netip.AddrPortFrom(a, 80)) {
			t.Errorf("guest reached %s", a)
		}
	}
	if !nettest.Reachable(ctx, s.GuestNetNSPath(), netip.AddrPortFrom(nettest.TestNet1, 80)) {
		t.Errorf("guest cannot reach the world at all")
	}
}

func TestDefaultAlwaysDeniedIsTheSpecialPurposeList(t *testing.T) {
	t.Parallel()
	want := []string{"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
		"192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24",
		"203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4", "255.255.255.255/32",
		"::1/128", "::/128", "::ffff:0:0/96", "64:ff9b::/96", "100::/64", "2001::/23", "2001:db8::/32",
		"fc00::/7", "fe80::/10", "ff00::/8"}
	for _, w := range want {
		p := netip.MustParsePrefix(w)
		covered := false
		for _, d := range network.DefaultAlwaysDenied {
			if d.Bits() <= p.Bits() && d.Contains(p.Addr()) {
				covered = true
			}
		}
		if !covered {
			t.Errorf("DefaultAlwaysDenied does not cover %s", p)
		}
	}
}

// TestPolicyTighteningCutsConnections: connections open to a destination
// the new policy denies stop working; the others go on.
func TestPolicyTighteningCutsConnections(t *testing.T) {
	t.Parallel()
	m, w := newManager(t, func(c *network.Config) { c.GuestNetNS = true })
	w.ServeWorld(t, 80)
	s := acquire(t, m)
	ctx := t.Context()
	open := func(a netip.Addr) (net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := nettest.DialIn(ctx, s.GuestNetNSPath(), "tcp4", netip.AddrPortFrom(a, 80).String())
		if err != nil {
			t.Fatalf("dial %s: %v", a, err)
		}
		t.Cleanup(func() { c.Close() })
		r := bufio.NewReader(c)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatalf("greeting of %s: %v", a, err)
		}
		return c, r
	}
	echo := func(c net.Conn, r *bufio.Reader) error {
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return err
		}
		line, err := r.ReadString('\n')
		if err == nil && line != "ping\n" {
			err = fmt.Errorf("echo %q", line)
		}
		return err
	}
	kc, kr := open(nettest.TestNet1)
	cc, cr := open(nettest.TestNet2)
	if err := s.SetPolicy(ctx, network.Policy{DenyOut: []string{nettest.TestNet2.String() + "/32"}}); err != nil {
		t.Fatal(err)
	}
	if err := echo(kc, kr); err != nil {
		t.Errorf("connection to the still allowed %s broke: %v", nettest.TestNet1, err)
	}
	if err := echo(cc, cr); err == nil {
		t.Errorf("connection to the now denied %s still works", nettest.TestNet2)
	}
	// Denying the internet cuts the rest.
	if err := s.SetPolicy(ctx, network.Policy{DenyInternet: true}); err != nil {
		t.Fatal(err)
	}
	if err := echo(kc, kr); err == nil {
		t.Errorf("connection to %s survives DenyInternet", nettest.TestNet1)
	}
}
