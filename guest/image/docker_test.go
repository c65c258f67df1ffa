package image

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/kernelpkg"
	"github.com/agentenv/agentenv/internal/testenv"
)

// TestDockerNeedsOfTheGuestKernel: the guest's kernel (the node's cached
// extraction of DefaultKernelPackage, read only) has every option of
// DockerKernelConfig, and DockerModules resolve to module files with their
// dependencies, as an initramfs or a variant's tree would load them.
func TestDockerNeedsOfTheGuestKernel(t *testing.T) {
	k, err := kernelpkg.Cached(DefaultCacheDir(), DefaultKernelPackage)
	if err != nil {
		testenv.Missing(t, "the guest kernel is not cached (make setup builds the guest image): %v", err)
	}
	config := readKernelConfig(t, filepath.Join(k.Dir, "boot", "config-"+k.Version))
	for _, opt := range DockerKernelConfig {
		if v := config["CONFIG_"+opt]; v != "y" && v != "m" {
			t.Errorf("CONFIG_%s is %q in %s, want y or m", opt, v, k.Version)
		}
	}
	order, err := kernelpkg.ResolveModules(k.ModDir, DockerModules)
	if err != nil {
		t.Fatalf("resolve Docker's modules: %v", err)
	}
	names := make([]string, len(order))
	for i, rel := range order {
		names[i] = kernelpkg.ModuleName(rel)
	}
	for _, want := range DockerModules {
		if !slices.Contains(names, want) {
			t.Errorf("%s is not among the modules to load %v", want, names)
		}
	}
	// A dependency is loaded before what needs it: br_netfilter needs bridge.
	if i, j := slices.Index(names, "bridge"), slices.Index(names, "br_netfilter"); i < 0 || j < 0 || i > j {
		t.Errorf("load order %v has br_netfilter before bridge", names)
	}
	t.Logf("%d modules: %v", len(names), names)
}

func readKernelConfig(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("kernel config: %v", err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && strings.HasPrefix(k, "CONFIG_") {
			out[k] = v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("kernel config: %v", err)
	}
	return out
}
