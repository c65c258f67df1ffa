package qemu

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// kvmProbeTimeout bounds the test boot under KVM. A working KVM reaches the
// kernel panic of a guest without root filesystem in well under a second; a
// nested KVM that cannot run the guest hangs instead of failing.
const kvmProbeTimeout = 15 * time.Second

// DetectAccel picks "kvm" when a test guest boots with it and "tcg"
// otherwise, and says why. $AENV_QEMU_ACCEL forces a choice. The result is
// cached per QEMU binary and kernel in the temp directory, so test binaries
// and restarts do not pay for the probe again.
func DetectAccel(ctx context.Context, binary, kernel string) (accel, reason string) {
	if a := os.Getenv("AENV_QEMU_ACCEL"); a == "kvm" || a == "tcg" {
		return a, "forced by AENV_QEMU_ACCEL"
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg", fmt.Sprintf("/dev/kvm unusable: %v", err)
	}
	f.Close()
	cache := probeCachePath(binary, kernel)
	if b, err := os.ReadFile(cache); err == nil {
		a, r, _ := strings.Cut(string(b), "\n")
		if a == "kvm" || a == "tcg" {
			return a, r + " (cached)"
		}
	}
	accel, reason = probeKVM(ctx, binary, kernel)
	_ = os.WriteFile(cache, []byte(accel+"\n"+reason), 0o644)
	return accel, reason
}

func probeCachePath(binary, kernel string) string {
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
	return filepath.Join(os.TempDir(), "aenv-kvm-probe-"+hex.EncodeToString(h.Sum(nil))[:16])
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
