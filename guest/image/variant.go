package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/agentenv/agentenv/internal/digest"
	"github.com/agentenv/agentenv/internal/kernelpkg"
)

// variantVersion changes whenever what BuildVariant makes of a variant
// changes.
const variantVersion = "guest-variant-v1"

// File is one file a Variant adds to the root filesystem.
type File struct {
	Data []byte
	Mode os.FileMode
}

// Variant is a root filesystem beside the default one: the default tree
// (the same debootstrap, packages and user), with more Debian packages
// installed by apt and more files written. Templates other than the
// default one boot it (code-interpreter-v1's Python with Jupyter).
type Variant struct {
	Name     string
	Packages []string
	// Files are written into the tree by absolute path after the packages.
	Files map[string]File
	// Modules are guest kernel modules put into the tree's /lib/modules
	// (with their dependencies and depmod's index; Packages must have kmod)
	// for the guest's modprobe, beside the initramfs's DefaultModules.
	Modules []string
	// RootfsMiB sizes the variant's ext4 image (sparse) instead of
	// Options.RootfsMiB: room for what its guests store (compose-v1's
	// container images).
	RootfsMiB int
}

// variantKey names the cached variant: the base tree's key, the agent and
// everything the variant adds.
func variantKey(baseKey, agentSum, kernel string, v Variant, sizeMiB int) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%s\n%d\n", variantVersion, baseKey, agentSum, v.Name, sizeMiB)
	if len(v.Modules) > 0 {
		fmt.Fprintf(h, "kernel %s modules %s\n", kernel, strings.Join(v.Modules, ","))
	}
	pkgs := slices.Clone(v.Packages)
	sort.Strings(pkgs)
	for _, p := range pkgs {
		fmt.Fprintf(h, "pkg %s\n", p)
	}
	names := make([]string, 0, len(v.Files))
	for n := range v.Files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		sum := sha256.Sum256(v.Files[n].Data)
		fmt.Fprintf(h, "file %s %o %x\n", n, v.Files[n].Mode, sum)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// BuildVariant returns the ext4 root filesystem of variant v (the agent at
// /usr/bin/aenv-agent), building what is missing: the default tree (as
// Build does), a copy of it with v's packages and files, the image. Each
// is cached by a content hash under opts.CacheDir/variants.
func BuildVariant(ctx context.Context, opts Options, v Variant) (string, error) {
	if err := opts.defaults(); err != nil {
		return "", err
	}
	if v.Name == "" {
		return "", fmt.Errorf("guest image variant: no name")
	}
	if err := os.MkdirAll(opts.CacheDir, 0o755); err != nil {
		return "", fmt.Errorf("guest image variant %s: cache dir: %w", v.Name, err)
	}
	unlock, err := lockFile(ctx, filepath.Join(opts.CacheDir, ".lock"), opts.Log)
	if err != nil {
		return "", err
	}
	defer unlock()
	base, err := buildBaseTree(ctx, opts)
	if err != nil {
		return "", fmt.Errorf("guest image variant %s: %w", v.Name, err)
	}
	agentSum, err := digest.File(opts.Agent)
	if err != nil {
		return "", fmt.Errorf("guest image variant %s: %w", v.Name, err)
	}
	var k *kernelpkg.Kernel
	kernel := ""
	if len(v.Modules) > 0 {
		if k, err = fetchKernel(ctx, opts); err != nil {
			return "", fmt.Errorf("guest image variant %s: %w", v.Name, err)
		}
		kernel = k.Package
	}
	size := opts.RootfsMiB
	if v.RootfsMiB > 0 {
		size = v.RootfsMiB
	}
	treeKey := variantKey(base.key, "", "", Variant{Name: v.Name, Packages: v.Packages}, 0)
	dir := filepath.Join(opts.CacheDir, "variants", v.Name+"-"+variantKey(base.key, agentSum, kernel, v, size))
	out := filepath.Join(dir, "rootfs.ext4")
	if _, err := os.Stat(filepath.Join(dir, "done")); err == nil {
		now := time.Now()
		_ = os.Chtimes(dir, now, now)
		return out, nil
	}
	tree, err := variantTree(ctx, opts, base, v, filepath.Join(opts.CacheDir, "variants", "tree-"+v.Name+"-"+treeKey))
	if err != nil {
		return "", err
	}
	// The files and modules go in last, so a change of them alone
	// rebuilds no tree.
	if err := writeFiles(tree, v.Files); err != nil {
		return "", fmt.Errorf("guest image variant %s: %w", v.Name, err)
	}
	if k != nil {
		if err := installModules(ctx, tree, k, v.Modules); err != nil {
			return "", fmt.Errorf("guest image variant %s: %w", v.Name, err)
		}
	}
	_ = os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("guest image variant %s: %w", v.Name, err)
	}
	opts.Log.Info("guest image variant: writing root filesystem", "variant", v.Name, "size_mib", size)
	if err := makeRootfs(ctx, out, tree, opts.Agent, size); err != nil {
		return "", fmt.Errorf("guest image variant %s: %w", v.Name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "done"), nil, 0o644); err != nil {
		return "", fmt.Errorf("guest image variant %s: %w", v.Name, err)
	}
	// Trees and images of other inputs (an older agent, package list or
	// server) unused for days go; the ones just used were touched.
	pruneAssets(filepath.Join(opts.CacheDir, "variants"), 3*24*time.Hour)
	return out, nil
}

// variantTree copies the base tree to dir/tree and installs v into it
// (cached: a finished tree has dir/done).
func variantTree(ctx context.Context, opts Options, base *baseTree, v Variant, dir string) (string, error) {
	tree := filepath.Join(dir, "tree")
	if _, err := os.Stat(filepath.Join(dir, "done")); err == nil {
		now := time.Now()
		_ = os.Chtimes(dir, now, now) // last use, for pruning
		return tree, nil
	}
	_ = os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("guest image variant %s: %w", v.Name, err)
	}
	start := time.Now()
	opts.Log.Info("guest image variant: copying the base tree", "variant", v.Name)
	if out, err := exec.CommandContext(ctx, "cp", "-a", base.tree, tree).CombinedOutput(); err != nil {
		return "", fmt.Errorf("guest image variant %s: copy base tree: %w: %s", v.Name, err, tail(out, 2000))
	}
	opts.Log.Info("guest image variant: installing packages (a few minutes, once)", "variant", v.Name, "packages", v.Packages)
	if err := aptInstall(ctx, tree, v.Packages); err != nil {
		return "", fmt.Errorf("guest image variant %s (is the Debian mirror %s reachable?): %w", v.Name, opts.Mirror, err)
	}
	// The guest's own resolver, as customise wrote it (aptInstall lent the host's).
	if err := os.WriteFile(filepath.Join(tree, "etc/resolv.conf"), []byte("nameserver 8.8.8.8\n"), 0o644); err != nil {
		return "", fmt.Errorf("guest image variant %s: %w", v.Name, err)
	}
	for _, glob := range []string{"var/cache/apt/*.bin", "var/lib/apt/lists/*_*", "usr/share/doc/*", "usr/share/man/*"} {
		matches, _ := filepath.Glob(filepath.Join(tree, glob))
		for _, m := range matches {
			_ = os.RemoveAll(m)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "done"), nil, 0o644); err != nil {
		return "", fmt.Errorf("guest image variant %s: %w", v.Name, err)
	}
	opts.Log.Info("guest image variant: tree ready", "variant", v.Name, "took", time.Since(start).Round(time.Second))
	return tree, nil
}

// writeFiles writes files into tree by their absolute paths.
func writeFiles(tree string, files map[string]File) error {
	for name, f := range files {
		p := filepath.Join(tree, filepath.Clean("/"+name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		_ = os.Remove(p)
		if err := os.WriteFile(p, f.Data, f.Mode); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
		if err := os.Chmod(p, f.Mode); err != nil {
			return err
		}
	}
	return nil
}
