package firecracker

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Probe reports whether Firecracker can run here: the binary answers
// --version (returned) and /dev/kvm opens read-write. It cannot tell a KVM
// that boots only special guests (nested "PVM") from a full one; only a boot
// can.
func Probe(ctx context.Context, binary string) (version string, err error) {
	if binary == "" {
		binary = "firecracker"
	}
	bin, err := resolveBinary("firecracker", binary)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "--version")
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("firecracker: probe %s --version: %w: %s", bin, err, strings.TrimSpace(errOut.String()))
	}
	version, _, _ = strings.Cut(strings.TrimSpace(out.String()), "\n")
	fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return version, fmt.Errorf("firecracker: probe: /dev/kvm: %w", err)
	}
	_ = unix.Close(fd)
	return version, nil
}
