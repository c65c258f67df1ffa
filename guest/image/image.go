// Package image assembles the guest assets every sandbox VM boots from, using
// Debian's packages only: the kernel (Debian's cloud kernel, whose virtio
// drivers are modules), an initramfs holding our agent as /init plus the
// modules it must load, and an ext4 root filesystem with the agent at
// /usr/bin/aenv-agent: debootstrap minbase, then with apt what users of E2B's
// base image rely on (DefaultPackages: git, curl, python3 with pip and venv,
// Node.js with npm, sudo, procps, build-essential) and the E2B-style user
// "user" (uid 1000, home /home/user, passwordless sudo).
//
// Everything is cached under a cache directory: the downloaded kernel and the
// debootstrap tree by their inputs, and the finished assets by a content hash
// of all inputs (agent binary included), so a rebuild is cheap.
package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/digest"
	"github.com/agentenv/agentenv/internal/kernelpkg"
)

// builderVersion changes whenever the layout of what Build produces changes.
const builderVersion = "guest-image-v2"

// Defaults.
var (
	DefaultKernelPackage = "linux-image-6.12-cloud-amd64"
	DefaultSuite         = "bookworm"
	DefaultMirror        = "http://deb.debian.org/debian"
	// DefaultRootfsMiB sizes the ext4 image (a sparse file: only the
	// tree's ~750 MiB are allocated). The base template's disk is this
	// image, so it is what a sandbox of it has: about 3 GiB and 220k inodes
	// free for the user (node_modules trees are many small files).
	DefaultRootfsMiB = 4096
	// DefaultPackages is what the root filesystem holds beyond debootstrap's
	// minbase (with their dependencies, not their recommendations): what
	// users of E2B's base image rely on.
	DefaultPackages = []string{"python3", "python3-pip", "python3-venv", "iproute2", "ca-certificates", "sudo", "procps", "curl",
		"git", "nodejs", "npm", "build-essential"}
	// DefaultModules are loaded by the initramfs, dependencies first. virtio
	// and ext4 are built into the cloud kernel; these are modules there.
	DefaultModules = []string{"virtio_mmio", "virtio_blk", "virtio_net", "virtio_rng", "virtio_balloon", "vmw_vsock_virtio_transport", "overlay"}
)

// Options say what to build and where to cache it.
type Options struct {
	CacheDir      string // default DefaultCacheDir()
	Agent         string // path to a static aenv-agent binary (required)
	KernelPackage string
	Modules       []string
	Suite         string
	Mirror        string
	Packages      []string
	RootfsMiB     int // ext4 image size (sparse), default DefaultRootfsMiB
	Log           *slog.Logger
}

// Assets are the files a VM boots from.
type Assets struct {
	Dir           string `json:"dir"`
	Kernel        string `json:"kernel"`
	Initrd        string `json:"initrd"`
	Rootfs        string `json:"rootfs"`
	KernelVersion string `json:"kernelVersion"`
	Hash          string `json:"hash"`
}

// DefaultCacheDir is $AENV_GUEST_CACHE or /var/cache/aenv/guest.
func DefaultCacheDir() string {
	if d := os.Getenv("AENV_GUEST_CACHE"); d != "" {
		return d
	}
	return "/var/cache/aenv/guest"
}

func (o *Options) defaults() error {
	if o.Agent == "" {
		return fmt.Errorf("guest image: no agent binary given")
	}
	if _, err := os.Stat(o.Agent); err != nil {
		return fmt.Errorf("guest image: agent binary: %w", err)
	}
	if o.CacheDir == "" {
		o.CacheDir = DefaultCacheDir()
	}
	if o.KernelPackage == "" {
		o.KernelPackage = DefaultKernelPackage
	}
	if o.Modules == nil {
		o.Modules = DefaultModules
	}
	if o.Suite == "" {
		o.Suite = DefaultSuite
	}
	if o.Mirror == "" {
		o.Mirror = DefaultMirror
		if m := os.Getenv("AENV_DEBIAN_MIRROR"); m != "" {
			o.Mirror = m
		}
	}
	if o.Packages == nil {
		o.Packages = DefaultPackages
	}
	if o.RootfsMiB == 0 {
		o.RootfsMiB = DefaultRootfsMiB
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return nil
}

// Build returns the cached assets for opts, building what is missing.
// Concurrent callers (several test binaries) serialise on a lock file.
func Build(ctx context.Context, opts Options) (*Assets, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.CacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("guest image: cache dir: %w", err)
	}
	unlock, err := lockFile(ctx, filepath.Join(opts.CacheDir, ".lock"), opts.Log)
	if err != nil {
		return nil, err
	}
	defer unlock()

	kern, err := fetchKernel(ctx, opts)
	if err != nil {
		return nil, err
	}
	base, err := buildBaseTree(ctx, opts)
	if err != nil {
		return nil, err
	}
	agentSum, err := digest.File(opts.Agent)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%s\n%s\n%d\n", builderVersion, kern.Package, strings.Join(opts.Modules, ","), base.key, agentSum, opts.RootfsMiB)
	hash := hex.EncodeToString(h.Sum(nil))[:16]
	dir := filepath.Join(opts.CacheDir, "assets", hash)
	if a, err := readManifest(dir); err == nil {
		now := time.Now()
		_ = os.Chtimes(dir, now, now) // last use, for pruning
		return a, nil
	}
	start := time.Now()
	a, err := assemble(ctx, opts, kern, base, dir, hash)
	if err != nil {
		return nil, err
	}
	opts.Log.Info("guest assets built", "dir", dir, "took", time.Since(start).Round(time.Millisecond))
	pruneAssets(filepath.Join(opts.CacheDir, "assets"), 3*24*time.Hour)
	return a, nil
}

func assemble(ctx context.Context, opts Options, kern *kernelpkg.Kernel, base *baseTree, dir, hash string) (*Assets, error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, fmt.Errorf("guest image: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".build-")
	if err != nil {
		return nil, fmt.Errorf("guest image: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Link(kern.Vmlinuz, filepath.Join(tmp, "vmlinuz")); err != nil {
		if err := copyFile(kern.Vmlinuz, filepath.Join(tmp, "vmlinuz")); err != nil {
			return nil, err
		}
	}
	opts.Log.Info("guest image: writing initramfs", "modules", len(opts.Modules))
	if err := writeInitramfs(filepath.Join(tmp, "initrd.cpio"), opts.Agent, kern, opts.Modules); err != nil {
		return nil, err
	}
	opts.Log.Info("guest image: writing root filesystem", "size_mib", opts.RootfsMiB)
	if err := makeRootfs(ctx, filepath.Join(tmp, "rootfs.ext4"), base.tree, opts.Agent, opts.RootfsMiB); err != nil {
		return nil, err
	}
	a := &Assets{Dir: dir, Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd.cpio"),
		Rootfs: filepath.Join(dir, "rootfs.ext4"), KernelVersion: kern.Version, Hash: hash}
	b, _ := json.MarshalIndent(a, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "manifest.json"), b, 0o644); err != nil {
		return nil, fmt.Errorf("guest image: manifest: %w", err)
	}
	_ = os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return nil, fmt.Errorf("guest image: publish %s: %w", dir, err)
	}
	return a, nil
}

func readManifest(dir string) (*Assets, error) {
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return nil, err
	}
	var a Assets
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, err
	}
	for _, f := range []string{a.Kernel, a.Initrd, a.Rootfs} {
		if _, err := os.Stat(f); err != nil {
			return nil, err
		}
	}
	return &a, nil
}

// pruneAssets removes asset sets unused for maxAge. Age, not count: a test
// or VM elsewhere may still be booting from a set built minutes ago.
func pruneAssets(dir string, maxAge time.Duration) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		info, err := e.Info()
		if err != nil || !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if time.Since(info.ModTime()) > maxAge {
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

// lockFile takes the cache's lock, saying once in log when another
// process holds it (a build elsewhere can hold it for minutes, and a
// node start waiting on it would otherwise print nothing).
func lockFile(ctx context.Context, path string, log *slog.Logger) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("guest image: lock %s: %w", path, err)
	}
	for waited := false; ; waited = true {
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err == nil {
			return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
		}
		if !waited {
			log.Info("guest image cache busy: waiting for another build to finish", "lock", path)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("guest image: waiting for lock %s: %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("copy to %s: %w", dst, err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return out.Close()
}
