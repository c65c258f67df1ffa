package network

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Cleanup removes everything a process with cfg's prefix may have left
// behind (after a crash): host veths "<prefix>v<n>", namespaces
// "<prefix>-<n>" and "<prefix>-<n>g", and the host nft table "<prefix>";
// the slots of cfg.Keep stay.
// Slot rules and taps live in the namespaces and go with them. It returns
// how many objects it removed. Never run it while another manager with
// the same prefix is alive.
func Cleanup(ctx context.Context, cfg Config) (int, error) {
	if err := cfg.setDefaults(); err != nil {
		return 0, err
	}
	var errs []error
	n, err := cleanupLinks(cfg)
	errs = append(errs, err)
	m, err := cleanupNamespaces(ctx, cfg.Prefix, cfg.Keep)
	errs = append(errs, err)
	removedTable, err := cleanupHostTable(cfg)
	errs = append(errs, err)
	if removedTable {
		n++
	}
	return n + m, errors.Join(errs...)
}

func cleanupLinks(cfg Config) (int, error) {
	ns := netns.None()
	if cfg.HostNetNS != "" {
		h, err := netns.GetFromPath(cfg.HostNetNS)
		if err != nil {
			return 0, fmt.Errorf("cleanup: open host netns: %w", err)
		}
		defer h.Close()
		ns = h
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return 0, fmt.Errorf("cleanup: netlink: %w", err)
	}
	defer h.Close()
	links, err := retryDump(h.LinkList)
	if err != nil {
		return 0, fmt.Errorf("cleanup: list links: %w", err)
	}
	n := 0
	var errs []error
	for _, l := range links {
		name := l.Attrs().Name
		if !isSlotVeth(cfg.Prefix, name) || kept(cfg.Keep, strings.TrimPrefix(name, cfg.Prefix+"v")) {
			continue
		}
		if err := h.LinkDel(l); err != nil {
			// A veth goes with its peer: a slot namespace dying meanwhile
			// (its last holder, a killed VMM, exiting) takes the host end
			// along between the list and the delete.
			if !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("cleanup: delete %s: %w", l.Attrs().Name, err))
			}
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// kept reports whether the decimal index is in keep.
func kept(keep []int, index string) bool {
	i, err := strconv.Atoi(index)
	return err == nil && slices.Contains(keep, i)
}

func cleanupNamespaces(ctx context.Context, prefix string, keep []int) (int, error) {
	entries, err := os.ReadDir(NetNSDir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("cleanup: list %s: %w", NetNSDir, err)
	}
	re := regexp.MustCompile("^" + prefix + `-[0-9]+g?$`)
	n := 0
	var errs []error
	for _, e := range entries {
		if ctx.Err() != nil {
			return n, ctx.Err()
		}
		if !re.MatchString(e.Name()) || kept(keep, strings.TrimSuffix(strings.TrimPrefix(e.Name(), prefix+"-"), "g")) {
			continue
		}
		if err := deleteNamedNS(e.Name()); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

func cleanupHostTable(cfg Config) (bool, error) {
	m := &Manager{cfg: cfg, hostNS: -1}
	if cfg.HostNetNS != "" {
		h, err := netns.GetFromPath(cfg.HostNetNS)
		if err != nil {
			return false, fmt.Errorf("cleanup: open host netns: %w", err)
		}
		defer h.Close()
		m.hostNS = h
	}
	c, err := m.hostNFT()
	if err != nil {
		return false, fmt.Errorf("cleanup: %w", err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return false, fmt.Errorf("cleanup: list nft tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == cfg.Prefix {
			return true, deleteHostTable(c, cfg.Prefix)
		}
	}
	return false, nil
}

// isSlotVeth reports whether name is "<prefix>v<digits>".
func isSlotVeth(prefix, name string) bool {
	rest, ok := strings.CutPrefix(name, prefix+"v")
	if !ok || rest == "" {
		return false
	}
	for _, r := range rest {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
