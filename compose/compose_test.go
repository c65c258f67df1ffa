package compose

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// twoServices is a project of two services on a network of their own:
// a web server the client reaches by its service name.
const twoServices = `
services:
  web:
    image: registry.example:5000/agentenv/web:1.0
    command: ["httpd", "-f", "-p", "8080"]
    ports: ["8080:8080"]
    networks: [backend]
    healthcheck:
      test: ["CMD", "wget", "-qO-", "http://127.0.0.1:8080/"]
      interval: 2s
      retries: 30
  client:
    image: registry.example:5000/agentenv/client@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
    command: sleep infinity
    environment:
      WEB_URL: http://web:8080/
    depends_on:
      web: {condition: service_healthy}
    networks: [backend]
networks:
  backend:
    driver: bridge
`

func TestParseAcceptsTwoServicesOnANetwork(t *testing.T) {
	p, err := Parse([]byte(twoServices))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(p.Services) != 2 {
		t.Fatalf("project = %+v", p)
	}
	web, client := p.Services[0], p.Services[1]
	if web.Name != "web" || web.Image != "registry.example:5000/agentenv/web:1.0" || !slices.Equal(web.Ports, []string{"8080"}) {
		t.Errorf("web = %+v", web)
	}
	if client.Name != "client" || !strings.HasPrefix(client.Image, "registry.example:5000/agentenv/client@sha256:") {
		t.Errorf("client = %+v", client)
	}
	if got := p.Images(); len(got) != 2 || got[0] != web.Image {
		t.Errorf("Images() = %v", got)
	}
}

// allowedKeys uses every kind of key and syntax the rules allow.
const allowedKeys = `
version: "3.9"
x-common: &common
  restart: unless-stopped
  environment: [MODE=test, "PRICE=$$5"]
  labels: {team: bench}
services:
  db:
    <<: *common
    image: postgres:16
    volumes: ["data:/var/lib/postgresql/data", "/scratch", {type: tmpfs, target: /run, tmpfs: {size: 64m}}]
    tmpfs: /tmp
    expose: ["5432", 9000-9001/udp]
    user: "999:999"
    stop_grace_period: 1m30s
    security_opt: [no-new-privileges:true]
    cap_drop: [ALL]
    read_only: true
    shm_size: 128m
  app:
    <<: *common
    image: alpine
    entrypoint: /bin/sh
    working_dir: /srv
    ports: ["127.0.0.1:8000:80/tcp", {target: 81, published: "8081", protocol: tcp}]
    networks:
      front: {aliases: [app.local]}
      default:
    depends_on: [db]
    links: ["db:database"]
    volumes: [{type: volume, source: data, target: /data, read_only: true, volume: {nocopy: true}}]
    extra_hosts: ["gateway:10.0.0.1"]
    hostname: app
    tty: true
    init: true
    cpus: "0.5"
    mem_limit: 256m
    platform: linux/amd64
    x-note: anything
networks:
  front:
volumes:
  data: {driver: local}
`

// moreKeys uses the remaining ones: network options, the other network
// modes, long depends_on, options of mounts.
const moreKeys = `
services:
  a:
    image: alpine
    domainname: example.com
    stop_signal: SIGTERM
    container_name: aa
    stdin_open: true
    networks: {n: {ipv4_address: 10.5.0.5, priority: 5}}
    depends_on: {b: {condition: service_completed_successfully}}
  b:
    image: alpine
    network_mode: none
    tmpfs: ["/run:size=64m"]
    volumes: ["v:/v:ro,nocopy"]
    extra_hosts: {gw: 10.0.0.1}
networks:
  n:
    driver: bridge
    internal: true
    enable_ipv6: false
    attachable: true
    labels: [a=b]
    name: n-net
volumes:
  v:
    labels: {a: b}
    name: v-vol
`

// TestParseAcceptsTheAllowedKeys: the keys and syntaxes the rules allow,
// extension fields merged by anchors included, pass.
func TestParseAcceptsTheAllowedKeys(t *testing.T) {
	if _, err := Parse([]byte(moreKeys)); err != nil {
		t.Fatalf("Parse of moreKeys: %v", err)
	}
	p, err := Parse([]byte(allowedKeys))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(p.Services) != 2 || !slices.Equal(p.Services[1].Ports, []string{"80", "81"}) {
		t.Fatalf("project = %+v", p)
	}
}

// TestParseRefusesHostileFiles: each file is refused and the refusal names
// the offending key path.
func TestParseRefusesHostileFiles(t *testing.T) {
	svc := func(body string) string { return "services:\n  web:\n    image: alpine\n" + body }
	cases := []struct{ name, file, path string }{
		{"build", "services:\n  web:\n    build: .\n", "services.web.build"},
		{"no image", "services:\n  web:\n    command: sh\n", "services.web.image"},
		{"privileged", svc("    privileged: true\n"), "services.web.privileged"},
		{"cap_add", svc("    cap_add: [SYS_ADMIN]\n"), "services.web.cap_add"},
		{"devices", svc("    devices: [/dev/kvm]\n"), "services.web.devices"},
		{"bind short", svc("    volumes: [\"/:/host\"]\n"), "services.web.volumes[0]"},
		{"bind relative", svc("    volumes: [\"./src:/src:ro\"]\n"), "services.web.volumes[0]"},
		{"bind home", svc("    volumes: [\"~/.ssh:/root/.ssh\"]\n"), "services.web.volumes[0]"},
		{"bind long", svc("    volumes: [{type: bind, source: /etc, target: /etc}]\n"), "services.web.volumes[0].type"},
		{"bind options", svc("    volumes: [{type: volume, target: /x, bind: {propagation: shared}}]\n"), "services.web.volumes[0].bind"},
		{"undeclared volume", svc("    volumes: [\"data:/data\"]\n"), "services.web.volumes[0]"},
		{"volume driver_opts", svc("    volumes: [\"data:/data\"]\n") + "volumes:\n  data:\n    driver_opts: {type: none, o: bind, device: /}\n", "volumes.data.driver_opts"},
		{"network_mode host", svc("    network_mode: host\n"), "services.web.network_mode"},
		{"network_mode container", svc("    network_mode: \"container:abc\"\n"), "services.web.network_mode"},
		{"pid host", svc("    pid: host\n"), "services.web.pid"},
		{"ipc host", svc("    ipc: host\n"), "services.web.ipc"},
		{"userns host", svc("    userns_mode: host\n"), "services.web.userns_mode"},
		{"seccomp unconfined", svc("    security_opt: [\"seccomp:unconfined\"]\n"), "services.web.security_opt[0]"},
		{"apparmor unconfined", svc("    security_opt: [apparmor=unconfined]\n"), "services.web.security_opt[0]"},
		{"sysctls", svc("    sysctls: {net.ipv4.ip_forward: 1}\n"), "services.web.sysctls"},
		{"env_file", svc("    env_file: /etc/shadow\n"), "services.web.env_file"},
		{"unknown service key", svc("    ulimits: {nofile: 1048576}\n"), "services.web.ulimits"},
		{"unknown top key", svc("") + "include: [other.yaml]\n", "include"},
		{"project name", svc("") + "name: mine\n", "name"},
		{"compose v2 only key", svc("    healthcheck: {test: [CMD, 'true'], start_interval: 1s}\n"), "services.web.healthcheck.start_interval"},
		{"secrets", svc("") + "secrets:\n  s: {file: /etc/shadow}\n", "secrets"},
		{"external network", svc("") + "networks:\n  n: {external: true}\n", "networks.n.external"},
		{"overlay driver", svc("") + "networks:\n  n: {driver: host}\n", "networks.n.driver"},
		{"undeclared network", svc("    networks: [other]\n"), "services.web.networks[0]"},
		{"interpolation", svc("    volumes: [\"${HOME}:/h\"]\n"), "services.web.volumes[0]"},
		{"interpolated image", "services:\n  web:\n    image: ${IMAGE}\n", "services.web.image"},
		{"duplicate key", svc("    command: a\n    command: b\n"), "services.web.command"},
		{"network_mode with networks", svc("    network_mode: bridge\n    networks: [default]\n"), "services.web.network_mode"},
		{"depends on itself", svc("    depends_on: [web]\n"), "services.web.depends_on[0]"},
		{"depends on nothing", svc("    depends_on: [db]\n"), "services.web.depends_on[0]"},
		{"bad port", svc("    ports: [\"70000:80\"]\n"), "services.web.ports[0]"},
		{"bad image", "services:\n  web:\n    image: \"UPPER CASE!\"\n", "services.web.image"},
		{"custom tag", svc("    command: !reset []\n"), "services.web.command"},
		{"bad service name", "services:\n  \"../x\":\n    image: alpine\n", "services.../x"},
		{"no services", "services: {}\n", "services"},
		{"services missing", "version: '3'\n", "services"},
		{"two merge keys", "x-a: &a {command: a}\nx-b: &b {volumes: [\"/:/h\"]}\nservices:\n  web:\n    image: alpine\n    <<: *a\n    <<: *b\n", "services.web.<<"},
		{"key merged twice", "x-a: &a {command: a}\nx-b: &b {command: b}\nservices:\n  web:\n    image: alpine\n    <<: [*a, *b]\n", "services.web.command"},
		{"number not written plainly", svc("    healthcheck: {retries: 0x10}\n"), "services.web.healthcheck.retries"},
		{"number as image", "services:\n  web:\n    image: 00\n", "services.web.image"},
		{"merged privileged", "x-p: &p {privileged: true}\nservices:\n  web:\n    <<: *p\n    image: alpine\n", "services.web.privileged"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.file))
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("Parse accepted or failed without Errors: %v", err)
			}
			if !slices.Contains(es.Paths(), tc.path) {
				t.Fatalf("refusal %q does not name %s", err, tc.path)
			}
		})
	}
}

// TestParseRefusesTheBounds: the size, service count, document count and
// structure bounds.
func TestParseRefusesTheBounds(t *testing.T) {
	many := "services:\n"
	for i := range MaxServices + 1 {
		many += "  s" + string(rune('a'+i)) + ":\n    image: alpine\n"
	}
	cases := map[string]struct{ file, want string }{
		"empty":        {"", "empty"},
		"too large":    {"services: {}\n#" + strings.Repeat("x", MaxFileBytes), "more than the"},
		"25 services":  {many, "a project has 1 to 24"},
		"two docs":     {"services:\n  a: {image: alpine}\n---\nservices:\n  b: {privileged: true}\n", "more than one YAML document"},
		"flow flood":   {"x-a: [" + strings.Repeat("a,", maxStructure) + "]\nservices: {a: {image: alpine}}\n", "structural YAML characters"},
		"not yaml":     {"services: [\n", "not valid YAML"},
		"not a map":    {"- a\n- b\n", "must be a mapping"},
		"deep nesting": {"x-a: " + strings.Repeat("[", 40) + strings.Repeat("]", 40) + "\nservices: {a: {image: alpine}}\n", "nested more than"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(tc.file))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse = %v, want a refusal saying %q", err, tc.want)
			}
		})
	}
}

// TestParseRefusesAnAliasBomb: nine levels of nine aliases each would
// expand to 9^9 nodes; the walk gives up at its budget instead.
func TestParseRefusesAnAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("x-0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n")
	for i := 1; i <= 9; i++ {
		prev := "*a" + string(rune('0'+i-1))
		b.WriteString("x-" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [" + strings.Repeat(prev+", ", 8) + prev + "]\n")
	}
	b.WriteString("services:\n  web:\n    image: alpine\n    command: *a9\n")
	_, err := Parse([]byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "expands to more than") {
		t.Fatalf("Parse = %v, want the alias budget refusal", err)
	}
}

// TestParseRefusesASelfReference: an anchor used inside its own node
// makes a cycle; the walk ends on its depth bound.
func TestParseRefusesASelfReference(t *testing.T) {
	_, err := Parse([]byte("x-a: &a [*a]\nservices: {a: {image: alpine}}\n"))
	if err == nil {
		t.Fatal("Parse accepted a self-referencing anchor")
	}
}

// TestParseFileIsTheCheckedReading: Project.File is JSON with the merges
// resolved as checked, extension fields left out and values typed as this
// parser read them (an unquoted 80:80 is text, not YAML 1.1's base 60).
func TestParseFileIsTheCheckedReading(t *testing.T) {
	const file = `
x-base: &base
  restart: always
  environment: {A: "1"}
services:
  web:
    <<: *base
    image: alpine
    environment: {B: 2}
    ports: [80:80]
    labels: {note: "caf\u00e9\u0085\U0001F600"}
    x-note: dropped
`
	p, err := Parse([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(p.File, &doc); err != nil {
		t.Fatalf("File is not JSON: %v\n%s", err, p.File)
	}
	web := doc["services"].(map[string]any)["web"].(map[string]any)
	if _, ok := doc["x-base"]; ok || web["x-note"] != nil {
		t.Errorf("extension fields kept: %s", p.File)
	}
	if web["restart"] != "always" || !reflect.DeepEqual(web["environment"], map[string]any{"B": float64(2)}) {
		t.Errorf("merge not resolved as checked (own keys win): %s", p.File)
	}
	for _, b := range p.File {
		if b >= 0x80 {
			t.Fatalf("File has a non-ASCII byte: %s", p.File)
		}
	}
	if got := web["labels"].(map[string]any)["note"]; got != "caf\u00e9\u0085\U0001F600" {
		t.Errorf("label = %q after the escapes", got)
	}
	if !reflect.DeepEqual(web["ports"], []any{"80:80"}) {
		t.Errorf("ports = %#v, want the text 80:80", web["ports"])
	}
}

// TestParseRefusesLongValuesRepeated: a long value used through an alias
// many times costs its length at every use; the walk stops at its bound.
func TestParseRefusesLongValuesRepeated(t *testing.T) {
	file := "x-a: &a " + strings.Repeat("y", 100<<10) + "\nservices:\n  web:\n    image: alpine\n    command: [" +
		strings.Repeat("*a, ", 100) + "*a]\n"
	_, err := Parse([]byte(file))
	if err == nil || !strings.Contains(err.Error(), "bytes of values") {
		t.Fatalf("Parse = %v, want the value bytes refusal", err)
	}
}
