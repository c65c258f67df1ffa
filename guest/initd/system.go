package initd

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func configureSystem(log *slog.Logger, cl *Cmdline) error {
	host := cl.Hostname
	if host == "" {
		host = "sandbox"
	}
	if err := unix.Sethostname([]byte(host)); err != nil {
		return fmt.Errorf("set hostname %s: %w", host, err)
	}
	if err := linkUp("lo"); err != nil {
		return err
	}
	if cl.IP != nil {
		if err := configureIP(cl.IP); err != nil {
			return err
		}
		log.Info("network configured", "dev", cl.IP.Device, "addr", cl.IP.Address, "gw", cl.IP.Gateway)
	}
	if len(cl.DNS) > 0 {
		var b strings.Builder
		for _, ns := range cl.DNS {
			fmt.Fprintf(&b, "nameserver %s\n", ns)
		}
		// resolv.conf may be a dangling symlink in minimal images.
		_ = os.Remove("/etc/resolv.conf")
		if err := os.WriteFile("/etc/resolv.conf", []byte(b.String()), 0o644); err != nil {
			log.Warn("write resolv.conf", "err", err)
		}
	}
	return nil
}

func linkUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find link %s: %w", name, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("set link %s up: %w", name, err)
	}
	return nil
}

func configureIP(c *IPConfig) error {
	l, err := netlink.LinkByName(c.Device)
	if err != nil {
		return fmt.Errorf("configure %s: find link: %w", c.Device, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: c.Address.Addr().AsSlice(), Mask: net.CIDRMask(c.Address.Bits(), 32)}}
	if err := netlink.AddrReplace(l, addr); err != nil {
		return fmt.Errorf("configure %s: add address %s: %w", c.Device, c.Address, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("configure %s: set up: %w", c.Device, err)
	}
	if !c.Gateway.IsValid() {
		return nil
	}
	route := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: c.Gateway.AsSlice()}
	if err := netlink.RouteReplace(route); err != nil {
		return fmt.Errorf("configure %s: default route via %s: %w", c.Device, c.Gateway, err)
	}
	return nil
}
