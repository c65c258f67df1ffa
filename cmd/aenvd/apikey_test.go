package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/config"
	"github.com/agentenv/agentenv/internal/crashdisk"
)

// TestAPIKeySurvivesPowerLoss: once the first start has generated the key
// (and logged where it is), a power loss leaves the key file holding that
// key, so the next start serves the key clients were given instead of an
// empty file it would replace with a new one.
func TestAPIKeySurvivesPowerLoss(t *testing.T) {
	d := crashdisk.New(t, 64)
	cfg := config.Default()
	cfg.DataDir = filepath.Join(d.Root(), "data")
	if err := os.Mkdir(cfg.DataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	k, err := apiKey(cfg)
	if err != nil {
		t.Fatal(err)
	}
	crashed := d.Crash()
	b, err := os.ReadFile(filepath.Join(crashed, "data", "api-key"))
	if err != nil || strings.TrimSpace(string(b)) != k {
		t.Fatalf("key file after a power loss: %q (%v), want %q", b, err, k)
	}
	cfg.DataDir = filepath.Join(crashed, "data")
	if again, err := apiKey(cfg); err != nil || again != k {
		t.Fatalf("start after a power loss: key %q (%v), want %q", again, err, k)
	}
}
