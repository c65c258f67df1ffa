package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

func TestDefaultRoundTrip(t *testing.T) {
	def := Default()
	text, err := def.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, `default_timeout = "15s"`) || !strings.Contains(text, "[network]") {
		t.Fatalf("encoded defaults lack expected keys:\n%s", text)
	}
	path := filepath.Join(t.TempDir(), "aenvd.toml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, def) {
		t.Fatalf("round trip changed the config:\n got %+v\nwant %+v", got, def)
	}
}

func TestFileAndEnvOverrides(t *testing.T) {
	path := filepath.Join(t.TempDir(), "aenvd.toml")
	body := "data_dir = \"/srv/aenv\"\n[guest]\nmemory_mib = 1024\n[sandbox]\ndefault_timeout = \"1m\"\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AENVD_API_LISTEN", "0.0.0.0:9999")
	t.Setenv("AENVD_GUEST_VCPUS", "2")
	t.Setenv("AENVD_SANDBOX_PAUSE_ON_SHUTDOWN", "false")
	t.Setenv("AENVD_IMAGE_INSECURE_REGISTRIES", "127.0.0.1:5000, localhost:5001")
	t.Setenv("AENVD_VMM_UID_BASE", "3000000000")
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.DataDir != "/srv/aenv" || c.Guest.MemoryMiB != 1024 || c.Sandbox.DefaultTimeout.Duration != time.Minute {
		t.Fatalf("file values not applied: %+v", c)
	}
	if c.API.Listen != "0.0.0.0:9999" || c.Guest.VCPUs != 2 || c.Sandbox.PauseOnShutdown {
		t.Fatalf("environment overrides not applied: %+v", c)
	}
	if !reflect.DeepEqual(c.Image.InsecureRegistries, []string{"127.0.0.1:5000", "localhost:5001"}) ||
		c.Image.DefaultRegistry != "docker.io" || c.ImageCacheDir() != "/srv/aenv/oci" {
		t.Fatalf("image section: %+v (cache %s)", c.Image, c.ImageCacheDir())
	}
	if c.VMM.UIDBase != 3_000_000_000 {
		t.Fatalf("vmm.uid_base from the environment: %d", c.VMM.UIDBase)
	}
	if c.KeyFilePath() != "/srv/aenv/api-key" {
		t.Fatalf("key file default: %s", c.KeyFilePath())
	}
}

func TestRejects(t *testing.T) {
	dir := t.TempDir()
	cases := map[string]string{
		"unknown key":  "bogus = 1\n",
		"bad duration": "[sandbox]\ndefault_timeout = \"soon\"\n",
		"bad driver":   "[vmm]\ndriver = \"xen\"\n",
		"negative uid": "[vmm]\nuid_base = -1\n",
		"uid overflow": "[vmm]\nuid_base = 4294967000\n",
		"tiny memory":  "[guest]\nmemory_mib = 8\n",
		"pool low 0":   "[vmm_pool]\nlow = 0\nhigh = 2\n",
		"pool inverse": "[vmm_pool]\nlow = 3\nhigh = 2\n",
		"not toml":     "this is = = not toml",
	}
	for name, body := range cases {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(path); err == nil {
			t.Errorf("%s: Load accepted %q", name, body)
		}
	}
	t.Setenv("AENVD_GUEST_VCPUS", "many")
	if _, err := Load(""); err == nil {
		t.Error("Load accepted AENVD_GUEST_VCPUS=many")
	}
}

// TestDocumentedDefaults: --print-default-config output is valid TOML that
// decodes to the defaults, and every key comes with its documentation and
// environment variable.
func TestDocumentedDefaults(t *testing.T) {
	t.Parallel()
	text, err := Default().EncodeDocumented()
	if err != nil {
		t.Fatal(err)
	}
	var got Config
	if _, err := toml.Decode(text, &got); err != nil {
		t.Fatalf("documented defaults are not TOML: %v\n%s", err, text)
	}
	if !reflect.DeepEqual(got, Default()) {
		t.Fatalf("documented defaults decode to %+v, want %+v", got, Default())
	}
	lines := strings.Split(text, "\n")
	keys := 0
	for i, l := range lines {
		if l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, "[") {
			continue
		}
		keys++
		if i == 0 || !strings.HasPrefix(lines[i-1], "# Environment: AENVD_") {
			t.Errorf("key line %q has no environment variable above it", l)
		}
	}
	docs, err := fieldDocs()
	if err != nil {
		t.Fatal(err)
	}
	var undocumented []string
	var walk func(reflect.Type)
	walk = func(rt reflect.Type) {
		for i := range rt.NumField() {
			f := rt.Field(i)
			if f.Tag.Get("env") != "" && strings.TrimSpace(docs[rt.Name()][f.Name]) == "" {
				undocumented = append(undocumented, rt.Name()+"."+f.Name)
			} else if f.Tag.Get("env") == "" && f.Type.Kind() == reflect.Struct {
				if strings.TrimSpace(docs["type "+f.Type.Name()][""]) == "" {
					undocumented = append(undocumented, "type "+f.Type.Name())
				}
				walk(f.Type)
			}
		}
	}
	walk(reflect.TypeOf(Config{}))
	if len(undocumented) > 0 {
		t.Errorf("settings without documentation: %v", undocumented)
	}
	if want := countEnvTags(reflect.TypeOf(Config{})); keys != want {
		t.Errorf("%d keys printed, %d settings exist", keys, want)
	}
}

func countEnvTags(t reflect.Type) int {
	n := 0
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Tag.Get("env") != "" {
			n++
		} else if f.Type.Kind() == reflect.Struct {
			n += countEnvTags(f.Type)
		}
	}
	return n
}

// TestRepositorySection: the [repository] section's defaults, overrides and
// refusals.
func TestRepositorySection(t *testing.T) {
	t.Parallel()
	c := Default()
	c.DataDir = "/srv/aenv"
	if c.Repository.Backend != "none" || c.RepositoryDir() != "/srv/aenv/repository" || c.Validate() != nil {
		t.Fatalf("defaults: %+v (%s): %v", c.Repository, c.RepositoryDir(), c.Validate())
	}
	path := filepath.Join(t.TempDir(), "aenvd.toml")
	body := "[repository]\nbackend = \"s3\"\nendpoint = \"http://127.0.0.1:7070\"\nbucket = \"snaps\"\npeers = [\"http://10.0.0.2:3002\"]\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil || got.Repository.Backend != "s3" || got.Repository.Bucket != "snaps" || len(got.Repository.Peers) != 1 {
		t.Fatalf("load: %+v, %v", got.Repository, err)
	}
	bad := map[string]func(r *Repository){
		"backend":     func(r *Repository) { r.Backend = "ftp" },
		"no bucket":   func(r *Repository) { r.Backend, r.Endpoint = "s3", "http://x" },
		"half a key":  func(r *Repository) { r.AccessKey = "a" },
		"chunk size":  func(r *Repository) { r.ChunkSizeKiB = 300 },
		"concurrency": func(r *Repository) { r.UploadConcurrency = 0 },
		"lease":       func(r *Repository) { r.LeaseTTL = Duration{} },
		"gc interval": func(r *Repository) { r.GCInterval = Duration{-time.Second} },
	}
	for name, mutate := range bad {
		c := Default()
		mutate(&c.Repository)
		if c.Validate() == nil {
			t.Errorf("%s: accepted %+v", name, c.Repository)
		}
	}
}

func TestClusterSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "aenvd.toml")
	body := "[cluster]\nnode_name = \"n1\"\nadvertise_url = \"http://10.0.0.1:3000\"\nmax_sandboxes = 20\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AENVD_CLUSTER_SCHEDULER", "10.0.0.9:7070, 10.0.0.10:7070")
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	want := Cluster{Scheduler: []string{"10.0.0.9:7070", "10.0.0.10:7070"}, NodeName: "n1",
		AdvertiseURL: "http://10.0.0.1:3000", CPUOvercommit: 4, MaxSandboxes: 20}
	if !reflect.DeepEqual(c.Cluster, want) {
		t.Fatalf("cluster section: %+v, want %+v", c.Cluster, want)
	}
	t.Setenv("AENVD_CLUSTER_CPU_OVERCOMMIT", "0")
	if _, err := Load(path); err == nil {
		t.Fatal("cpu_overcommit 0 accepted")
	}
}

func TestIsSet(t *testing.T) {
	path := filepath.Join(t.TempDir(), "aenvd.toml")
	if err := os.WriteFile(path, []byte("[storage]\nmemory_devices = false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AENVD_SANDBOX_CGROUPS", "true")
	for _, c := range []struct {
		path, section, key string
		want               bool
	}{
		{path, "storage", "memory_devices", true},
		{path, "storage", "backend", false},
		{"", "storage", "memory_devices", false},
		{"", "sandbox", "cgroups", true}, // from the environment
	} {
		got, err := IsSet(c.path, c.section, c.key)
		if err != nil || got != c.want {
			t.Errorf("IsSet(%q, %s.%s) = %v, %v; want %v", c.path, c.section, c.key, got, err, c.want)
		}
	}
}
