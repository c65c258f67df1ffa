package kernelpkg

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/ulikunitz/xz"
)

// ResolveModules returns the module files (relative to modDir) to load for
// the wanted modules, dependencies first. Debian's package ships no
// modules.dep (depmod makes it at install time), so dependencies are read
// from each module's own .modinfo section. Built-in modules are skipped.
func ResolveModules(modDir string, wanted []string) ([]string, error) {
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
		byName[ModuleName(path)] = rel
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("kernel modules: index %s: %w", modDir, err)
	}
	return byName, nil
}

// moduleDepends reads "depends=" from the module's .modinfo ELF section.
func moduleDepends(path string) ([]string, error) {
	raw, err := ReadModule(path)
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

// ReadModule returns a module file's ELF bytes, decompressing .ko.xz
// (at most 64 MiB: a module file is untrusted input).
func ReadModule(path string) ([]byte, error) {
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
			out[ModuleName(l)] = true
		}
	}
	return out
}

func ModuleName(path string) string {
	base := filepath.Base(path)
	base, _, _ = strings.Cut(base, ".ko")
	return strings.ReplaceAll(base, "-", "_")
}
