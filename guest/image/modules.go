package image

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/agentenv/agentenv/internal/kernelpkg"
)

// installModules puts the guest kernel's modules named (with what they
// depend on) into tree's /lib/modules/<version>, decompressed (the guest
// kernel could read .ko.xz, at about a second per module under emulation),
// with the kernel's lists of built-in modules, and runs the tree's own
// depmod, so that modprobe in the guest finds them: dockerd loads what its
// networks need itself. The tree needs kmod installed.
func installModules(ctx context.Context, tree string, k *kernelpkg.Kernel, modules []string) error {
	order, err := kernelpkg.ResolveModules(k.ModDir, modules)
	if err != nil {
		return err
	}
	dst := filepath.Join(tree, "lib", "modules", k.Version)
	if err := os.RemoveAll(dst); err != nil {
		return fmt.Errorf("kernel modules: %w", err)
	}
	for _, rel := range order {
		raw, err := kernelpkg.ReadModule(filepath.Join(k.ModDir, rel))
		if err != nil {
			return err
		}
		p := filepath.Join(dst, strings.TrimSuffix(rel, ".xz"))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("kernel modules: %w", err)
		}
		if err := os.WriteFile(p, raw, 0o644); err != nil {
			return fmt.Errorf("kernel modules: %w", err)
		}
	}
	for _, list := range []string{"modules.builtin", "modules.builtin.modinfo", "modules.order"} {
		b, err := os.ReadFile(filepath.Join(k.ModDir, list))
		if err != nil {
			continue // depmod does without
		}
		if err := os.WriteFile(filepath.Join(dst, list), b, 0o644); err != nil {
			return fmt.Errorf("kernel modules: %w", err)
		}
	}
	out, err := exec.CommandContext(ctx, "chroot", tree, "/sbin/depmod", "-a", k.Version).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kernel modules: depmod in the tree (is kmod among the variant's packages?): %w: %s", err, tail(out, 2000))
	}
	return nil
}
