package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/config"
)

func mode(t *testing.T, p string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// TestStateIsPrivate: the data dir is made 0700 and an existing wider one is
// tightened, the API key file is 0600 even when an older start left it
// wider, and the storage daemon's directory and log are not readable by
// other users.
func TestStateIsPrivate(t *testing.T) {
	cfg := config.Default()
	cfg.DataDir = filepath.Join(t.TempDir(), "new")
	if err := privateDataDir(cfg.DataDir); err != nil {
		t.Fatal(err)
	}
	if m := mode(t, cfg.DataDir); m != 0o700 {
		t.Errorf("new data dir mode %v, want 0700", m)
	}

	cfg.DataDir = filepath.Join(t.TempDir(), "old")
	storage := filepath.Join(cfg.DataDir, "storage")
	if err := os.MkdirAll(storage, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(cfg.DataDir, 0o755)
	if err := os.WriteFile(cfg.KeyFilePath(), []byte("e2b_old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(storage, "storaged.log")
	if err := os.WriteFile(log, []byte("old log\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := privateDataDir(cfg.DataDir); err != nil {
		t.Fatal(err)
	}
	if m := mode(t, cfg.DataDir); m != 0o700 {
		t.Errorf("existing data dir mode %v, want tightened to 0700", m)
	}
	if k, err := apiKey(cfg); err != nil || k != "e2b_old" {
		t.Fatalf("stored key: %q %v", k, err)
	}
	if m := mode(t, cfg.KeyFilePath()); m != 0o600 {
		t.Errorf("existing key file mode %v, want tightened to 0600", m)
	}
	if err := privateStorageDir(storage, log); err != nil {
		t.Fatal(err)
	}
	if m := mode(t, storage); m != 0o700 {
		t.Errorf("storage dir mode %v, want 0700", m)
	}
	if m := mode(t, log); m&0o077 != 0 {
		t.Errorf("storaged.log mode %v, readable by other users", m)
	}
}
