package image

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentenv/agentenv/internal/kernelpkg"
)

// fetchKernel returns the extracted kernel package of opts (downloaded
// once into the cache).
func fetchKernel(ctx context.Context, opts Options) (*kernelpkg.Kernel, error) {
	k, err := kernelpkg.Fetch(ctx, opts.CacheDir, opts.KernelPackage, opts.Log)
	if err != nil {
		return nil, fmt.Errorf("guest image: %w", err)
	}
	if k.Package == "" { // the image's key names the exact build
		return nil, fmt.Errorf("guest image: kernel tree %s does not name its package file (remove it to fetch it again)", k.Dir)
	}
	return k, nil
}

// writeInitramfs writes the initramfs: the agent as /init, the modules and
// their load order, and the marker that tells initd to switch root.
func writeInitramfs(out, agent string, k *kernelpkg.Kernel, modules []string) error {
	order, err := kernelpkg.ResolveModules(k.ModDir, modules)
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
		raw, err := kernelpkg.ReadModule(filepath.Join(k.ModDir, rel))
		if err != nil {
			return err
		}
		name := kernelpkg.ModuleName(rel) + ".ko"
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
