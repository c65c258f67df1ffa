package compose

import (
	"strings"

	"go.yaml.in/yaml/v3"
)

// volumes checks a service's mounts: named volumes the project declares,
// anonymous volumes and tmpfs. A host path ("./data:/data", "/:/host",
// type: bind) is refused: the containers would reach the guest's own
// filesystem, where the sandbox's agent and Docker's state live.
func (s *svc) volumes(n *yaml.Node, path string) {
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
			s.longVolume(it, ip)
			continue
		}
		if v, ok := s.c.scalar(it, ip); ok {
			s.shortVolume(v, ip)
		}
	}
}

// shortVolume checks "[source:]target[:mode]".
func (s *svc) shortVolume(v, path string) {
	parts := strings.Split(v, ":")
	var source, target, mode string
	switch len(parts) {
	case 1:
		target = parts[0]
	case 2:
		source, target = parts[0], parts[1]
	case 3:
		source, target, mode = parts[0], parts[1], parts[2]
	default:
		s.c.fail(path, "%q is not [volume:]container-path[:mode]", clip(v))
		return
	}
	if source != "" && !s.namedVolume(source, path) {
		return
	}
	if !absPathRe.MatchString(target) {
		s.c.fail(path, "%q: the container path must be absolute", clip(target))
		return
	}
	if mode != "" && !volModeRe.MatchString(mode) {
		s.c.fail(path, "%q is not a volume mode (ro, rw, nocopy)", clip(mode))
	}
}

// namedVolume reports whether source names a declared volume, refusing
// a host path.
func (s *svc) namedVolume(source, path string) bool {
	if !nameRe.MatchString(source) {
		s.c.fail(path, "host bind mounts are not allowed (%q is a host path); use a named volume", clip(source))
		return false
	}
	if !s.decl.volumes[source] {
		s.c.fail(path, "names volume %q, which the top-level volumes do not declare", clip(source))
		return false
	}
	return true
}

// longVolume checks the long syntax: type volume or tmpfs only.
func (s *svc) longVolume(n *yaml.Node, path string) {
	fields, ok := s.c.mapping(n, path, 4)
	if !ok {
		return
	}
	typ, source, hasTarget := "", "", false
	for _, f := range fields {
		fp := join(path, f.key)
		switch f.key {
		case "type":
			typ, _ = s.c.scalar(f.val, fp)
			switch typ {
			case "volume", "tmpfs":
			case "bind":
				s.c.fail(fp, "host bind mounts are not allowed")
			default:
				s.c.fail(fp, "%q is not allowed (volume or tmpfs)", clip(typ))
			}
		case "source":
			source, _ = s.c.scalar(f.val, fp)
		case "target":
			_, hasTarget = s.c.str(f.val, fp, absPathRe, "an absolute container path")
		case "read_only":
			s.c.boolean(f.val, fp)
		case "volume":
			s.volumeOptions(f.val, fp)
		case "tmpfs":
			s.tmpfsOptions(f.val, fp)
		case "bind":
			s.c.fail(fp, "host bind mounts are not allowed")
		default:
			s.c.fail(fp, "unknown or unsupported mount key")
		}
	}
	if typ == "" && !s.c.done() {
		s.c.fail(join(path, "type"), "is required (volume or tmpfs)")
	}
	if !hasTarget && !s.c.done() {
		s.c.fail(join(path, "target"), "is required")
	}
	if source != "" {
		if typ == "tmpfs" {
			s.c.fail(join(path, "source"), "a tmpfs has no source")
		} else {
			s.namedVolume(source, join(path, "source"))
		}
	}
}

func (s *svc) volumeOptions(n *yaml.Node, path string) {
	fields, ok := s.c.mapping(n, path, 5)
	if !ok {
		return
	}
	for _, f := range fields {
		fp := join(path, f.key)
		switch f.key {
		case "nocopy":
			s.c.boolean(f.val, fp)
		default:
			s.c.fail(fp, "unknown volume option")
		}
	}
}

func (s *svc) tmpfsOptions(n *yaml.Node, path string) {
	fields, ok := s.c.mapping(n, path, 5)
	if !ok {
		return
	}
	for _, f := range fields {
		fp := join(path, f.key)
		switch f.key {
		case "size":
			s.c.str(f.val, fp, sizeRe, "a size (such as 64m)")
		case "mode":
			s.c.integer(f.val, fp, 0, 0o7777)
		default:
			s.c.fail(fp, "unknown tmpfs option")
		}
	}
}
