// Package kernelpkg is the one way AgentENV gets a Debian kernel: the
// package is downloaded with `apt-get download` and extracted with
// `dpkg-deb -x` (never installed) into a cache directory, once, and the
// modules to load are resolved from the extracted tree. The guest image
// (guest/image) and the kernel lane (internal/kernellane) both boot
// kernels got this way.
//
// Layout under the cache directory: kernel/<sha256 of the package
// file>/ is the extracted tree, with a file "package" naming the package
// file; kernel/<package>.ref holds the name of the tree's directory. A
// tree that an older release extracted to kernel/<package>/ is used as it
// is.
package kernelpkg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/digest"
)

// ErrUnavailable means the kernel package is neither cached nor
// downloadable (no apt-get, or apt-get cannot fetch it).
var ErrUnavailable = errors.New("kernel package unavailable")

// Kernel is an extracted kernel package.
type Kernel struct {
	// Package is the package file's name (name_version_arch.deb): it
	// names the exact build. Empty for a tree extracted before the name
	// was recorded.
	Package string
	Dir     string // the extracted tree
	Version string // uname -r of the kernel
	Vmlinuz string
	ModDir  string // Dir/lib/modules/<Version>
}

// Fetch returns the cached extraction of pkg under cacheDir, downloading
// and extracting it on first use. A meta package (linux-image-6.12-cloud-
// amd64) is followed to the package it depends on. Concurrent callers, in
// this process or others, serialise on a lock file. log (may be nil) hears
// of a download.
func Fetch(ctx context.Context, cacheDir, pkg string, log *slog.Logger) (*Kernel, error) {
	if k, err := load(cacheDir, pkg); err == nil {
		return k, nil
	}
	unlock, err := lock(ctx, filepath.Join(cacheDir, "kernel.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if k, err := load(cacheDir, pkg); err == nil { // fetched while we waited
		return k, nil
	}
	if log != nil {
		log.Info("downloading kernel package", "package", pkg, "cache", cacheDir)
	}
	tmp, err := os.MkdirTemp(cacheDir, ".kernel-")
	if err != nil {
		return nil, fmt.Errorf("fetch kernel package %s: %w", pkg, err)
	}
	defer os.RemoveAll(tmp)
	deb, err := download(ctx, tmp, pkg)
	if err != nil {
		return nil, err
	}
	dir, err := extract(ctx, cacheDir, tmp, deb)
	if err != nil {
		return nil, err
	}
	ref := filepath.Join(cacheDir, "kernel", pkg+".ref")
	if err := atomicfile.WriteFile(ref, []byte(filepath.Base(dir)+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("fetch kernel package %s: %w", pkg, err)
	}
	return load(cacheDir, pkg)
}

// download fetches pkg's package file into dir, or that of the package a
// meta package depends on.
func download(ctx context.Context, dir, pkg string) (string, error) {
	deb, err := aptDownload(ctx, dir, pkg)
	if err != nil || debHasKernel(ctx, deb) {
		return deb, err
	}
	out, err := exec.CommandContext(ctx, "dpkg-deb", "-f", deb, "Depends").Output()
	if err != nil {
		return "", fmt.Errorf("read Depends of %s: %w", deb, err)
	}
	first := strings.Fields(strings.Split(string(out), ",")[0])
	if len(first) == 0 {
		return "", fmt.Errorf("%s has neither a kernel nor a dependency", deb)
	}
	return aptDownload(ctx, dir, first[0])
}

// extract unpacks deb into cacheDir/kernel/<sha256 of deb> unless it is
// there already, and returns that directory.
func extract(ctx context.Context, cacheDir, tmp, deb string) (string, error) {
	sum, err := digest.File(deb)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cacheDir, "kernel", sum)
	name := []byte(filepath.Base(deb))
	if _, err := os.Stat(dir); err == nil {
		// Extracted before the package name was recorded.
		if err := atomicfile.WriteFile(filepath.Join(dir, "package"), name, 0o644); err != nil {
			return "", fmt.Errorf("extract %s: %w", deb, err)
		}
		return dir, nil
	}
	root := filepath.Join(tmp, "root")
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, root).CombinedOutput(); err != nil {
		return "", fmt.Errorf("extract %s: %w: %s", deb, err, out)
	}
	if err := os.WriteFile(filepath.Join(root, "package"), name, 0o644); err != nil {
		return "", fmt.Errorf("extract %s: %w", deb, err)
	}
	if err := atomicfile.SyncTree(root); err != nil {
		return "", fmt.Errorf("extract %s: %w", deb, err)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", fmt.Errorf("extract %s: %w", deb, err)
	}
	if err := atomicfile.Rename(root, dir); err != nil {
		return "", fmt.Errorf("extract %s: publish %s: %w", deb, dir, err)
	}
	return dir, nil
}

// Cached returns the cached tree of pkg under cacheDir without fetching
// it: an error when it is not there.
func Cached(cacheDir, pkg string) (*Kernel, error) { return load(cacheDir, pkg) }

// load reads the cached tree of pkg: the one its ref names, else one an
// older release extracted to kernel/<pkg>.
func load(cacheDir, pkg string) (*Kernel, error) {
	dir := filepath.Join(cacheDir, "kernel", pkg)
	if b, err := os.ReadFile(dir + ".ref"); err == nil {
		dir = filepath.Join(cacheDir, "kernel", strings.TrimSpace(string(b)))
	} else if _, err := os.Stat(filepath.Join(dir, "package")); err != nil {
		return nil, fmt.Errorf("kernel package %s: not cached: %w", pkg, err)
	}
	mods, err := filepath.Glob(filepath.Join(dir, "lib/modules/*"))
	if err != nil || len(mods) != 1 {
		return nil, fmt.Errorf("kernel tree %s: want one lib/modules/<version>, found %d", dir, len(mods))
	}
	version := filepath.Base(mods[0])
	vmlinuz := filepath.Join(dir, "boot", "vmlinuz-"+version)
	if _, err := os.Stat(vmlinuz); err != nil {
		return nil, fmt.Errorf("kernel tree %s: %w", dir, err)
	}
	name, _ := os.ReadFile(filepath.Join(dir, "package"))
	return &Kernel{Package: strings.TrimSpace(string(name)), Dir: dir, Version: version, Vmlinuz: vmlinuz, ModDir: mods[0]}, nil
}

func aptDownload(ctx context.Context, dir, pkg string) (string, error) {
	if _, err := exec.LookPath("apt-get"); err != nil {
		return "", fmt.Errorf("%w: %s: no apt-get", ErrUnavailable, pkg)
	}
	cmd := exec.CommandContext(ctx, "apt-get", "download", "-q", pkg)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%w: apt-get download %s: %v: %s (run `apt-get update` first?)", ErrUnavailable, pkg, err, strings.TrimSpace(string(out)))
	}
	debs, _ := filepath.Glob(filepath.Join(dir, pkg+"_*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("%w: apt-get download %s: no package file", ErrUnavailable, pkg)
	}
	return debs[0], nil
}

func debHasKernel(ctx context.Context, deb string) bool {
	out, err := exec.CommandContext(ctx, "dpkg-deb", "-c", deb).Output()
	return err == nil && bytes.Contains(out, []byte(" ./boot/vmlinuz"))
}

// lock takes an exclusive flock on path, waiting until ctx ends.
func lock(ctx context.Context, path string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	for {
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err == nil {
			return func() { f.Close() }, nil
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
