package compose

import (
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"
)

var (
	// Service, network and volume names: what Compose accepts, bounded.
	nameRe   = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)
	bridgeRe = regexp.MustCompile(`^bridge$`)
	localRe  = regexp.MustCompile(`^local$`)
)

// project checks the top level and returns the project.
func (c *checker) project(root *yaml.Node) *Project {
	top, ok := c.mapping(root, "", 0)
	if !ok {
		return nil
	}
	p := &Project{}
	var services *yaml.Node
	decl := declared{networks: map[string]bool{"default": true}, volumes: map[string]bool{}}
	for _, kv := range top {
		switch k := kv.key; {
		case k == "services":
			services = kv.val
		case k == "version":
			c.scalar(kv.val, k) // obsolete, ignored by Compose
		case k == "networks":
			c.networks(kv.val, decl.networks)
		case k == "volumes":
			c.volumes(kv.val, decl.volumes)
		case strings.HasPrefix(k, "x-"):
			c.walk(kv.val, k, 1)
		default:
			c.fail(k, "%s", topRefusal(k))
		}
	}
	if services == nil {
		if !c.done() {
			c.fail("services", "is required (1 to %d services)", MaxServices)
		}
		return nil
	}
	p.Services = c.services(services, decl)
	return p
}

// topRefusal says why a top-level key is refused.
func topRefusal(k string) string {
	switch k {
	case "include", "extends":
		return "including other files is not allowed (they would be read from the host)"
	case "secrets", "configs":
		return k + " are not allowed (their files would be read from the host)"
	case "name":
		return "the project name is the node's to choose (and Debian's Compose 1.29 has no top-level name)"
	}
	return "unknown or unsupported top-level key"
}

// declared are the project's top-level networks and volumes.
type declared struct {
	networks, volumes map[string]bool
	services          map[string]bool
}

// networks checks the top-level networks: bridge networks between the
// project's containers, nothing the node or guest provides.
func (c *checker) networks(n *yaml.Node, names map[string]bool) {
	c.named(n, "networks", "network", MaxServices, names, func(f pair, fp string) {
		switch f.key {
		case "driver":
			c.str(f.val, fp, bridgeRe, "bridge (the only network driver allowed)")
		case "internal", "enable_ipv6", "attachable":
			c.boolean(f.val, fp)
		case "labels":
			c.dict(f.val, fp, 64)
		case "name":
			c.str(f.val, fp, nameRe, "a network name")
		default:
			c.fail(fp, "unknown or unsupported network key (external networks, driver options and IPAM are not allowed)")
		}
	})
}

// volumes checks the top-level named volumes: local volumes Docker makes
// in the guest, without driver options (which can bind a host path).
func (c *checker) volumes(n *yaml.Node, names map[string]bool) {
	c.named(n, "volumes", "volume", 64, names, func(f pair, fp string) {
		switch f.key {
		case "driver":
			c.str(f.val, fp, localRe, "local (the only volume driver allowed)")
		case "labels":
			c.dict(f.val, fp, 64)
		case "name":
			c.str(f.val, fp, nameRe, "a volume name")
		case "driver_opts":
			c.fail(fp, "volume driver options are not allowed (they can bind a host path)")
		default:
			c.fail(fp, "unknown or unsupported volume key (external volumes are not allowed)")
		}
	})
}

// named checks a top-level section of named entries (networks, volumes):
// at most max, each a valid name (recorded in names) whose value is null
// or a mapping, each of whose fields goes to field with its path.
func (c *checker) named(n *yaml.Node, section, kind string, max int, names map[string]bool, field func(f pair, fp string)) {
	ps, ok := c.mapping(n, section, 1)
	if !ok {
		return
	}
	if len(ps) > max {
		c.fail(section, "has %d %s, more than the %d allowed", len(ps), section, max)
		return
	}
	for _, kv := range ps {
		path := join(section, kv.key)
		if !nameRe.MatchString(kv.key) {
			c.fail(path, "is not a valid %s name", kind)
			continue
		}
		names[kv.key] = true
		if c.isNull(kv.val, path) {
			continue
		}
		fields, ok := c.mapping(kv.val, path, 2)
		if !ok {
			continue
		}
		for _, f := range fields {
			field(f, join(path, f.key))
		}
	}
}

// services checks the services (1..MaxServices) and returns them.
func (c *checker) services(n *yaml.Node, decl declared) []Service {
	ps, ok := c.mapping(n, "services", 1)
	if !ok {
		return nil
	}
	if len(ps) == 0 || len(ps) > MaxServices {
		c.fail("services", "has %d services; a project has 1 to %d", len(ps), MaxServices)
		return nil
	}
	decl.services = map[string]bool{}
	for _, kv := range ps {
		decl.services[kv.key] = true
	}
	out := make([]Service, 0, len(ps))
	for _, kv := range ps {
		if c.done() {
			break
		}
		path := join("services", kv.key)
		if !nameRe.MatchString(kv.key) {
			c.fail(path, "is not a valid service name (letters, digits, '.', '-' and '_', at most 63)")
			continue
		}
		if s, ok := c.service(kv.key, kv.val, path, decl); ok {
			out = append(out, s)
		}
	}
	return out
}
