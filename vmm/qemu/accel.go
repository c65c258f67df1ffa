package qemu

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"golang.org/x/sys/unix"
)

// kvmProbeTimeout bounds the test boot under KVM. A working KVM reaches the
// kernel panic of a guest without root filesystem in well under a second; a
// nested KVM that cannot run the guest hangs instead of failing.
const kvmProbeTimeout = 15 * time.Second

// DetectAccel picks "kvm" when a test guest boots with it and "tcg"
// otherwise, and says why. $AENV_QEMU_ACCEL forces a choice. The result is
// cached per QEMU binary and kernel in a private directory of the user (see
// probeCacheDir), so test binaries and restarts do not pay for the probe again.
func DetectAccel(ctx context.Context, binary, kernel string) (accel, reason string) {
	if a := os.Getenv("AENV_QEMU_ACCEL"); a == "kvm" || a == "tcg" {
		return a, "forced by AENV_QEMU_ACCEL"
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg", fmt.Sprintf("/dev/kvm unusable: %v", err)
	}
	f.Close()
	dir := probeCacheDir()
	key := probeCacheKey(binary, kernel)
	if a, r, ok := readProbeCache(dir, key); ok {
		return a, r + " (cached)"
	}
	accel, reason = probeKVM(ctx, binary, kernel)
	_ = writeProbeCache(dir, key, accel, reason)
	return accel, reason
}

// probeCacheDir is where probe results are kept: a directory of the user
// running aenvd (root: /var/cache/aenv/kvm-probe), never the shared temp
// directory, where any local user could plant a result (forcing TCG or a
// KVM that hangs) or a symbolic link root would write through.
var probeCacheDir = func() string {
	if os.Geteuid() == 0 {
		return "/var/cache/aenv/kvm-probe"
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "aenv", "kvm-probe")
	}
	return ""
}

// openPrivateDir makes dir (mode 0700) and opens it, refusing a symbolic
// link and a directory another user owns or could write (its own or its
// parent's group or world write bit; its own is tightened to 0700).
func openPrivateDir(dir string) (*os.File, error) {
	if dir == "" {
		return nil, errors.New("no probe cache directory")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	euid := uint32(os.Geteuid())
	var pst unix.Stat_t
	if err := unix.Lstat(filepath.Dir(dir), &pst); err != nil {
		return nil, err
	}
	if (pst.Uid != euid && pst.Uid != 0) || (pst.Mode&0o022 != 0 && pst.Mode&unix.S_ISVTX == 0) {
		return nil, fmt.Errorf("%s: parent owned by uid %d with mode %#o, writable by others", dir, pst.Uid, pst.Mode&0o7777)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	f := os.NewFile(uintptr(fd), dir)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, err
	}
	if st.Uid != euid {
		f.Close()
		return nil, fmt.Errorf("%s: owned by uid %d, not %d", dir, st.Uid, euid)
	}
	if st.Mode&0o077 != 0 {
		if err := unix.Fchmod(fd, 0o700); err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: tighten to 0700: %w", dir, err)
		}
	}
	return f, nil
}

// readProbeCache reads a result kept by writeProbeCache: a regular file of
// ours in a private directory, opened without following a symbolic link.
func readProbeCache(dir, key string) (accel, reason string, ok bool) {
	d, err := openPrivateDir(dir)
	if err != nil {
		return "", "", false
	}
	defer d.Close()
	fd, err := unix.Openat(int(d.Fd()), key, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", "", false
	}
	f := os.NewFile(uintptr(fd), key)
	defer f.Close()
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != uint32(os.Geteuid()) {
		return "", "", false
	}
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return "", "", false
	}
	a, r, _ := strings.Cut(string(b), "\n")
	return a, r, a == "kvm" || a == "tcg"
}

// writeProbeCache keeps a result, atomically (a temporary file created
// O_EXCL and renamed over the name: a symbolic link planted there is
// replaced, never followed) in the private directory.
func writeProbeCache(dir, key, accel, reason string) error {
	d, err := openPrivateDir(dir)
	if err != nil {
		return fmt.Errorf("kvm probe cache: %w", err)
	}
	d.Close()
	if err := atomicfile.WriteFile(filepath.Join(dir, key), []byte(accel+"\n"+reason), 0o600); err != nil {
		return fmt.Errorf("kvm probe cache: %w", err)
	}
	return nil
}

func probeCacheKey(binary, kernel string) string {
	h := sha256.New()
	for _, p := range []string{binary, kernel} {
		if full, err := exec.LookPath(p); err == nil {
			p = full
		}
		st, _ := os.Stat(p)
		if st != nil {
			fmt.Fprintf(h, "%s|%d|%d\n", p, st.Size(), st.ModTime().UnixNano())
		}
	}
	return "aenv-kvm-probe-" + hex.EncodeToString(h.Sum(nil))[:16]
}

func probeKVM(ctx context.Context, binary, kernel string) (string, string) {
	ctx, cancel := context.WithTimeout(ctx, kvmProbeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "-M", "microvm", "-accel", "kvm", "-cpu", "host", "-m", "128M",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-serial", "stdio",
		"-kernel", kernel, "-append", "console=ttyS0 panic=-1 root=/dev/aenv-probe-none")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	switch {
	case ctx.Err() != nil:
		return "tcg", fmt.Sprintf("a KVM test guest hung for %s (nested KVM that cannot run this kernel)", kvmProbeTimeout)
	case bytes.Contains(out.Bytes(), []byte("Kernel panic")):
		return "kvm", fmt.Sprintf("a KVM test guest booted to its kernel in %s", time.Since(start).Round(time.Millisecond))
	default:
		return "tcg", fmt.Sprintf("a KVM test guest failed: %v: %s", err, lastLine(out.Bytes()))
	}
}

// HostTSCkHz reads the host TSC frequency, which a TCG guest's TSC follows.
func HostTSCkHz() int {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(k) != "cpu MHz" {
			continue
		}
		mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return 0
		}
		return int(mhz * 1000)
	}
	return 0
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}
