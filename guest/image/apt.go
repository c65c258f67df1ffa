package image

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// aptInstall installs packages (Depends only, no Recommends) into the
// debootstrap tree with the tree's own apt. debootstrap's resolver alone
// cannot: it ignores virtual packages, and npm's dependency tree is full of
// them. The host's resolver configuration and proxy settings are lent to
// the chroot for the download; customise writes the guest's own later.
func aptInstall(ctx context.Context, tree string, packages []string) error {
	if len(packages) == 0 {
		return nil
	}
	if b, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		if err := os.WriteFile(filepath.Join(tree, "etc/resolv.conf"), b, 0o644); err != nil {
			return fmt.Errorf("root filesystem: lend resolv.conf: %w", err)
		}
	}
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C", "DEBIAN_FRONTEND=noninteractive"}
	for _, k := range []string{"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	apt := func(args ...string) error {
		// /proc for the packages' scripts, mounted in a mount namespace of
		// the command's own: it ends with the command, so no mount is left
		// in the tree (which is copied into the image whole) or the cache.
		// --force-unsafe-io: no fsync per file (a failed build is thrown
		// away whole).
		script := `mount -t proc proc "$0/proc" && exec chroot "$0" apt-get -q -y -o Dpkg::Options::=--force-unsafe-io "$@"`
		cmd := exec.CommandContext(ctx, "/bin/sh", append([]string{"-c", script, tree}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("root filesystem: apt-get %s: %w: %s", strings.Join(args, " "), err, tail(out, 3000))
		}
		return nil
	}
	if err := apt("update"); err != nil {
		return err
	}
	if err := apt(append([]string{"install", "--no-install-recommends"}, packages...)...); err != nil {
		return err
	}
	return apt("clean")
}
