package daemon

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
)

func needTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("%s not installed (Debian qemu-utils): %v", name, err)
	}
}

// TestQemuImgCompareDevice: QEMU's NBD client reads a daemon device (a shared
// device and a runtime device) and finds it identical to the expected raw file.
func TestQemuImgCompareDevice(t *testing.T) {
	t.Parallel()
	needTool(t, "qemu-img")
	f := newFixture(t, 11)
	h := start(t, testOptions(t))
	ctx := ctxT(t)
	raw := filepath.Join(t.TempDir(), "expected.raw")
	if err := os.WriteFile(raw, f.want, 0o600); err != nil {
		t.Fatal(err)
	}
	sh, err := h.c.AcquireShared(ctx, f.config, "vm")
	if err != nil {
		t.Fatal(err)
	}
	rt, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config})
	if err != nil {
		t.Fatal(err)
	}
	for _, dev := range []rpc.Device{sh, rt} {
		out, err := exec.Command("qemu-img", "compare", "-f", "raw", "-F", "raw", raw, dev.URI).CombinedOutput()
		if err != nil {
			t.Fatalf("qemu-img compare %s device: %v\n%s", dev.Kind, err, out)
		}
	}
}

// TestQemuIoRestack: qemu-io writes patterned extents into a device, the
// device is restacked, and qemu-io reads the patterns back through the new
// stack; the sealed layer alone (with the base) holds them too.
func TestQemuIoRestack(t *testing.T) {
	t.Parallel()
	needTool(t, "qemu-io")
	f := newFixture(t, 12)
	h := start(t, testOptions(t))
	ctx := ctxT(t)
	dev, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config})
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(f.want)
	var writes, reads []string
	for i := range 16 {
		off, n, pat := i*(diskSize/16)+4096*(i%7), 4096*(1+i%5), 0x10+i
		writes = append(writes, "-c", fmt.Sprintf("write -P %d %d %d", pat, off, n))
		reads = append(reads, "-c", fmt.Sprintf("read -P %d %d %d", pat, off, n))
		copy(want[off:off+n], bytes.Repeat([]byte{byte(pat)}, n))
	}
	qemuIO := func(args []string) {
		t.Helper()
		out, err := exec.Command("qemu-io", append(args, "-f", "raw", dev.URI)...).CombinedOutput()
		if err != nil || bytes.Contains(bytes.ToLower(out), []byte("fail")) {
			t.Fatalf("qemu-io: %v\n%s", err, out)
		}
	}
	qemuIO(append(writes, "-c", "flush"))
	res, err := h.c.Restack(ctx, rpc.RestackParams{ID: dev.ID})
	if err != nil {
		t.Fatal(err)
	}
	qemuIO(reads)
	im, err := image.OpenLayers(ctx, []string{f.base, res.Layer}, image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if got := readAll(t, im, diskSize); !bytes.Equal(got, want) {
		t.Fatal("sealed layer does not hold qemu-io's writes")
	}
}
