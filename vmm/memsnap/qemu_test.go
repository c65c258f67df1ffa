package memsnap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/testenv"
)

// TestCaptureQEMU captures the guest RAM of a real QEMU (TCG, microvm, no
// guest kernel: firmware and QEMU's own reset writes dirty a few pages) that
// maps its memory file privately, the way a restored VM does, and checks
// base+diff against QEMU's view of guest RAM.
func TestCaptureQEMU(t *testing.T) {
	t.Parallel()
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		testenv.Missing(t, "qemu-system-x86_64 not installed")
	}
	ctx := context.Background()
	dir := t.TempDir()
	memFile := filepath.Join(dir, "mem")
	const size = 64 << 20
	// A base image with data, so the diff has something to hide.
	content := writeMemFile(t, memFile, size/ps, 9, []int64{0, 1, 100, 1000, 16383})
	base := filepath.Join(dir, "base.lsmt")
	if _, err := ImportFull(ctx, memFile, base, ""); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(qemu, "-M", "microvm", "-accel", "tcg", "-m", "64M",
		"-object", "memory-backend-file,id=mem,size=64M,mem-path="+memFile+",share=off,prealloc=off",
		"-machine", "memory-backend=mem", "-nodefaults", "-no-user-config", "-nographic",
		"-serial", "none", "-monitor", "none", "-display", "none")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	// Let the firmware run a moment after QEMU maps guest RAM, then stop
	// every thread (vCPUs included), as a paused VM.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := FindRegion(pid, memFile); err == nil {
			break
		} else if time.Now().After(deadline) || errors.Is(err, ErrProcessGone) {
			t.Fatalf("QEMU never mapped %s: %v (stderr: %s)", memFile, err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	diff := filepath.Join(dir, "diff.lsmt")
	st, err := CaptureDiff(ctx, pid, memFile, diff, [16]byte{}, "qemu")
	if err != nil {
		t.Fatal(err)
	}
	if st.Pages+st.ZeroPages == 0 {
		t.Errorf("QEMU wrote no guest page? stats %+v", st)
	}
	region, err := FindRegion(pid, memFile)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem := make([]byte, region.Size())
	if _, err := f.ReadAt(mem, int64(region.Start)); err != nil {
		t.Fatal(err)
	}
	flat := filepath.Join(dir, "flat")
	if err := Materialize(ctx, []string{base, diff}, flat); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, flat); !bytes.Equal(got, mem) {
		t.Fatalf("base+diff differs from QEMU's guest RAM at %s", firstDiff(got, mem))
	}
	t.Logf("QEMU wrote %d pages (%d zero) of %d MiB; guest RAM differs from the image in %d pages",
		st.Pages, st.ZeroPages, size>>20, countDiffPages(content, mem))
}

func countDiffPages(a, b []byte) int {
	n := 0
	for p := int64(0); (p+1)*ps <= int64(len(a)); p++ {
		if !bytes.Equal(a[p*ps:(p+1)*ps], b[p*ps:(p+1)*ps]) {
			n++
		}
	}
	return n
}
