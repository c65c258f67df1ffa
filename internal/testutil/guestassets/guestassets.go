// Package guestassets gives tests the guest kernel, initramfs and root
// filesystem: it builds aenv-agent from this checkout and runs the guest
// image builder (cached by content hash, so only the first test run on a
// machine pays for debootstrap).
package guestassets

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/guest/image"
)

var (
	once   sync.Once
	assets *image.Assets
	err    error
)

// Get returns the assets, failing the test with a clear reason when they
// cannot be built (missing tools are named in the error).
func Get(t testing.TB) *image.Assets {
	t.Helper()
	once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		var agent string
		if agent, err = BuildAgent(ctx); err != nil {
			return
		}
		assets, err = image.Build(ctx, image.Options{Agent: agent})
	})
	if err != nil {
		t.Fatalf("guest assets: %v", err)
	}
	return assets
}

// BuildAgent compiles a static aenv-agent from this module.
func BuildAgent(ctx context.Context) (string, error) {
	root, err := moduleRoot(ctx)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(os.TempDir(), "aenv-test-bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	out, err := os.CreateTemp(dir, "aenv-agent-*")
	if err != nil {
		return "", err
	}
	out.Close()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out.Name(), "./cmd/aenv-agent")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", &buildError{string(b), err}
	}
	return out.Name(), nil
}

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return "build aenv-agent: " + e.err.Error() + ": " + e.out }

func moduleRoot(ctx context.Context) (string, error) {
	b, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	return filepath.Dir(strings.TrimSpace(string(b))), nil
}
