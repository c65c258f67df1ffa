package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// trimFileMiB is what each cycle of TestGuestTrimReachesStorage writes.
const trimFileMiB = 32

// TestGuestTrimReachesStorage: the guest's TRIM reaches the sandbox's
// writable upper on the host (virtio-blk discard, QEMU's drive with
// discard=unmap, NBD TRIM, the storage daemon punching the upper's data
// file). Three cycles write a file in the guest, sync, delete it and run
// fstrim: each trim gives the file's blocks back (the upper's allocated
// size, st_blocks, drops by most of the file), and the upper stays bounded
// instead of growing by a file each cycle.
func TestGuestTrimReachesStorage(t *testing.T) {
	n := sharedNode(t)
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	n.sh(t, id, "sync; fstrim / >/dev/null 2>&1 || true") // a settled upper to start from
	base := n.upperBlocks(t, id)
	file := int64(trimFileMiB) << 20
	for cycle := 1; cycle <= 3; cycle++ {
		n.sh(t, id, fmt.Sprintf("dd if=/dev/urandom of=/home/user/trim.bin bs=1M count=%d status=none && sync", trimFileMiB))
		written := n.upperBlocks(t, id)
		if written < base+file*3/4 {
			t.Fatalf("cycle %d: the upper holds %d bytes after writing %d MiB, %d before: the write did not reach it", cycle, written, trimFileMiB, base)
		}
		out := n.sh(t, id, "rm /home/user/trim.bin && sync && fstrim -v /")
		trimmed := n.upperBlocks(t, id)
		t.Logf("cycle %d: upper %d bytes at the start, %d after the write, %d after the trim (%s)", cycle, base, written, trimmed, out)
		if trimmed > written-file*3/4 {
			t.Fatalf("cycle %d: the upper holds %d bytes after rm and fstrim, %d before: the guest's trim did not reach storage (fstrim: %s)", cycle, trimmed, written, out)
		}
		if trimmed > base+file/2 {
			t.Fatalf("cycle %d: the upper grows: %d bytes after the trim, %d at the start", cycle, trimmed, base)
		}
	}
}

// upperBlocks is the space allocated (st_blocks) to the data file of the
// writable upper of sandbox id's root disk in the storage daemon's state.
func (n *node) upperBlocks(t *testing.T, id string) int64 {
	t.Helper()
	recs, _ := filepath.Glob(filepath.Join(n.DataDir, "storaged", "state", "devices", "*", "device.json"))
	for _, p := range recs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // a device going away
		}
		var rec struct {
			Owner string `json:"owner"`
			Kind  string `json:"kind"`
			Gen   int    `json:"gen"`
		}
		if json.Unmarshal(b, &rec) != nil || rec.Owner != id || rec.Kind != "runtime" {
			continue
		}
		var st syscall.Stat_t
		data := filepath.Join(filepath.Dir(p), fmt.Sprintf("upper.%d.data", rec.Gen))
		if err := syscall.Stat(data, &st); err != nil {
			t.Fatalf("upper of %s: %v", id, err)
		}
		return st.Blocks * 512
	}
	t.Fatalf("no runtime device of %s among %v", id, recs)
	return 0
}
