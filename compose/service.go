package compose

import (
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"go.yaml.in/yaml/v3"
)

var (
	absPathRe   = regexp.MustCompile(`^/[^\x00]{0,999}$`)
	userRe      = regexp.MustCompile(`^[a-zA-Z0-9_.-]{1,64}(:[a-zA-Z0-9_.-]{1,64})?$`)
	hostnameRe  = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]{0,62})(\.[a-zA-Z0-9][a-zA-Z0-9-]{0,62}){0,7}$`)
	restartRe   = regexp.MustCompile(`^(no|always|unless-stopped|on-failure(:[0-9]{1,4})?)$`)
	durationRe  = regexp.MustCompile(`^([0-9]{1,9}(\.[0-9]{1,9})?(ns|us|ms|s|m|h)){1,6}$`)
	signalRe    = regexp.MustCompile(`^(SIG)?[A-Z0-9+]{1,16}$`)
	capRe       = regexp.MustCompile(`^(CAP_)?[A-Z_]{1,32}$|^ALL$`)
	tmpfsRe     = regexp.MustCompile(`^/[^:\x00]{0,999}(:[a-z0-9=,]{1,128})?$`)
	platformRe  = regexp.MustCompile(`^linux/[a-z0-9]{1,16}(/v[0-9])?$`)
	sizeRe      = regexp.MustCompile(`^[0-9]{1,15}(\.[0-9]{1,6})?([bkmgBKMG][bB]?)?$`)
	cpusRe      = regexp.MustCompile(`^[0-9]{1,4}(\.[0-9]{1,6})?$`)
	extraHostRe = regexp.MustCompile(`^[a-zA-Z0-9.-]{1,253}[:=]\[?[0-9a-fA-F:.]{2,45}\]?$`)
	conditionRe = regexp.MustCompile(`^(service_started|service_healthy|service_completed_successfully)$`)
	noNewPrivRe = regexp.MustCompile(`^no-new-privileges([:=]true)?$`)
	netModeRe   = regexp.MustCompile(`^(bridge|none)$`)
	linkRe      = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}(:[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62})?$`)
)

// refusedService are the service keys refused with a reason of their own
// (any other unknown key is refused too, with a generic one).
var refusedService = map[string]string{
	"build":               "services are image-only: build is not allowed (set image)",
	"privileged":          "privileged containers are not allowed",
	"cap_add":             "adding capabilities is not allowed",
	"devices":             "host devices are not allowed",
	"device_cgroup_rules": "device rules are not allowed",
	"pid":                 "sharing a PID namespace is not allowed",
	"ipc":                 "sharing an IPC namespace is not allowed",
	"uts":                 "sharing a UTS namespace is not allowed",
	"userns_mode":         "choosing the user namespace (host) is not allowed",
	"cgroup":              "sharing a cgroup namespace is not allowed",
	"cgroup_parent":       "choosing the cgroup parent is not allowed",
	"sysctls":             "sysctls are not allowed",
	"volumes_from":        "mounting another container's volumes is not allowed",
	"env_file":            "env files are read from the host: use environment",
	"extends":             "extending other files or services is not allowed",
	"secrets":             "secrets are read from host files: not allowed",
	"configs":             "configs are read from host files: not allowed",
	"logging":             "logging drivers are not allowed (they can ship logs off the sandbox)",
	"runtime":             "choosing the container runtime is not allowed",
	"gpus":                "GPUs are not available",
	"external_links":      "links to containers outside the project are not allowed",
}

// svc is the service being checked.
type svc struct {
	c    *checker
	decl declared
	name string
	out  Service
}

// serviceKeys are the service keys allowed, each with its check (the
// value's node and its key path).
var serviceKeys = map[string]func(s *svc, n *yaml.Node, path string){
	"image":             (*svc).image,
	"command":           func(s *svc, n *yaml.Node, p string) { s.c.stringOrList(n, p, 256) },
	"entrypoint":        func(s *svc, n *yaml.Node, p string) { s.c.stringOrList(n, p, 256) },
	"environment":       func(s *svc, n *yaml.Node, p string) { s.c.dict(n, p, 1024) },
	"labels":            func(s *svc, n *yaml.Node, p string) { s.c.dict(n, p, 256) },
	"ports":             (*svc).ports,
	"expose":            (*svc).expose,
	"networks":          (*svc).networks,
	"network_mode":      (*svc).networkMode,
	"depends_on":        (*svc).dependsOn,
	"links":             (*svc).links,
	"volumes":           (*svc).volumes,
	"tmpfs":             (*svc).tmpfs,
	"healthcheck":       (*svc).healthcheck,
	"security_opt":      (*svc).securityOpt,
	"extra_hosts":       (*svc).extraHosts,
	"working_dir":       re(absPathRe, "an absolute path"),
	"user":              re(userRe, "a user (name or uid, optionally :group)"),
	"hostname":          re(hostnameRe, "a host name"),
	"domainname":        re(hostnameRe, "a domain name"),
	"container_name":    re(nameRe, "a container name"),
	"restart":           re(restartRe, "a restart policy (no, always, unless-stopped, on-failure[:N])"),
	"stop_signal":       re(signalRe, "a signal name"),
	"stop_grace_period": re(durationRe, "a duration (such as 10s or 1m30s)"),
	"platform":          re(platformRe, "a linux platform (such as linux/amd64)"),
	"mem_limit":         re(sizeRe, "a size (such as 512m)"),
	"mem_reservation":   re(sizeRe, "a size (such as 512m)"),
	"shm_size":          re(sizeRe, "a size (such as 64m)"),
	"cpus":              re(cpusRe, "a number of CPUs"),
	"tty":               func(s *svc, n *yaml.Node, p string) { s.c.boolean(n, p) },
	"stdin_open":        func(s *svc, n *yaml.Node, p string) { s.c.boolean(n, p) },
	"init":              func(s *svc, n *yaml.Node, p string) { s.c.boolean(n, p) },
	"read_only":         func(s *svc, n *yaml.Node, p string) { s.c.boolean(n, p) },
	"cap_drop":          func(s *svc, n *yaml.Node, p string) { s.c.strings(n, p, 64, capRe, "a capability name") },
	"profiles":          func(s *svc, n *yaml.Node, p string) { s.c.strings(n, p, 16, nameRe, "a profile name") },
}

func re(r *regexp.Regexp, what string) func(*svc, *yaml.Node, string) {
	return func(s *svc, n *yaml.Node, p string) { s.c.str(n, p, r, what) }
}

// service checks one service; ok when it has a valid image (the other
// refusals are collected in c).
func (c *checker) service(svcName string, n *yaml.Node, path string, decl declared) (Service, bool) {
	s := &svc{c: c, decl: decl, name: svcName, out: Service{Name: svcName}}
	fields, ok := c.mapping(n, path, 2)
	if !ok {
		return Service{}, false
	}
	keys := map[string]bool{}
	for _, f := range fields {
		if c.done() {
			break
		}
		keys[f.key] = true
		fp := join(path, f.key)
		if check, ok := serviceKeys[f.key]; ok {
			check(s, f.val, fp)
			continue
		}
		switch reason, refused := refusedService[f.key]; {
		case refused:
			c.fail(fp, "%s", reason)
		case strings.HasPrefix(f.key, "x-"):
			c.walk(f.val, fp, 3)
		default:
			c.fail(fp, "unknown or unsupported service key")
		}
	}
	if keys["network_mode"] && keys["networks"] && !c.done() {
		c.fail(join(path, "network_mode"), "cannot be combined with networks")
	}
	if s.out.Image == "" && !c.done() {
		c.fail(join(path, "image"), "is required: services are image-only")
	}
	return s.out, s.out.Image != ""
}

func (s *svc) image(n *yaml.Node, path string) {
	ref, ok := s.c.scalar(n, path)
	if !ok {
		return
	}
	if r := s.c.node(n, path); r == nil || r.Tag != "!!str" {
		s.c.fail(path, "%q is not an image reference (quote it)", clip(ref))
		return
	}
	if _, err := name.ParseReference(ref); err != nil || len(ref) > 512 {
		s.c.fail(path, "%q is not an image reference", clip(ref))
		return
	}
	s.out.Image = ref
}

func (s *svc) networkMode(n *yaml.Node, path string) {
	v, ok := s.c.scalar(n, path)
	if !ok {
		return
	}
	if v == "host" {
		s.c.fail(path, "host networking is not allowed")
		return
	}
	if !netModeRe.MatchString(v) {
		s.c.fail(path, "%q is not allowed (bridge or none; sharing another container's network is not)", clip(v))
	}
}

func (s *svc) securityOpt(n *yaml.Node, path string) {
	items, ok := s.c.list(n, path, 8)
	if !ok {
		return
	}
	for i, it := range items {
		v, ok := s.c.scalar(it, index(path, i))
		if ok && !noNewPrivRe.MatchString(v) {
			s.c.fail(index(path, i), "%q is not allowed (only no-new-privileges; unconfined and custom profiles are not)", clip(v))
		}
	}
}

func (s *svc) tmpfs(n *yaml.Node, path string) {
	if r := s.c.node(n, path); r != nil && r.Kind == yaml.SequenceNode {
		s.c.strings(n, path, 16, tmpfsRe, "a container path (with optional tmpfs options)")
		return
	}
	s.c.str(n, path, tmpfsRe, "a container path (with optional tmpfs options)")
}

func (s *svc) extraHosts(n *yaml.Node, path string) {
	if r := s.c.node(n, path); r != nil && r.Kind == yaml.SequenceNode {
		s.c.strings(n, path, 64, extraHostRe, "host:address")
		return
	}
	s.c.dict(n, path, 64)
}

func (s *svc) healthcheck(n *yaml.Node, path string) {
	fields, ok := s.c.mapping(n, path, 3)
	if !ok {
		return
	}
	for _, f := range fields {
		fp := join(path, f.key)
		switch f.key {
		case "test":
			s.c.stringOrList(f.val, fp, 64)
		case "interval", "timeout", "start_period":
			s.c.str(f.val, fp, durationRe, "a duration (such as 10s or 1m30s)")
		case "retries":
			s.c.integer(f.val, fp, 0, 1000)
		case "disable":
			s.c.boolean(f.val, fp)
		default:
			s.c.fail(fp, "unknown healthcheck key")
		}
	}
}
