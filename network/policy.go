package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Policy is a sandbox's egress policy. The zero value lets the guest reach
// the internet, minus the always-denied ranges.
//
// Evaluation order for a packet the guest sends: always-denied ranges drop;
// then AllowOut (addresses, and addresses the slot resolved for allowed
// domains) accepts; then DenyOut drops; then DenyInternet drops everything
// else. So allow rules win over deny rules, and nothing opens an
// always-denied range.
type Policy struct {
	// DenyInternet is the inverse of the API's allow_internet_access.
	DenyInternet bool
	// AllowOut holds IPv4 CIDRs, IPv4 addresses and domain names
	// ("example.com" matches that name only, "*.example.com" its subdomains).
	AllowOut []string
	// DenyOut holds IPv4 CIDRs and addresses.
	DenyOut []string
}

// ipRange is an inclusive range of IPv4 addresses.
type ipRange struct{ lo, hi uint32 }

// compiledPolicy is a validated Policy in the form the rules need.
type compiledPolicy struct {
	denyInternet bool
	allow, deny  []ipRange
	domains      []domainPattern
}

// domainPattern is a normalised domain; wildcard matches strict subdomains.
type domainPattern struct {
	name     string // lower case, no trailing dot
	wildcard bool
}

// maxPolicyEntries bounds one policy so a request cannot make a huge batch.
const maxPolicyEntries = 4096

// ValidatePolicy reports the first invalid entry of p.
func ValidatePolicy(p Policy) error {
	_, err := compilePolicy(p)
	return err
}

func compilePolicy(p Policy) (*compiledPolicy, error) {
	if len(p.AllowOut)+len(p.DenyOut) > maxPolicyEntries {
		return nil, fmt.Errorf("policy: %d entries, at most %d", len(p.AllowOut)+len(p.DenyOut), maxPolicyEntries)
	}
	c := &compiledPolicy{denyInternet: p.DenyInternet}
	for _, e := range p.AllowOut {
		r, d, err := parseEntry(e, true)
		if err != nil {
			return nil, fmt.Errorf("policy allowOut %q: %w", e, err)
		}
		if d != nil {
			c.domains = append(c.domains, *d)
			continue
		}
		c.allow = append(c.allow, r)
	}
	for _, e := range p.DenyOut {
		r, _, err := parseEntry(e, false)
		if err != nil {
			return nil, fmt.Errorf("policy denyOut %q: %w", e, err)
		}
		c.deny = append(c.deny, r)
	}
	c.allow, c.deny = mergeRanges(c.allow), mergeRanges(c.deny)
	return c, nil
}

// parseEntry parses a CIDR, an address or (if domains) a domain pattern.
func parseEntry(s string, domains bool) (ipRange, *domainPattern, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return ipRange{}, nil, err
		}
		if !p.Addr().Is4() {
			return ipRange{}, nil, errors.New("only IPv4 is supported")
		}
		return prefixRange(p), nil, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if !a.Is4() {
			return ipRange{}, nil, errors.New("only IPv4 is supported")
		}
		return prefixRange(netip.PrefixFrom(a, 32)), nil, nil
	}
	if !domains {
		return ipRange{}, nil, errors.New("not an IPv4 address or CIDR")
	}
	d, err := parseDomainPattern(s)
	if err != nil {
		return ipRange{}, nil, err
	}
	return ipRange{}, &d, nil
}

// parseDomainPattern validates a domain name, optionally "*." prefixed.
func parseDomainPattern(s string) (domainPattern, error) {
	name := strings.TrimSuffix(strings.ToLower(s), ".")
	var d domainPattern
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		d.wildcard, name = true, rest
	}
	if err := checkDomainName(name); err != nil {
		return domainPattern{}, err
	}
	d.name = name
	return d, nil
}

func checkDomainName(name string) error {
	if name == "" || len(name) > 253 {
		return errors.New("domain name empty or longer than 253 bytes")
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("domain label %q: empty or longer than 63 bytes", label)
		}
		for _, r := range label {
			ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_'
			if !ok {
				return fmt.Errorf("domain label %q: character %q not allowed", label, r)
			}
		}
	}
	return nil
}

// match reports whether the queried name (any case, optional trailing dot)
// is covered by the pattern.
func (d domainPattern) match(qname string) bool {
	q := strings.TrimSuffix(strings.ToLower(qname), ".")
	if !d.wildcard {
		return q == d.name
	}
	return len(q) > len(d.name)+1 && strings.HasSuffix(q, "."+d.name)
}

// permits reports whether the egress rules accept a new connection to a:
// the same order as the kernel's egress chain (always denied, allowed,
// resolved for an allowed name, denied, internet). resolved says whether
// a is in the slot's set of addresses resolved for allowed names.
func (c *compiledPolicy) permits(a netip.Addr, alwaysDenied []ipRange, resolved bool) bool {
	in := func(rs []ipRange) bool { return slices.ContainsFunc(rs, func(r ipRange) bool { return r.contains(a) }) }
	switch {
	case in(alwaysDenied):
		return false
	case in(c.allow), resolved:
		return true
	case in(c.deny):
		return false
	}
	return !c.denyInternet
}

// closed reports whether the policy denies by default (no internet, or a
// deny list covering every address): then the resolver must not be a way
// out either, and answers only names an AllowOut domain covers.
func (c *compiledPolicy) closed() bool {
	if c.denyInternet {
		return true
	}
	return slices.ContainsFunc(c.deny, func(r ipRange) bool { return r.lo == 0 && r.hi == ^uint32(0) })
}

func (c *compiledPolicy) allowsName(qname string) bool {
	return slices.ContainsFunc(c.domains, func(d domainPattern) bool { return d.match(qname) })
}

func prefixRange(p netip.Prefix) ipRange {
	p = p.Masked()
	b := p.Addr().As4()
	lo := binary.BigEndian.Uint32(b[:])
	size := uint64(1) << (32 - p.Bits())
	return ipRange{lo: lo, hi: uint32(uint64(lo) + size - 1)}
}

// mergeRanges sorts ranges and joins overlapping or adjacent ones: the
// kernel's interval sets refuse overlapping elements.
func mergeRanges(rs []ipRange) []ipRange {
	if len(rs) == 0 {
		return nil
	}
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b ipRange) int { return cmpU32(a.lo, b.lo) })
	out := []ipRange{rs[0]}
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		if uint64(r.lo) <= uint64(last.hi)+1 {
			last.hi = max(last.hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

func cmpU32(a, b uint32) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func prefixesToRanges(ps []netip.Prefix) []ipRange {
	rs := make([]ipRange, 0, len(ps))
	for _, p := range ps {
		if p.Addr().Is4() {
			rs = append(rs, prefixRange(p))
		}
	}
	return mergeRanges(rs)
}

func (r ipRange) contains(a netip.Addr) bool {
	if !a.Is4() {
		return false
	}
	b := a.As4()
	v := binary.BigEndian.Uint32(b[:])
	return v >= r.lo && v <= r.hi
}
