package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// aptInstall installs packages (Depends only, no Recommends) into the
// debootstrap tree with the tree's own apt. debootstrap's resolver alone
// cannot: it ignores virtual packages, and npm's dependency tree is full of
// them. The host's resolver configuration and proxy settings are lent to
// the chroot for the download; customise writes the guest's own later.
func aptInstall(ctx context.Context, tree string, packages []string) (err error) {
	if len(packages) == 0 {
		return nil
	}
	if b, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		if err := os.WriteFile(filepath.Join(tree, "etc/resolv.conf"), b, 0o644); err != nil {
			return fmt.Errorf("root filesystem: lend resolv.conf: %w", err)
		}
	}
	proc := filepath.Join(tree, "proc")
	if err := unix.Mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("root filesystem: mount %s: %w", proc, err)
	}
	defer func() {
		// The tree is copied into the image whole: a /proc left mounted
		// would be copied too, so a failed unmount fails the build.
		if uerr := unix.Unmount(proc, unix.MNT_DETACH); uerr != nil {
			err = errors.Join(err, fmt.Errorf("root filesystem: unmount %s: %w", proc, uerr))
		}
	}()
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C", "DEBIAN_FRONTEND=noninteractive"}
	for _, k := range []string{"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	apt := func(args ...string) error {
		cmd := exec.CommandContext(ctx, "chroot", append([]string{tree, "apt-get", "-q", "-y",
			// No fsync per file: a failed build is thrown away whole.
			"-o", "Dpkg::Options::=--force-unsafe-io"}, args...)...)
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
