package image

import (
	"bytes"
	"context"
	"debug/elf"
	"io"
	"io/fs"

	"fmt"
	"github.com/ulikunitz/xz"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// kernel is an extracted Debian kernel package.
type kernel struct {
	key     string // package file name: identifies the exact build
	version string // uname -r of the kernel
	vmlinuz string
	modDir  string // .../lib/modules/<version>
}

// fetchKernel downloads (once) the kernel package and extracts it into the cache.
func fetchKernel(ctx context.Context, opts Options) (*kernel, error) {
	dir := filepath.Join(opts.CacheDir, "kernel", opts.KernelPackage)
	if k, err := loadKernel(dir); err == nil {
		return k, nil
	}
	opts.Log.Info("guest image: downloading kernel package", "package", opts.KernelPackage)
	tmp, err := os.MkdirTemp(opts.CacheDir, ".kernel-")
	if err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	defer os.RemoveAll(tmp)
	deb, err := aptDownload(ctx, tmp, opts.KernelPackage)
	if err != nil {
		return nil, err
	}
	// A meta package (linux-image-6.12-cloud-amd64) only depends on the real one.
	if !debHas(ctx, deb, "./boot/") {
		dep, err := debField(ctx, deb, "Depends")
		if err != nil {
			return nil, err
		}
		real := strings.Fields(strings.Split(dep, ",")[0])[0]
		if deb, err = aptDownload(ctx, tmp, real); err != nil {
			return nil, err
		}
	}
	root := filepath.Join(tmp, "root")
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, root).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("kernel: extract %s: %w: %s", deb, err, out)
	}
	if err := os.WriteFile(filepath.Join(root, "package"), []byte(filepath.Base(deb)), 0o644); err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	_ = os.RemoveAll(dir)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	if err := os.Rename(root, dir); err != nil {
		return nil, fmt.Errorf("kernel: publish %s: %w", dir, err)
	}
	return loadKernel(dir)
}

func loadKernel(dir string) (*kernel, error) {
	pkg, err := os.ReadFile(filepath.Join(dir, "package"))
	if err != nil {
		return nil, err
	}
	mods, err := filepath.Glob(filepath.Join(dir, "lib/modules/*"))
	if err != nil || len(mods) != 1 {
		return nil, fmt.Errorf("kernel %s: want one lib/modules/<version>, found %d", dir, len(mods))
	}
	version := filepath.Base(mods[0])
	vmlinuz := filepath.Join(dir, "boot", "vmlinuz-"+version)
	if _, err := os.Stat(vmlinuz); err != nil {
		return nil, fmt.Errorf("kernel %s: %w", dir, err)
	}
	return &kernel{key: string(pkg), version: version, vmlinuz: vmlinuz, modDir: mods[0]}, nil
}

func aptDownload(ctx context.Context, dir, pkg string) (string, error) {
	cmd := exec.CommandContext(ctx, "apt-get", "download", "-q", pkg)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("kernel: apt-get download %s: %w: %s (run `apt-get update` first?)", pkg, err, strings.TrimSpace(string(out)))
	}
	debs, _ := filepath.Glob(filepath.Join(dir, pkg+"_*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("kernel: apt-get download %s: no package file", pkg)
	}
	return debs[0], nil
}

func debField(ctx context.Context, deb, field string) (string, error) {
	out, err := exec.CommandContext(ctx, "dpkg-deb", "-f", deb, field).Output()
	if err != nil {
		return "", fmt.Errorf("kernel: read %s of %s: %w", field, deb, err)
	}
	v := strings.TrimSpace(string(out))
	if v == "" {
		return "", fmt.Errorf("kernel: %s has no %s field", deb, field)
	}
	return v, nil
}

func debHas(ctx context.Context, deb, prefix string) bool {
	out, err := exec.CommandContext(ctx, "dpkg-deb", "-c", deb).Output()
	if err != nil {
		return false
	}
	return strings.Contains(string(out), " "+prefix)
}

// resolveModules returns the module files (relative to modDir) to load for
// the wanted modules, dependencies first. Debian's package ships no
// modules.dep (depmod makes it at install time), so dependencies are read
// from each module's own .modinfo section. Built-in modules are skipped.
func resolveModules(modDir string, wanted []string) ([]string, error) {
	byName, err := indexModules(modDir)
	if err != nil {
		return nil, err
	}
	builtin := readBuiltin(filepath.Join(modDir, "modules.builtin"))
	var order []string
	seen := map[string]bool{}
	var visit func(name string, chain []string) error
	visit = func(name string, chain []string) error {
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
			return fmt.Errorf("kernel module %q (wanted via %v): neither a module nor built into %s", name, chain, filepath.Base(modDir))
		}
		deps, err := moduleDepends(filepath.Join(modDir, rel))
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d, append(chain, name)); err != nil {
				return err
			}
		}
		order = append(order, rel)
		return nil
	}
	for _, name := range wanted {
		if err := visit(name, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}

func indexModules(modDir string) (map[string]string, error) {
	byName := map[string]string{}
	err := filepath.WalkDir(filepath.Join(modDir, "kernel"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.Contains(d.Name(), ".ko") {
			return err
		}
		rel, _ := filepath.Rel(modDir, path)
		byName[moduleName(path)] = rel
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("kernel modules: index %s: %w", modDir, err)
	}
	return byName, nil
}

// moduleDepends reads "depends=" from the module's .modinfo ELF section.
func moduleDepends(path string) ([]string, error) {
	raw, err := readModule(path)
	if err != nil {
		return nil, err
	}
	ef, err := elf.NewFile(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("kernel module %s: %w", path, err)
	}
	sec := ef.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("kernel module %s: no .modinfo section", path)
	}
	info, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("kernel module %s: .modinfo: %w", path, err)
	}
	for _, kv := range bytes.Split(info, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			return splitNonEmpty(string(v)), nil
		}
	}
	return nil, nil
}

// readModule returns a module file's ELF bytes, decompressing .ko.xz.
func readModule(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("kernel module: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".xz") {
		if r, err = xz.NewReader(f); err != nil {
			return nil, fmt.Errorf("kernel module %s: %w", path, err)
		}
	}
	raw, err := io.ReadAll(io.LimitReader(r, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("kernel module %s: decompress: %w", path, err)
	}
	return raw, nil
}

func splitNonEmpty(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

func readBuiltin(path string) map[string]bool {
	b, _ := os.ReadFile(path)
	out := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" {
			out[moduleName(l)] = true
		}
	}
	return out
}

func moduleName(path string) string {
	base := filepath.Base(path)
	base, _, _ = strings.Cut(base, ".ko")
	return strings.ReplaceAll(base, "-", "_")
}

// writeInitramfs writes the initramfs: the agent as /init, the modules and
// their load order, and the marker that tells initd to switch root.
func writeInitramfs(out, agent string, k *kernel, modules []string) error {
	order, err := resolveModules(k.modDir, modules)
	if err != nil {
		return err
	}
	entries := []cpioEntry{
		{Name: "dev", Mode: cpioDir | 0o755},
		{Name: "dev/console", Mode: cpioCharDev | 0o600, DevMaj: 5, DevMin: 1},
		{Name: "proc", Mode: cpioDir | 0o755},
		{Name: "sys", Mode: cpioDir | 0o755},
		{Name: "newroot", Mode: cpioDir | 0o755},
		{Name: "lib", Mode: cpioDir | 0o755},
		{Name: "lib/modules", Mode: cpioDir | 0o755},
		{Name: "init", Mode: cpioFile | 0o755, Source: agent},
		{Name: ".aenv-initramfs", Mode: cpioFile | 0o644, Data: []byte("aenv\n")},
	}
	var list strings.Builder
	for _, rel := range order {
		// Decompressed here: the guest kernel can decompress .ko.xz itself,
		// but under software emulation that costs about a second a boot.
		raw, err := readModule(filepath.Join(k.modDir, rel))
		if err != nil {
			return err
		}
		name := moduleName(rel) + ".ko"
		entries = append(entries, cpioEntry{Name: "lib/modules/" + name, Mode: cpioFile | 0o644, Data: raw})
		list.WriteString(name + "\n")
	}
	entries = append(entries, cpioEntry{Name: "lib/modules/load.list", Mode: cpioFile | 0o644, Data: []byte(list.String())})
	f, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	if err := writeCpio(f, entries); err != nil {
		f.Close()
		return fmt.Errorf("initramfs %s: %w", out, err)
	}
	return f.Close()
}
