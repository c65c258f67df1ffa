package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// baseTree is a cached debootstrap tree with our customisations.
type baseTree struct {
	key  string
	tree string
}

// baseTreeVersion changes whenever customise changes what the tree holds.
const baseTreeVersion = "guest-image-v2"

// guestUser is the E2B-style default user: uid 1000, passwordless sudo.
const guestUser = "user"

// baseTreeKey names the cached tree of opts: a change of suite, mirror,
// package list or customisation builds a new tree beside the old one (which
// nodes and tests built from the old inputs keep using).
func baseTreeKey(opts Options) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("%s|%s|%s|%s", baseTreeVersion, opts.Suite, opts.Mirror, strings.Join(opts.Packages, ","))))
	return hex.EncodeToString(h[:])[:16]
}

func buildBaseTree(ctx context.Context, opts Options) (*baseTree, error) {
	key := baseTreeKey(opts)
	dir := filepath.Join(opts.CacheDir, "rootfs", key)
	tree := filepath.Join(dir, "tree")
	if _, err := os.Stat(filepath.Join(dir, "done")); err == nil {
		return &baseTree{key: key, tree: tree}, nil
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return nil, fmt.Errorf("root filesystem: debootstrap is not installed (apt-get install debootstrap): %w", err)
	}
	_ = os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("root filesystem: %w", err)
	}
	start := time.Now()
	opts.Log.Info("guest image: debootstrap (a few minutes, once)", "suite", opts.Suite, "packages", opts.Packages)
	args := []string{"--variant=minbase", opts.Suite, tree, opts.Mirror}
	if out, err := exec.CommandContext(ctx, "debootstrap", args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("root filesystem: debootstrap %s: %w: %s", opts.Suite, err, tail(out, 2000))
	}
	opts.Log.Info("guest image: installing packages", "took_so_far", time.Since(start).Round(time.Second))
	if err := aptInstall(ctx, tree, opts.Packages); err != nil {
		return nil, err
	}
	if err := customise(ctx, tree); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "done"), nil, 0o644); err != nil {
		return nil, fmt.Errorf("root filesystem: %w", err)
	}
	opts.Log.Info("guest image: base tree ready", "took", time.Since(start).Round(time.Second))
	return &baseTree{key: key, tree: tree}, nil
}

// customise adds the default user and the files a sandbox expects, and
// drops what only wastes space in an image.
func customise(ctx context.Context, tree string) error {
	run := func(args ...string) error {
		cmd := exec.CommandContext(ctx, "chroot", append([]string{tree}, args...)...)
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C"}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("root filesystem: %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := run("useradd", "--create-home", "--shell", "/bin/bash", "--uid", "1000", "--user-group", guestUser); err != nil {
		return err
	}
	files := map[string]string{
		"etc/sudoers.d/90-aenv-user": guestUser + " ALL=(ALL) NOPASSWD:ALL\n",
		"etc/hostname":               "sandbox\n",
		"etc/hosts":                  "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n127.0.1.1 sandbox\n",
		"etc/resolv.conf":            "nameserver 8.8.8.8\n",
		"etc/fstab":                  "# mounts are made by aenv-agent (PID 1)\n",
	}
	for name, content := range files {
		p := filepath.Join(tree, name)
		_ = os.Remove(p)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return fmt.Errorf("root filesystem: write %s: %w", name, err)
		}
	}
	if err := os.Chmod(filepath.Join(tree, "etc/sudoers.d/90-aenv-user"), 0o440); err != nil {
		return fmt.Errorf("root filesystem: %w", err)
	}
	// Debian marks its Python externally managed (PEP 668), which makes a
	// plain `pip install` fail; E2B's base image lets its user install
	// packages with pip (into ~/.local, site-packages being root's).
	for _, glob := range []string{"usr/lib/python3*/EXTERNALLY-MANAGED", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb", "var/lib/apt/lists/*_*", "usr/share/doc/*", "usr/share/man/*", "usr/share/locale/*", "var/log/*.log"} {
		matches, _ := filepath.Glob(filepath.Join(tree, glob))
		for _, m := range matches {
			_ = os.RemoveAll(m)
		}
	}
	return nil
}

// makeRootfs writes the ext4 image from the base tree and copies the agent in.
func makeRootfs(ctx context.Context, out, tree, agent string, sizeMiB int) error {
	args := []string{"-q", "-F", "-t", "ext4", "-L", "aenv-root", "-b", "4096", "-E", "root_owner=0:0",
		"-O", "^has_journal", "-d", tree, out, fmt.Sprintf("%dM", sizeMiB)}
	// No journal: the image is read-only for templates, and uppers are sealed
	// on pause after a sync, so a journal only costs boot time and space.
	if outb, err := exec.CommandContext(ctx, "mke2fs", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("root filesystem: mke2fs %s: %w: %s", out, err, tail(outb, 2000))
	}
	script := fmt.Sprintf("write %s /usr/bin/aenv-agent\nsif /usr/bin/aenv-agent mode 0100755\nsif /usr/bin/aenv-agent uid 0\nsif /usr/bin/aenv-agent gid 0\n", agent)
	cmd := exec.CommandContext(ctx, "debugfs", "-w", "-f", "-", out)
	cmd.Stdin = strings.NewReader(script)
	outb, err := cmd.CombinedOutput()
	if err != nil || strings.Contains(string(outb), "rror") {
		return fmt.Errorf("root filesystem: debugfs write agent into %s: %v: %s", out, err, tail(outb, 2000))
	}
	return nil
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}
