package clientcfg

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSaveLoad(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", "")
	t.Setenv("AENV_URL", "")
	t.Setenv("AENV_API_KEY", "")
	c, err := Load()
	if err != nil || c.URL != DefaultURL || c.APIKey != "" {
		t.Fatalf("empty config: %+v %v", c, err)
	}
	p, err := Save(Config{URL: "http://node:3000/", APIKey: " key "})
	if err != nil {
		t.Fatal(err)
	}
	if p != filepath.Join(home, ".config", "aenv", "config.json") {
		t.Fatalf("path %s", p)
	}
	if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v %v", st.Mode(), err)
	}
	if c, err = Load(); err != nil || c.URL != "http://node:3000" || c.APIKey != "key" {
		t.Fatalf("loaded %+v %v", c, err)
	}
	t.Setenv("AENV_URL", "http://other:1")
	t.Setenv("AENV_API_KEY", "envkey")
	if c, _ = Load(); c.URL != "http://other:1" || c.APIKey != "envkey" {
		t.Fatalf("env override %+v", c)
	}
	if _, err := Save(Config{URL: "node:3000", APIKey: "k"}); err == nil {
		t.Fatal("saved a URL without scheme")
	}
	if _, err := Save(Config{URL: "http://n", APIKey: ""}); err == nil {
		t.Fatal("saved an empty key")
	}
	if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(); err == nil {
		t.Fatal("loaded a broken config")
	}
}
