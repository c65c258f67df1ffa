package compose

import (
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

var (
	// A short port: [[host_ip:][published]:]target[/protocol], the ports
	// possibly ranges; host_ip IPv4 or bracketed IPv6.
	portRe = regexp.MustCompile(`^(?:(?:([0-9]{1,3}(?:\.[0-9]{1,3}){3}|\[[0-9a-fA-F:.]{2,45}\]):)?([0-9]{1,5}(?:-[0-9]{1,5})?)?:)?([0-9]{1,5}(?:-[0-9]{1,5})?)(?:/(tcp|udp|sctp))?$`)
	// An exposed port: port[-port][/protocol].
	exposeRe   = regexp.MustCompile(`^[0-9]{1,5}(?:-[0-9]{1,5})?(?:/(tcp|udp|sctp))?$`)
	hostIPRe   = regexp.MustCompile(`^([0-9]{1,3}(\.[0-9]{1,3}){3}|[0-9a-fA-F:.]{2,45})$`)
	protocolRe = regexp.MustCompile(`^(tcp|udp|sctp)$`)
	portModeRe = regexp.MustCompile(`^(host|ingress)$`)
	rangeRe    = regexp.MustCompile(`^[0-9]{1,5}(-[0-9]{1,5})?$`)
	volModeRe  = regexp.MustCompile(`^(ro|rw|nocopy)(,(ro|rw|nocopy)){0,2}$`)
)

// validRange reports whether every port of "p" or "p-q" is 1..65535
// with p <= q.
func validRange(r string) bool {
	lo, hi, isRange := strings.Cut(r, "-")
	a, err1 := strconv.Atoi(lo)
	b, err2 := a, error(nil)
	if isRange {
		b, err2 = strconv.Atoi(hi)
	}
	return err1 == nil && err2 == nil && a >= 1 && b <= 65535 && a <= b
}

func (s *svc) ports(n *yaml.Node, path string) {
	items, ok := s.c.list(n, path, 64)
	if !ok {
		return
	}
	for i, it := range items {
		ip := index(path, i)
		r := s.c.node(it, ip)
		if r == nil {
			return
		}
		if r.Kind == yaml.MappingNode {
			s.longPort(it, ip)
			continue
		}
		v, ok := s.c.scalar(it, ip)
		if !ok {
			continue
		}
		m := portRe.FindStringSubmatch(v)
		if m == nil || (m[2] != "" && !validRange(m[2])) || !validRange(m[3]) {
			s.c.fail(ip, "%q is not a port ([[host_ip:]published:]target[/protocol], ports 1 to 65535)", clip(v))
			continue
		}
		s.out.Ports = append(s.out.Ports, m[3])
	}
}

func (s *svc) longPort(n *yaml.Node, path string) {
	fields, ok := s.c.mapping(n, path, 4)
	if !ok {
		return
	}
	target := ""
	for _, f := range fields {
		fp := join(path, f.key)
		switch f.key {
		case "target":
			if v, ok := s.c.integer(f.val, fp, 1, 65535); ok {
				target = strconv.FormatInt(v, 10)
			}
		case "published":
			if v, ok := s.c.str(f.val, fp, rangeRe, "a port or range"); ok && !validRange(v) {
				s.c.fail(fp, "%q is not a port or range of 1 to 65535", v)
			}
		case "host_ip":
			s.c.str(f.val, fp, hostIPRe, "an IP address")
		case "protocol":
			s.c.str(f.val, fp, protocolRe, "tcp, udp or sctp")
		case "mode":
			s.c.str(f.val, fp, portModeRe, "host or ingress")
		default:
			s.c.fail(fp, "unknown port key")
		}
	}
	if target == "" && !s.c.done() {
		s.c.fail(join(path, "target"), "is required")
		return
	}
	s.out.Ports = append(s.out.Ports, target)
}

func (s *svc) expose(n *yaml.Node, path string) {
	for i, v := range s.c.strings(n, path, 64, exposeRe, "a port (port[-port][/protocol])") {
		if r, _, _ := strings.Cut(v, "/"); !validRange(r) {
			s.c.fail(index(path, i), "%q is not a port of 1 to 65535", v)
		}
	}
}

// networks are the project networks a service joins: a list of names or
// a mapping of names to their aliases.
func (s *svc) networks(n *yaml.Node, path string) {
	r := s.c.node(n, path)
	if r == nil {
		return
	}
	if r.Kind == yaml.SequenceNode {
		for i, v := range s.c.strings(n, path, MaxServices, nameRe, "a network name") {
			s.network(v, index(path, i))
		}
		return
	}
	ps, ok := s.c.mapping(n, path, 3)
	if !ok {
		return
	}
	for _, p := range ps {
		fp := join(path, p.key)
		s.network(p.key, fp)
		if s.c.isNull(p.val, fp) {
			continue
		}
		fields, ok := s.c.mapping(p.val, fp, 4)
		if !ok {
			continue
		}
		for _, f := range fields {
			switch ffp := join(fp, f.key); f.key {
			case "aliases":
				s.c.strings(f.val, ffp, 16, hostnameRe, "a host name")
			case "ipv4_address", "ipv6_address":
				s.c.str(f.val, ffp, hostIPRe, "an IP address")
			case "priority":
				s.c.integer(f.val, ffp, -1000, 1000)
			default:
				s.c.fail(ffp, "unknown service network key")
			}
		}
	}
}

func (s *svc) network(name, path string) {
	if !s.decl.networks[name] {
		s.c.fail(path, "names network %q, which the top-level networks do not declare", clip(name))
	}
}

// dependsOn names other services of the project: a list, or a mapping
// with their conditions.
func (s *svc) dependsOn(n *yaml.Node, path string) {
	r := s.c.node(n, path)
	if r == nil {
		return
	}
	if r.Kind == yaml.SequenceNode {
		for i, v := range s.c.strings(n, path, MaxServices, nameRe, "a service name") {
			s.dependency(v, index(path, i))
		}
		return
	}
	ps, ok := s.c.mapping(n, path, 3)
	if !ok {
		return
	}
	for _, p := range ps {
		fp := join(path, p.key)
		s.dependency(p.key, fp)
		fields, ok := s.c.mapping(p.val, fp, 4)
		if !ok {
			continue
		}
		for _, f := range fields {
			switch ffp := join(fp, f.key); f.key {
			case "condition":
				s.c.str(f.val, ffp, conditionRe, "service_started, service_healthy or service_completed_successfully")
			default:
				s.c.fail(ffp, "unknown depends_on key")
			}
		}
	}
}

func (s *svc) dependency(name, path string) {
	switch {
	case name == s.name:
		s.c.fail(path, "a service cannot depend on itself")
	case !s.decl.services[name]:
		s.c.fail(path, "names service %q, which the project does not have", clip(name))
	}
}

func (s *svc) links(n *yaml.Node, path string) {
	for i, v := range s.c.strings(n, path, MaxServices, linkRe, "service[:alias]") {
		target, _, _ := strings.Cut(v, ":")
		s.dependency(target, index(path, i))
	}
}
