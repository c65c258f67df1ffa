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
	"github.com/agentenv/agentenv/internal/digest"
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

// BuildAgent compiles a static aenv-agent from this module. The binary is
// kept under a name made of its content hash (the build is reproducible),
// so repeated test runs share one file instead of piling up copies.
func BuildAgent(ctx context.Context) (string, error) {
	root, err := moduleRoot(ctx)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(os.TempDir(), "aenv-test-bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	out, err := os.CreateTemp(dir, "build-*")
	if err != nil {
		return "", err
	}
	out.Close()
	defer os.Remove(out.Name()) // after a failed build; gone by rename otherwise
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out.Name(), "./cmd/aenv-agent")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", &buildError{string(b), err}
	}
	sum, err := digest.File(out.Name())
	if err != nil {
		return "", err
	}
	final := filepath.Join(dir, "aenv-agent-"+sum)
	if err := os.Rename(out.Name(), final); err != nil {
		return "", err
	}
	removeStale(dir, final)
	return final, nil
}

// removeStale deletes agent binaries of other builds older than an hour
// (a run still using one started within the hour) and older unnamed copies.
func removeStale(dir, keep string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		info, err := e.Info()
		if p == keep || err != nil || time.Since(info.ModTime()) < time.Hour {
			continue
		}
		if strings.HasPrefix(e.Name(), "aenv-agent-") || strings.HasPrefix(e.Name(), "build-") {
			os.Remove(p)
		}
	}
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
