package main

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/agentenv/agentenv/config"
)

func TestAPIKeyGeneratedOnceWithMode0600(t *testing.T) {
	cfg := config.Default()
	cfg.DataDir = t.TempDir()
	k1, err := apiKey(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(k1) {
		t.Fatalf("generated key %q is not e2b_<40 hex>", k1)
	}
	st, err := os.Stat(filepath.Join(cfg.DataDir, "api-key"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v mode %v, want 0600", err, st.Mode().Perm())
	}
	k2, err := apiKey(cfg)
	if err != nil || k2 != k1 {
		t.Fatalf("second start: key %q (%v), want the stored %q", k2, err, k1)
	}
	cfg.API.Key = "e2b_configured"
	if k, _ := apiKey(cfg); k != "e2b_configured" {
		t.Fatalf("configured key ignored: %q", k)
	}
}

func TestNetworkConfig(t *testing.T) {
	cfg := config.Default()
	nc, err := networkConfig(cfg, nil, nil)
	if err != nil || nc.HostCIDR.String() != "10.11.0.0/16" || nc.VethCIDR.String() != "10.12.0.0/16" || nc.Prefix != "aenv" {
		t.Fatalf("network config from defaults: %+v %v", nc, err)
	}
	cfg.Network.HostCIDR = "10.1.2.3/99"
	if _, err := networkConfig(cfg, nil, nil); err == nil {
		t.Fatal("bad host CIDR accepted")
	}
}
