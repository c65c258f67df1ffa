package image

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/storage/blob"
	"github.com/agentenv/agentenv/storage/lsmt"
)

// Config describes an image: sealed lower layers listed bottom to top and an
// optional writable upper. Relative paths are relative to the config file.
// A lower is a file or a URL: http(s), or http+unix (a server on a local
// Unix socket, storage/blob's unix.go: how a node serves the layers it has
// not fetched yet to its storage daemon).
//
//	{"lowers": [{"file": "base.lsmt"}, {"url": "http://host/v2/x/blobs/sha256:..."}],
//	 "upper": {"data": "upper.data", "index": "upper.index"}}
type Config struct {
	Lowers []LayerRef `json:"lowers"`
	Upper  *UpperRef  `json:"upper,omitempty"`
}

// LayerRef names one sealed layer (plain LSMT or ZFile): a local file or a URL.
type LayerRef struct {
	File string `json:"file,omitempty"`
	URL  string `json:"url,omitempty"`
}

// UpperRef names the writable layer: data + index files, or one sparse data file.
type UpperRef struct {
	Data   string `json:"data"`
	Index  string `json:"index,omitempty"`
	Sparse bool   `json:"sparse,omitempty"`
}

// maxConfigSize bounds what ParseConfig accepts.
const maxConfigSize = 1 << 20

// ParseConfig decodes and validates a config.
func ParseConfig(b []byte) (*Config, error) {
	if len(b) > maxConfigSize {
		return nil, fmt.Errorf("image config is %d bytes, more than %d", len(b), maxConfigSize)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var c Config
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("image config: trailing data after the JSON object")
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Validate checks the config's shape (not the files).
func (c *Config) Validate() error {
	if len(c.Lowers) > lsmt.MaxLayers {
		return fmt.Errorf("image config: %d lower layers, at most %d", len(c.Lowers), lsmt.MaxLayers)
	}
	if len(c.Lowers) == 0 && c.Upper == nil {
		return fmt.Errorf("image config: no lowers and no upper")
	}
	for i, l := range c.Lowers {
		switch {
		case (l.File == "") == (l.URL == ""):
			return fmt.Errorf("image config: lowers[%d] must have exactly one of file or url", i)
		case l.URL != "" && !blob.IsURL(l.URL):
			return fmt.Errorf("image config: lowers[%d].url %q is not http(s) or http+unix", i, l.URL)
		case strings.HasPrefix(l.URL, "http+unix:"):
			if _, _, err := blob.ParseUnixURL(l.URL); err != nil {
				return fmt.Errorf("image config: lowers[%d]: %w", i, err)
			}
		}
	}
	if u := c.Upper; u != nil {
		switch {
		case u.Data == "":
			return fmt.Errorf("image config: upper.data is empty")
		case u.Sparse && u.Index != "":
			return fmt.Errorf("image config: a sparse upper has no index file")
		case !u.Sparse && u.Index == "":
			return fmt.Errorf("image config: upper.index is empty (set sparse for a sparse upper)")
		}
	}
	return nil
}

// LoadConfig reads and validates a config file.
func LoadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load image config: %w", err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Save writes the config atomically and durably (internal/atomicfile): after
// a crash or a power loss path holds the old config or the whole new one.
func (c *Config) Save(path string) error {
	if err := c.Validate(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("save image config %s: %w", path, err)
	}
	return nil
}

func resolve(dir, p string) string {
	if p == "" || filepath.IsAbs(p) || blob.IsURL(p) {
		return p
	}
	return filepath.Join(dir, p)
}
