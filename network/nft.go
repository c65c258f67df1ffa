package network

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Expression builders. Register 1 is the scratch register throughout.

func ifname(name string) []byte { return append([]byte(name), 0) }

func matchIIF(name []byte, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: name},
	}
}

func matchOIF(name []byte, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: name},
	}
}

// ipField loads the IPv4 source (offset 12) or destination (16) address.
func ipField(offset uint32) expr.Any {
	return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4}
}

const (
	offSaddr = 12
	offDaddr = 16
)

func matchAddr(offset uint32, a netip.Addr) []expr.Any {
	b := a.As4()
	return []expr.Any{ipField(offset), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b[:]}}
}

func matchPrefix(offset uint32, p netip.Prefix) []expr.Any {
	b := p.Masked().Addr().As4()
	mask := []byte(netipMask(p.Bits()))
	return []expr.Any{
		ipField(offset),
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b[:]},
	}
}

func netipMask(bits int) []byte {
	m := uint32(0)
	if bits > 0 {
		m = ^uint32(0) << (32 - bits)
	}
	return binary.BigEndian.AppendUint32(nil, m)
}

func matchDaddrSet(s *nftables.Set) []expr.Any {
	return []expr.Any{ipField(offDaddr), &expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID}}
}

func matchL4(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

func matchDport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

func matchEstablished() []expr.Any {
	return matchCtState(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED)
}

// matchCtState matches packets whose conntrack state is any of bits.
func matchCtState(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func matchMark(mark uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(mark)},
	}
}

func matchAddrNot(offset uint32, a netip.Addr) []expr.Any {
	b := a.As4()
	return []expr.Any{ipField(offset), &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: b[:]}}
}

// rejectRules are the two rules that end a refused packet: a TCP reset for
// TCP, ICMP "administratively prohibited" for the rest.
func rejectRules(match []expr.Any) [][]expr.Any {
	return [][]expr.Any{
		cat(match, matchL4(unix.IPPROTO_TCP), one(&expr.Reject{Type: unix.NFT_REJECT_TCP_RST})),
		cat(match, one(&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 13})),
	}
}

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

func jump(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func one(e ...expr.Any) []expr.Any { return e }

// rangeElements renders merged ranges as interval-set elements: a start key
// and an interval-end key one past the range; a range reaching
// 255.255.255.255 has no end element.
func rangeElements(rs []ipRange) []nftables.SetElement {
	els := make([]nftables.SetElement, 0, 2*len(rs))
	for _, r := range rs {
		els = append(els, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, r.lo)})
		if r.hi != ^uint32(0) {
			els = append(els, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, r.hi+1), IntervalEnd: true})
		}
	}
	return els
}

// ---- host table ----

// installHostTable (re)creates the host namespace's table: masquerade of
// the slots' egress, no slot-to-slot forwarding, no new connections from a
// slot into the host, and nothing into a slot but the manager's own marked
// sockets: no other local process or user (output) and no other machine
// routing the slot ranges through this one (forward).
func installHostTable(c *nftables.Conn, cfg *Config) error {
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: cfg.Prefix}
	c.AddTable(t)
	c.DelTable(t) // start from scratch even if a crash left one behind
	c.AddTable(t)
	vethPrefix := []byte(cfg.Prefix + "v") // no NUL: a prefix match

	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	for _, p := range []netip.Prefix{cfg.HostCIDR, cfg.VethCIDR} {
		c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: cat(
			matchPrefix(offSaddr, p), matchOIF(vethPrefix, expr.CmpOpNeq), one(&expr.Masq{}))})
	}

	policyAccept := nftables.ChainPolicyAccept
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &policyAccept})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(
		matchIIF(vethPrefix, expr.CmpOpEq), matchOIF(vethPrefix, expr.CmpOpEq), one(verdict(expr.VerdictDrop)))})
	// Into a slot only the answers of its guest's own connections are
	// forwarded; a neighbour routing the slot ranges here gets nothing.
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(
		matchOIF(vethPrefix, expr.CmpOpEq), matchEstablished(), one(verdict(expr.VerdictAccept)))})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(
		matchOIF(vethPrefix, expr.CmpOpEq), one(verdict(expr.VerdictDrop)))})

	// Locally generated packets towards the slot ranges must carry the
	// manager's mark (set with SO_MARK, which needs CAP_NET_ADMIN), or
	// belong to a connection that such a socket opened. Refused ones are
	// rejected so that a local client fails at once.
	out := c.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &policyAccept})
	for _, p := range []netip.Prefix{cfg.HostCIDR, cfg.VethCIDR} {
		c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: cat(
			matchPrefix(offDaddr, p), matchMark(cfg.SocketMark), one(verdict(expr.VerdictAccept)))})
		c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: cat(
			matchPrefix(offDaddr, p), matchEstablished(), one(verdict(expr.VerdictAccept)))})
		for _, r := range rejectRules(matchPrefix(offDaddr, p)) {
			c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: r})
		}
	}

	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &policyAccept})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(
		matchIIF(vethPrefix, expr.CmpOpEq), matchEstablished(), one(verdict(expr.VerdictAccept)))})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(
		matchIIF(vethPrefix, expr.CmpOpEq), one(verdict(expr.VerdictDrop)))})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install host nft table %s: %w", cfg.Prefix, err)
	}
	return nil
}

func deleteHostTable(c *nftables.Conn, prefix string) error {
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: prefix}
	c.AddTable(t) // makes the delete succeed when the table is absent
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("delete host nft table %s: %w", prefix, err)
	}
	return nil
}

// ---- slot table ----

// slotTable names the objects of a slot's table.
type slotTable struct {
	table                   *nftables.Table
	egress                  *nftables.Chain
	alwaysDeny, allow, deny *nftables.Set
	dnsAllow                *nftables.Set
	refuse                  *nftables.Chain
}

func newSlotTable(prefix string) *slotTable {
	// A name distinct from the host table's, so a slot operation can never
	// alter the host's rules even if it ran in the wrong namespace.
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: prefix + "_slot"}
	// Set IDs are fixed here: they only need to be unique within a batch,
	// and letting the library allocate them races (a package global).
	interval := func(id uint32, name string) *nftables.Set {
		return &nftables.Set{Table: t, ID: id, Name: name, KeyType: nftables.TypeIPAddr, Interval: true}
	}
	return &slotTable{
		table:      t,
		egress:     &nftables.Chain{Name: "egress", Table: t},
		refuse:     &nftables.Chain{Name: "refuse", Table: t},
		alwaysDeny: interval(1, "always_deny"),
		allow:      interval(2, "allow"),
		deny:       interval(3, "deny"),
		dnsAllow:   &nftables.Set{Table: t, ID: 4, Name: "dns_allow", KeyType: nftables.TypeIPAddr, HasTimeout: true},
	}
}

// install creates the whole slot table in one batch: anti-spoofing, NAT
// between the host address and the guest, DNS redirection, input
// protection, forwarding limited to the guest's egress and the host's
// connections to it, and the egress policy p. denied are the always-denied
// ranges; a is the slot's addresses.
func (st *slotTable) install(c *nftables.Conn, denied []ipRange, a slotAddrs, p *compiledPolicy) error {
	hostIP := a.HostIP
	t := st.table
	c.AddTable(t)
	for _, s := range []*nftables.Set{st.alwaysDeny, st.allow, st.deny, st.dnsAllow} {
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("add set %s: %w", s.Name, err)
		}
	}
	if err := c.SetAddElements(st.alwaysDeny, rangeElements(denied)); err != nil {
		return fmt.Errorf("fill set always_deny: %w", err)
	}
	tap, up := ifname(TapName), ifname(slotUplink)

	// Anti-spoofing, before anything else sees the packet: the guest sends
	// with its own address or not at all (rp_filter backs this up).
	raw := c.AddChain(&nftables.Chain{Name: "antispoof", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw})
	c.AddRule(&nftables.Rule{Table: t, Chain: raw, Exprs: cat(
		matchIIF(tap, expr.CmpOpEq), matchAddrNot(offSaddr, GuestIP), one(verdict(expr.VerdictDrop)))})

	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	guest := GuestIP.As4()
	// Only the host's end of the veth (where the manager's dials come
	// from) is translated to the guest.
	c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: cat(
		matchIIF(up, expr.CmpOpEq), matchAddr(offSaddr, a.VethHost), matchAddr(offDaddr, hostIP),
		one(&expr.Immediate{Register: 1, Data: guest[:]},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1}))})
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		// Every DNS packet of the guest goes to the slot's resolver,
		// whichever server it was sent to.
		c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: cat(
			matchIIF(tap, expr.CmpOpEq), matchL4(proto), matchDport(53), one(&expr.Redir{}))})
	}

	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	host := hostIP.As4()
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: cat(
		matchOIF(up, expr.CmpOpEq), matchAddr(offSaddr, GuestIP),
		one(&expr.Immediate{Register: 1, Data: host[:]},
			&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1}))})

	accept := nftables.ChainPolicyAccept
	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(matchEstablished(), one(verdict(expr.VerdictAccept)))})
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(
			matchIIF(tap, expr.CmpOpEq), matchL4(proto), matchDport(53), one(verdict(expr.VerdictAccept)))})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(
		matchIIF(tap, expr.CmpOpEq), matchL4(unix.IPPROTO_ICMP), one(verdict(expr.VerdictAccept)))})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: one(verdict(expr.VerdictDrop))})

	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddChain(st.egress)
	// Refused packets get a TCP reset or an ICMP "administratively
	// prohibited", so guests fail fast instead of waiting for timeouts.
	c.AddChain(st.refuse)
	c.AddRule(&nftables.Rule{Table: t, Chain: st.refuse, Exprs: cat(matchL4(unix.IPPROTO_TCP),
		one(&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}))})
	c.AddRule(&nftables.Rule{Table: t, Chain: st.refuse, Exprs: one(
		&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 13})})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(matchEstablished(), one(verdict(expr.VerdictAccept)))})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(matchIIF(tap, expr.CmpOpEq), one(jump(st.egress.Name)))})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(matchIIF(tap, expr.CmpOpEq), one(verdict(expr.VerdictAccept)))})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(matchIIF(up, expr.CmpOpEq), matchOIF(tap, expr.CmpOpEq),
		matchAddr(offSaddr, a.VethHost), one(verdict(expr.VerdictAccept)))})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: one(verdict(expr.VerdictDrop))})
	return st.setPolicy(c, p, nil)
}

// setPolicy queues, into the same batch as whatever the caller queued, the
// replacement of the egress chain and of the allow/deny sets. The kernel
// applies the batch atomically. dnsAddrs are the resolved addresses still
// allowed under the new policy.
func (st *slotTable) setPolicy(c *nftables.Conn, p *compiledPolicy, dnsAddrs map[netip.Addr]time.Duration) error {
	c.FlushChain(st.egress)
	c.FlushSet(st.allow)
	c.FlushSet(st.deny)
	c.FlushSet(st.dnsAllow)
	if err := c.SetAddElements(st.allow, rangeElements(p.allow)); err != nil {
		return fmt.Errorf("fill set allow: %w", err)
	}
	if err := c.SetAddElements(st.deny, rangeElements(p.deny)); err != nil {
		return fmt.Errorf("fill set deny: %w", err)
	}
	if err := c.SetAddElements(st.dnsAllow, dnsElements(dnsAddrs)); err != nil {
		return fmt.Errorf("fill set dns_allow: %w", err)
	}
	t, ch := st.table, st.egress
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: cat(matchDaddrSet(st.alwaysDeny), one(jump(st.refuse.Name)))})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: cat(matchDaddrSet(st.allow), one(verdict(expr.VerdictAccept)))})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: cat(matchDaddrSet(st.dnsAllow), one(verdict(expr.VerdictAccept)))})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: cat(matchDaddrSet(st.deny), one(jump(st.refuse.Name)))})
	if p.denyInternet {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: one(jump(st.refuse.Name))})
	}
	return nil
}

func dnsElements(addrs map[netip.Addr]time.Duration) []nftables.SetElement {
	els := make([]nftables.SetElement, 0, len(addrs))
	for a, ttl := range addrs {
		b := a.As4()
		els = append(els, nftables.SetElement{Key: b[:], Timeout: ttl})
	}
	return els
}
