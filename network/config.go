package network

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"regexp"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Manager. The zero value plus defaults is a production
// node's configuration.
type Config struct {
	// Prefix names everything this manager creates: namespaces
	// "<prefix>-<index>", host veths "<prefix>v<index>", the nft table
	// "<prefix>". Lower-case letters and digits, 1 to 8 characters.
	// Two managers on one host must use prefixes where neither is a prefix
	// of the other (interface names are matched by prefix).
	Prefix string
	// HostNetNS is the path of the namespace that plays the host (veth host
	// ends, routes, masquerade). Empty means the process's own namespace.
	// Tests point it at a namespace they created.
	HostNetNS string
	// HostCIDR holds one host-interaction address per slot (default
	// 10.11.0.0/16).
	HostCIDR netip.Prefix
	// VethCIDR holds one /31 transit network per slot (default 10.12.0.0/16).
	VethCIDR netip.Prefix
	// AlwaysDenied are destinations no policy can open (default
	// DefaultAlwaysDenied). The host namespace's own addresses at New are
	// always added. IPv6 entries are accepted and ignored while guests
	// only have IPv4.
	AlwaysDenied []netip.Prefix
	// SocketMark (default DefaultSocketMark) marks the sockets of DialGuest
	// and DialContext: the host's rules let only packets with this mark
	// reach slot addresses, so no other local process (and no unprivileged
	// user, who cannot set marks) gets to a guest. Pick a value no policy
	// routing rule of the host uses.
	SocketMark uint32
	// DNSUpstream is where the slots' resolvers forward queries, dialled from
	// the host namespace. Zero means the first nameserver of /etc/resolv.conf.
	DNSUpstream netip.AddrPort
	// PoolLow and PoolHigh are the warm pool's watermarks: the worker refills
	// the pool up to PoolLow; released slots above PoolHigh are destroyed.
	// Both zero disables the pool.
	PoolLow, PoolHigh int
	// GuestNetNS replaces each slot's tap with a veth named like the tap
	// whose other end is eth0 of a namespace "<prefix>-<index>g" configured
	// with the guest address. Processes in that namespace then play the VM
	// (tests, container-like workloads); OpenTap is unavailable.
	GuestNetNS bool
	// Keep lists slot indexes a previous process left in use by VMs that
	// outlive it (the node server restarted while sandboxes ran): New's
	// cleanup spares them, Adopt takes one over, Forget destroys one that
	// cannot be, and Shutdown destroys those never adopted.
	Keep []int
	// Registerer receives the manager's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// DefaultAlwaysDenied are the ranges a guest never reaches: every block of
// the IANA IPv4 and IPv6 special-purpose address registries (RFC 6890 and
// its updates) that is not plain global unicast: "this" network, private
// (RFC 1918), CGNAT, loopback, link-local (cloud metadata), IETF protocol
// assignments, documentation, 6to4 relay, benchmarking, AS112, AMT,
// multicast, reserved and broadcast; for IPv6 the unspecified, loopback,
// IPv4-mapped and -translated, discard-only, IETF protocol assignments
// (Teredo, ORCHID, ...), documentation, 6to4, unique-local, link-local and
// multicast blocks. The host's own addresses are denied on top of these.
// Guests only have IPv4 today; the IPv6 blocks are kept so that the list
// is complete when they get it.
var DefaultAlwaysDenied = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("192.31.196.0/24"),
	netip.MustParsePrefix("192.52.193.0/24"),
	netip.MustParsePrefix("192.88.99.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("192.175.48.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"), // includes 255.255.255.255/32
	netip.MustParsePrefix("::/128"),
	netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("::ffff:0:0/96"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("100::/64"),
	netip.MustParsePrefix("2001::/23"),
	netip.MustParsePrefix("2001:db8::/32"),
	netip.MustParsePrefix("2002::/16"),
	netip.MustParsePrefix("3fff::/20"),
	netip.MustParsePrefix("5f00::/16"),
	netip.MustParsePrefix("fc00::/7"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("ff00::/8"),
}

// DefaultSocketMark is the socket mark (SO_MARK) of the manager's own
// connections to guests; see Config.SocketMark.
const DefaultSocketMark uint32 = 0x61650000

var prefixRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,7}$`)

func (c *Config) setDefaults() error {
	if c.Prefix == "" {
		c.Prefix = "aenv"
	}
	if !prefixRE.MatchString(c.Prefix) {
		return fmt.Errorf("network config: prefix %q: want [a-z][a-z0-9]{0,7}", c.Prefix)
	}
	if !c.HostCIDR.IsValid() {
		c.HostCIDR = netip.MustParsePrefix("10.11.0.0/16")
	}
	if !c.VethCIDR.IsValid() {
		c.VethCIDR = netip.MustParsePrefix("10.12.0.0/16")
	}
	c.HostCIDR, c.VethCIDR = c.HostCIDR.Masked(), c.VethCIDR.Masked()
	if !c.HostCIDR.Addr().Is4() || !c.VethCIDR.Addr().Is4() {
		return errors.New("network config: HostCIDR and VethCIDR must be IPv4")
	}
	if c.HostCIDR.Overlaps(c.VethCIDR) {
		return fmt.Errorf("network config: HostCIDR %s overlaps VethCIDR %s", c.HostCIDR, c.VethCIDR)
	}
	if c.HostCIDR.Bits() > 30 || c.VethCIDR.Bits() > 29 {
		return errors.New("network config: HostCIDR or VethCIDR too small")
	}
	if c.AlwaysDenied == nil {
		c.AlwaysDenied = DefaultAlwaysDenied
	}
	if c.SocketMark == 0 {
		c.SocketMark = DefaultSocketMark
	}
	if c.PoolLow < 0 || c.PoolHigh < c.PoolLow {
		return fmt.Errorf("network config: pool watermarks low=%d high=%d", c.PoolLow, c.PoolHigh)
	}
	if !c.DNSUpstream.IsValid() {
		c.DNSUpstream = resolvConfUpstream("/etc/resolv.conf")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// resolvConfUpstream returns the first IPv4 nameserver of path, or
// 127.0.0.53:53 (systemd-resolved) when there is none.
func resolvConfUpstream(path string) netip.AddrPort {
	fallback := netip.MustParseAddrPort("127.0.0.53:53")
	f, err := os.Open(path)
	if err != nil {
		return fallback
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		if a, err := netip.ParseAddr(fields[1]); err == nil && a.Is4() {
			return netip.AddrPortFrom(a, 53)
		}
	}
	return fallback
}

// maxSlots is how many slot indexes the CIDRs hold (index 0 is unused).
func (c *Config) maxSlots() int {
	host := 1<<(32-c.HostCIDR.Bits()) - 2
	veth := 1<<(32-c.VethCIDR.Bits())/2 - 1
	return min(host, veth, 99999)
}
