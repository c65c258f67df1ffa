// Package clientcfg stores and loads the aenv CLI's connection settings: the
// aenvd URL and API key, kept in ~/.config/aenv/config.json (mode 0600) and
// overridden by the AENV_URL and AENV_API_KEY environment variables.
package clientcfg

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentenv/agentenv/internal/atomicfile"
)

// DefaultURL is aenvd's default API address.
const DefaultURL = "http://127.0.0.1:3000"

// Config is what the CLI needs to reach a node.
type Config struct {
	URL    string `json:"url"`
	APIKey string `json:"apiKey"`
}

// Dir is the directory holding the config file: $XDG_CONFIG_HOME/aenv or
// ~/.config/aenv.
func Dir() (string, error) {
	if x := os.Getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "aenv"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("find the home directory for the aenv config: %w", err)
	}
	return filepath.Join(home, ".config", "aenv"), nil
}

// Path is the config file's path.
func Path() (string, error) {
	dir, err := Dir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "config.json"), nil
}

// Load reads the stored config (a missing file is an empty config) and
// applies the environment overrides and the default URL.
func Load() (Config, error) {
	var c Config
	p, err := Path()
	if err != nil {
		return c, err
	}
	b, err := os.ReadFile(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return c, fmt.Errorf("read aenv config %s: %w", p, err)
	default:
		if err := json.Unmarshal(b, &c); err != nil {
			return c, fmt.Errorf("parse aenv config %s: %w (fix it or run `aenv auth` again)", p, err)
		}
	}
	if v := os.Getenv("AENV_URL"); v != "" {
		c.URL = v
	}
	if v := os.Getenv("AENV_API_KEY"); v != "" {
		c.APIKey = v
	}
	if c.URL == "" {
		c.URL = DefaultURL
	}
	return c, nil
}

// Save validates c and writes it with mode 0600 (directory 0700).
func Save(c Config) (string, error) {
	c.URL = strings.TrimRight(strings.TrimSpace(c.URL), "/")
	c.APIKey = strings.TrimSpace(c.APIKey)
	if err := ValidateURL(c.URL); err != nil {
		return "", err
	}
	if c.APIKey == "" {
		return "", errors.New("the API key is empty: pass the key aenvd was started with (AENVD_API_KEY)")
	}
	dir, err := Dir()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("create aenv config directory %s: %w", dir, err)
	}
	p := filepath.Join(dir, "config.json")
	b, _ := json.MarshalIndent(c, "", "  ")
	if err := atomicfile.WriteFile(p, append(b, '\n'), 0o600); err != nil {
		return "", fmt.Errorf("write aenv config: %w", err)
	}
	return p, nil
}

// ValidateURL accepts http(s) URLs with a host.
func ValidateURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("server URL %q is not an http(s) URL such as %s", s, DefaultURL)
	}
	return nil
}
