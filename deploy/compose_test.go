package deploy

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"

	"github.com/agentenv/agentenv/internal/testenv"
)

// composeFile is the part of the Compose format deploy/compose.yaml uses.
// Decoding is strict (KnownFields), so a key the policy below does not know
// about (privileged under another spelling, pid, cgroup ...) fails the test
// until the check learns it.
type composeFile struct {
	Services   map[string]composeService `yaml:"services"`
	Networks   map[string]any            `yaml:"networks"`
	Volumes    map[string]any            `yaml:"volumes"`
	Extensions map[string]any            `yaml:",inline"`
}

type composeService struct {
	Image       string   `yaml:"image"`
	Build       any      `yaml:"build"`
	User        string   `yaml:"user"`
	Command     any      `yaml:"command"`
	Hostname    string   `yaml:"hostname"`
	Environment any      `yaml:"environment"`
	Ports       []any    `yaml:"ports"`
	Volumes     []any    `yaml:"volumes"`
	Networks    any      `yaml:"networks"`
	DependsOn   any      `yaml:"depends_on"`
	Restart     string   `yaml:"restart"`
	ReadOnly    bool     `yaml:"read_only"`
	Privileged  bool     `yaml:"privileged"`
	NetworkMode string   `yaml:"network_mode"`
	Pid         string   `yaml:"pid"`
	Ipc         string   `yaml:"ipc"`
	UsernsMode  string   `yaml:"userns_mode"`
	CapAdd      []string `yaml:"cap_add"`
	CapDrop     []string `yaml:"cap_drop"`
	SecurityOpt []string `yaml:"security_opt"`
	Devices     []any    `yaml:"devices"`
}

func decodeCompose(t *testing.T, name string, data []byte, strict bool) composeFile {
	t.Helper()
	c, err := decodeComposeErr(data, strict)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return c
}

func decodeComposeErr(data []byte, strict bool) (composeFile, error) {
	var c composeFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(strict)
	err := dec.Decode(&c)
	return c, err
}

// portSpec is one published port in short ("127.0.0.1:3000:3000") or
// long ({host_ip, published, target}) syntax.
func portSpec(p any) (hostIP, published string, err error) {
	switch v := p.(type) {
	case string:
		parts := strings.Split(strings.TrimSuffix(v, "/tcp"), ":")
		if len(parts) != 3 {
			return "", "", fmt.Errorf("port %q: want HOST_IP:HOST_PORT:CONTAINER_PORT", v)
		}
		return parts[0], parts[1], nil
	case map[string]any:
		ip, _ := v["host_ip"].(string)
		return ip, fmt.Sprint(v["published"]), nil
	}
	return "", "", fmt.Errorf("port %v: unknown syntax", p)
}

func deviceHost(d any) string {
	switch v := d.(type) {
	case string:
		host, _, _ := strings.Cut(v, ":")
		return host
	case map[string]any:
		s, _ := v["source"].(string)
		return s
	}
	return fmt.Sprint(d)
}

func volumeSource(v any) string {
	switch x := v.(type) {
	case string:
		src, _, _ := strings.Cut(x, ":")
		return src
	case map[string]any:
		if typ, _ := x["type"].(string); typ == "bind" {
			s, _ := x["source"].(string)
			return "/" + strings.TrimPrefix(s, "/")
		}
		s, _ := x["source"].(string)
		return s
	}
	return fmt.Sprint(v)
}

// checkCompose applies the deployment rules to one decoded compose file;
// kvm says whether compose.kvm.yaml is merged in, so the nodes must map
// /dev/kvm (without it they must not: a host without KVM could not create
// the containers).
func checkCompose(t reporter, c composeFile, kvm bool) {
	t.Helper()
	nodes := 0
	for name := range c.Extensions {
		// Compose's normalised output adds version (v1) or name (v2).
		if !strings.HasPrefix(name, "x-") && name != "version" && name != "name" {
			t.Errorf("unknown top-level key %q", name)
		}
	}
	for _, want := range []string{"gateway", "scheduler", "redis"} {
		if _, ok := c.Services[want]; !ok {
			t.Errorf("no %s service", want)
		}
	}
	for name, s := range c.Services {
		if s.Privileged {
			t.Errorf("%s: privileged", name)
		}
		for k, v := range map[string]string{"network_mode": s.NetworkMode, "pid": s.Pid, "ipc": s.Ipc, "userns_mode": s.UsernsMode} {
			if v == "host" {
				t.Errorf("%s: %s: host", name, k)
			}
		}
		if !slices.Contains(s.CapDrop, "ALL") {
			t.Errorf("%s: does not drop all capabilities", name)
		}
		if !slices.Contains(s.SecurityOpt, "no-new-privileges:true") {
			t.Errorf("%s: no no-new-privileges", name)
		}
		built := s.Build != nil
		if !built && !digestPinned.MatchString(s.Image) {
			t.Errorf("%s: image %q is not pinned by digest", name, s.Image)
		}
		if built && !strings.HasSuffix(s.Image, ":local") {
			t.Errorf("%s: a locally built image should be tagged :local, not %q (it would be mistaken for a registry's)", name, s.Image)
		}
		for _, p := range s.Ports {
			ip, pub, err := portSpec(p)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			if ip == "" || pub == "" || pub == "0" {
				t.Errorf("%s: port %v is not published explicitly (host address and port)", name, p)
			}
		}
		for _, v := range s.Volumes {
			if src := volumeSource(v); strings.HasPrefix(src, "/") || strings.HasPrefix(src, ".") {
				t.Errorf("%s: bind-mounts the host's %s", name, src)
			}
		}
		isNode := len(s.CapAdd) > 0 || len(s.Devices) > 0
		if isNode {
			nodes++
			for _, cp := range s.CapAdd {
				if !slices.Contains(nodeCaps, corev1.Capability(strings.TrimPrefix(cp, "CAP_"))) {
					t.Errorf("%s: adds %s", name, cp)
				}
			}
			checkNodeDevices(t, name, s.Devices, kvm)
			if len(s.Ports) > 0 {
				t.Errorf("%s: a node is reached through the gateway; do not publish it", name)
			}
			continue
		}
		if !s.ReadOnly {
			t.Errorf("%s: root filesystem is writable", name)
		}
	}
	if nodes < 2 {
		t.Errorf("%d nodes, want 2", nodes)
	}
	if len(c.Services["gateway"].Ports) == 0 {
		t.Errorf("the gateway publishes no port")
	}
}

// checkNodeDevices: /dev/net/tun always, /dev/kvm exactly when kvm.
func checkNodeDevices(t reporter, name string, devices []any, kvm bool) {
	t.Helper()
	hasKVM := false
	for _, d := range devices {
		switch h := deviceHost(d); h {
		case "/dev/kvm":
			hasKVM = true
		case "/dev/net/tun":
		default:
			t.Errorf("%s: device %s", name, h)
		}
	}
	if hasKVM && !kvm {
		t.Errorf("%s: maps /dev/kvm unconditionally: a host without KVM could not create the container (compose.kvm.yaml adds it)", name)
	}
	if !hasKVM && kvm {
		t.Errorf("%s: the KVM override does not map /dev/kvm", name)
	}
}

func TestCompose(t *testing.T) {
	path := filepath.Join(repoRoot(t), "deploy/compose.yaml")
	t.Run("file", func(t *testing.T) {
		checkCompose(t, decodeCompose(t, "compose.yaml", mustRead(t, path), true), false)
	})
	kvmPath := filepath.Join(repoRoot(t), "deploy/compose.kvm.yaml")
	t.Run("kvm override file", func(t *testing.T) {
		base := decodeCompose(t, "compose.yaml", mustRead(t, path), true)
		over := decodeCompose(t, "compose.kvm.yaml", mustRead(t, kvmPath), true)
		if len(over.Services) == 0 {
			t.Fatal("compose.kvm.yaml overrides no service")
		}
		for name, s := range over.Services {
			if b, ok := base.Services[name]; !ok || len(b.CapAdd) == 0 {
				t.Errorf("compose.kvm.yaml: %s is not a node of compose.yaml", name)
			}
			if len(s.Devices) != 1 || deviceHost(s.Devices[0]) != "/dev/kvm" {
				t.Errorf("compose.kvm.yaml: %s: devices %v, want only /dev/kvm", name, s.Devices)
			}
			if len(s.CapAdd) > 0 || s.Privileged || s.Image != "" {
				t.Errorf("compose.kvm.yaml: %s changes more than the devices", name)
			}
		}
	})
	// What Compose itself makes of the file (anchors merged, defaults
	// filled in), when a Compose CLI is installed: no engine is needed.
	t.Run("compose config", func(t *testing.T) {
		var cmd []string
		if out, err := exec.Command("docker", "compose", "version").CombinedOutput(); err == nil && bytes.Contains(out, []byte("version")) {
			cmd = []string{"docker", "compose"}
		} else if _, err := exec.LookPath("docker-compose"); err == nil {
			cmd = []string{"docker-compose"}
		} else {
			testenv.Missing(t, "no Compose CLI (docker compose or Debian's docker-compose; .ci/setup.d/50-deploy.sh installs it)")
		}
		for _, kvm := range []bool{false, true} {
			args := append(cmd[1:], "-f", path)
			if kvm {
				args = append(args, "-f", kvmPath)
			}
			out := run(t, filepath.Dir(path), nil, cmd[0], append(args, "config")...)
			c := decodeCompose(t, "compose config output", []byte(out), false)
			checkCompose(t, c, kvm)
			if len(c.Services) != 5 {
				t.Errorf("compose config (kvm override %v): %d services, want gateway, scheduler, redis and two nodes", kvm, len(c.Services))
			}
		}
	})
}

var fromLine = regexp.MustCompile(`(?im)^FROM\s+(\S+)(\s+AS\s+\S+)?\s*$`)

// TestDockerfiles checks the images' recipes: base images pinned by digest
// (or scratch), the scheduler and gateway from scratch as a non-root user,
// nothing downloaded but Debian packages, and every copied binary one that
// `make build` makes.
func TestDockerfiles(t *testing.T) {
	repo := repoRoot(t)
	files, _ := filepath.Glob(filepath.Join(repo, "deploy/docker/*.Dockerfile"))
	if len(files) != 3 {
		t.Fatalf("want node, scheduler and gateway Dockerfiles, have %v", files)
	}
	cmds, _ := filepath.Glob(filepath.Join(repo, "cmd/*"))
	known := []string{"aenv-scheduler", "aenv-gateway"} // built by the cluster work
	for _, c := range cmds {
		known = append(known, filepath.Base(c))
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".Dockerfile")
		text := string(mustRead(t, f))
		froms := fromLine.FindAllStringSubmatch(text, -1)
		if len(froms) == 0 {
			t.Errorf("%s: no FROM", name)
		}
		for _, m := range froms {
			if m[1] != "scratch" && !digestPinned.MatchString(m[1]) {
				t.Errorf("%s: FROM %s is not pinned by digest", name, m[1])
			}
		}
		if regexp.MustCompile(`(?i)\b(curl|wget)\b|^ADD\s+https?:`).MatchString(text) {
			t.Errorf("%s: downloads something; images build offline from our binaries and Debian packages", name)
		}
		for _, m := range regexp.MustCompile(`\$\{BIN\}/(\S+)`).FindAllStringSubmatch(text, -1) {
			if !slices.Contains(known, m[1]) {
				t.Errorf("%s: copies %s, which no cmd/ builds", name, m[1])
			}
		}
		users := regexp.MustCompile(`(?m)^USER\s+(\S+)`).FindAllStringSubmatch(text, -1)
		if name == "node" {
			continue // root in the container, with capabilities granted by compose/Kubernetes
		}
		if len(froms) != 1 || froms[0][1] != "scratch" {
			t.Errorf("%s: want a single FROM scratch", name)
		}
		if len(users) == 0 {
			t.Errorf("%s: no USER", name)
			continue
		}
		u := users[len(users)-1][1]
		if uid, _, _ := strings.Cut(u, ":"); uid == "0" || uid == "root" {
			t.Errorf("%s: USER %s", name, u)
		}
	}
}
