package kernellane

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/ulikunitz/xz"
	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/atomicfile"
)

// KernelPackage is the Debian package whose kernel the lane boots: 6.12
// has ublk (with user recovery and user copy) and nbd as modules and boots
// under TCG.
const KernelPackage = "linux-image-6.12-cloud-amd64"

// ErrNoKernel means the kernel package is neither cached nor downloadable.
var ErrNoKernel = errors.New("kernel package unavailable")

// kernel is an extracted kernel package.
type kernel struct {
	hash    string // sha256 of the package file
	vmlinuz string
	modDir  string // .../lib/modules/<version>
}

// fetchKernel returns the cached extraction of pkg, downloading and
// extracting it (without installing it) on first use. The tree lives under
// cache/kernel/<sha256 of the .deb>; cache/kernel/<pkg>.ref names it.
func fetchKernel(ctx context.Context, cache, pkg string) (*kernel, error) {
	ref := filepath.Join(cache, "kernel", pkg+".ref")
	if k, err := loadRef(ref); err == nil {
		return k, nil
	}
	unlock, err := lock(filepath.Join(cache, "kernel.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if k, err := loadRef(ref); err == nil { // fetched while we waited
		return k, nil
	}
	tmp, err := os.MkdirTemp(cache, ".kernel-")
	if err != nil {
		return nil, fmt.Errorf("kernel lane: %w", err)
	}
	defer os.RemoveAll(tmp)
	deb, err := aptDownload(ctx, tmp, pkg)
	if err != nil {
		return nil, err
	}
	if !debHasBoot(ctx, deb) { // a meta package: the real one is its first dependency
		out, err := exec.CommandContext(ctx, "dpkg-deb", "-f", deb, "Depends").Output()
		if err != nil || len(bytes.Fields(out)) == 0 {
			return nil, fmt.Errorf("kernel lane: dependencies of %s: %v", deb, err)
		}
		real := strings.TrimRight(string(bytes.Fields(out)[0]), ",")
		if deb, err = aptDownload(ctx, tmp, real); err != nil {
			return nil, err
		}
	}
	sum, err := fileHash(deb)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cache, "kernel", sum)
	if _, err := os.Stat(dir); err != nil {
		root := filepath.Join(tmp, "root")
		if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, root).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("kernel lane: extract %s: %w: %s", deb, err, out)
		}
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			return nil, fmt.Errorf("kernel lane: %w", err)
		}
		if err := os.Rename(root, dir); err != nil {
			return nil, fmt.Errorf("kernel lane: publish %s: %w", dir, err)
		}
	}
	if err := atomicfile.WriteFile(ref, []byte(sum+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("kernel lane: %w", err)
	}
	return loadRef(ref)
}

func loadRef(ref string) (*kernel, error) {
	b, err := os.ReadFile(ref)
	if err != nil {
		return nil, err
	}
	sum := strings.TrimSpace(string(b))
	dir := filepath.Join(filepath.Dir(ref), sum)
	mods, err := filepath.Glob(filepath.Join(dir, "lib/modules/*"))
	if err != nil || len(mods) != 1 {
		return nil, fmt.Errorf("kernel lane: %s: want one lib/modules/<version>, found %d", dir, len(mods))
	}
	vmlinuz := filepath.Join(dir, "boot", "vmlinuz-"+filepath.Base(mods[0]))
	if _, err := os.Stat(vmlinuz); err != nil {
		return nil, fmt.Errorf("kernel lane: %w", err)
	}
	return &kernel{hash: sum, vmlinuz: vmlinuz, modDir: mods[0]}, nil
}

func aptDownload(ctx context.Context, dir, pkg string) (string, error) {
	if _, err := exec.LookPath("apt-get"); err != nil {
		return "", fmt.Errorf("%w: %s: no apt-get", ErrNoKernel, pkg)
	}
	cmd := exec.CommandContext(ctx, "apt-get", "download", "-q", pkg)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%w: apt-get download %s: %v: %s (apt-get update first?)", ErrNoKernel, pkg, err, strings.TrimSpace(string(out)))
	}
	debs, _ := filepath.Glob(filepath.Join(dir, pkg+"_*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("%w: apt-get download %s: no package file", ErrNoKernel, pkg)
	}
	return debs[0], nil
}

func debHasBoot(ctx context.Context, deb string) bool {
	out, err := exec.CommandContext(ctx, "dpkg-deb", "-c", deb).Output()
	return err == nil && bytes.Contains(out, []byte(" ./boot/vmlinuz"))
}

// resolveModules returns the files (relative to modDir) of the wanted
// modules and their dependencies, dependencies first. Debian ships no
// modules.dep (depmod writes it at install), so each module's .modinfo
// section says what it depends on. Built-in modules are skipped.
func resolveModules(modDir string, wanted []string) ([]string, error) {
	byName := map[string]string{}
	err := filepath.WalkDir(filepath.Join(modDir, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.Contains(d.Name(), ".ko") {
			rel, _ := filepath.Rel(modDir, p)
			byName[moduleName(p)] = rel
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("kernel lane: index modules of %s: %w", modDir, err)
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(modDir, "modules.builtin")); err == nil {
		for _, l := range strings.Fields(string(b)) {
			builtin[moduleName(l)] = true
		}
	}
	var order []string
	seen := map[string]bool{}
	var visit func(name string) error
	visit = func(name string) error {
		name = strings.ReplaceAll(name, "-", "_")
		if seen[name] {
			return nil
		}
		seen[name] = true
		rel, ok := byName[name]
		if !ok {
			if builtin[name] {
				return nil
			}
			return fmt.Errorf("kernel lane: module %q is neither a module nor built in", name)
		}
		deps, err := moduleDepends(filepath.Join(modDir, rel))
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d); err != nil {
				return err
			}
		}
		order = append(order, rel)
		return nil
	}
	for _, w := range wanted {
		if err := visit(w); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// moduleDepends reads "depends=" of a module's .modinfo section.
func moduleDepends(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("kernel lane: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".xz") {
		if r, err = xz.NewReader(f); err != nil {
			return nil, fmt.Errorf("kernel lane: module %s: %w", path, err)
		}
	}
	raw, err := io.ReadAll(io.LimitReader(r, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("kernel lane: module %s: %w", path, err)
	}
	ef, err := elf.NewFile(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("kernel lane: module %s: %w", path, err)
	}
	sec := ef.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("kernel lane: module %s: no .modinfo", path)
	}
	info, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("kernel lane: module %s: %w", path, err)
	}
	for _, kv := range bytes.Split(info, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			var out []string
			for _, d := range strings.Split(string(v), ",") {
				if d != "" {
					out = append(out, d)
				}
			}
			return out, nil
		}
	}
	return nil, nil
}

func moduleName(p string) string {
	base, _, _ := strings.Cut(filepath.Base(p), ".ko")
	return strings.ReplaceAll(base, "-", "_")
}

func fileHash(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("kernel lane: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("kernel lane: hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// lock takes an exclusive flock on path, for fetches and builds that
// several test processes may start at once.
func lock(path string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("kernel lane: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("kernel lane: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("kernel lane: lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
