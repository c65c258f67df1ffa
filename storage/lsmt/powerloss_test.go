package lsmt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/internal/crashdisk"
	"github.com/agentenv/agentenv/internal/failpoint"
	"golang.org/x/sys/unix"
)

// TestUpperPowerLoss: after a power cut a range of a writable upper reads its
// old or its new data, never zeros, whatever order the kernel wrote dirty
// pages back in. The test lets writeback reach the disk in the worst order
// it may: the index file and the tail of the data file (which extends the
// data file's size on disk over data that is not there).
func TestUpperPowerLoss(t *testing.T) {
	d := crashdisk.New(t, 64)
	const vs = 4 << 20
	dp, ip := filepath.Join(d.Root(), "up.data"), filepath.Join(d.Root(), "up.index")
	u, err := CreateUpper(dp, ip, vs, UUID{})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	old := bytes.Repeat([]byte{0xa5}, vs)
	if _, err := u.WriteAt(old, 0); err != nil {
		t.Fatal(err)
	}
	if err := u.Flush(); err != nil {
		t.Fatal(err)
	}
	// More sector writes than one index batch holds, none flushed: the
	// batch that fills up goes to the index file on its own.
	r := rand.New(rand.NewPCG(1, 2))
	sec := make([]byte, SectorSize)
	for i := range pendingLimit/MappingSize + 1000 {
		s := r.IntN(vs / SectorSize)
		binary.LittleEndian.PutUint64(sec, uint64(i+1))
		copy(sec[8:], bytes.Repeat([]byte{0x5a}, SectorSize-8))
		if _, err := u.WriteAt(sec, int64(s)*SectorSize); err != nil {
			t.Fatal(err)
		}
	}
	writeback(t, dp, true)
	writeback(t, ip, false)
	root := d.Crash()
	got, err := OpenUpper(filepath.Join(root, "up.data"), filepath.Join(root, "up.index"), true)
	if err != nil {
		t.Fatalf("the upper does not open after a power loss: %v", err)
	}
	defer got.Close()
	st, err := NewStack(nil, got)
	if err != nil {
		t.Fatal(err)
	}
	disk := make([]byte, vs)
	if _, err := st.ReadAt(disk, 0); err != nil {
		t.Fatal(err)
	}
	zeros := 0
	for s := 0; s < vs; s += SectorSize {
		b := disk[s : s+SectorSize]
		switch {
		case bytes.Equal(b, old[:SectorSize]):
		case binary.LittleEndian.Uint64(b) != 0 && bytes.Equal(b[8:], bytes.Repeat([]byte{0x5a}, SectorSize-8)):
		default:
			zeros++
		}
	}
	if zeros > 0 {
		t.Fatalf("%d of %d sectors read neither their old nor their new data after a power loss", zeros, vs/SectorSize)
	}
}

// writeback writes a file's dirty pages to the disk as the kernel's flusher
// may at any moment: the whole file, or only its last page (tail).
func writeback(t *testing.T, path string, tail bool) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !tail {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		return
	}
	st, _ := f.Stat()
	off := (st.Size() - 1) / 4096 * 4096
	flags := unix.SYNC_FILE_RANGE_WAIT_BEFORE | unix.SYNC_FILE_RANGE_WRITE | unix.SYNC_FILE_RANGE_WAIT_AFTER
	if err := unix.SyncFileRange(int(f.Fd()), off, st.Size()-off, flags); err != nil {
		t.Fatal(err)
	}
}

// TestUpperPowerLossReuse: with trimmed space reused and the index
// rewritten, after a power cut at any of these points every sector of the
// upper reads a version it had since the last flush (zeros where a trim
// was acknowledged), never another sector's data. The data file's dirty
// pages (new data in reused space) reach the disk first, the worst order.
// A power cut right after a trim freed space and a write reused it, before
// the trim was durable, would bring back the old mapping over the new
// write's data.
func TestUpperPowerLossReuse(t *testing.T) {
	d := crashdisk.New(t, 64)
	const vs = 1 << 20
	dp, ip := filepath.Join(d.Root(), "up.data"), filepath.Join(d.Root(), "up.index")
	u, err := CreateUpper(dp, ip, vs, UUID{})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	u.rewriteMin = 64
	m := newHistModel(vs / SectorSize)
	crash := func(label string, writeBack bool) {
		t.Helper()
		if writeBack {
			writeback(t, dp, false)
		}
		checkCrashed(t, d.Crash(), m, label)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	flush := func() {
		t.Helper()
		must(u.Flush())
		m.flushed()
	}
	must(m.write(u, 0, 1024))
	flush()
	crash("written", true)

	must(m.trim(u, 0, 512))
	must(m.write(u, 1024, 512)) // before the trim is durable: new space
	crash("trimmed and written, not flushed", false)
	crash("trimmed and written, data written back", true)

	flush()
	must(m.write(u, 1536, 512)) // the trimmed space, reused
	crash("reused, not flushed", true)
	flush()
	crash("reused and flushed", true)

	// Churn small ranges of a few sectors until the index holds more than
	// four entries per live mapping, then crash around the rewrite.
	r := rand.New(rand.NewPCG(5, 5))
	for i := range 600 {
		s := 1536 + r.Uint64N(56)
		if i%2 == 0 {
			must(m.trim(u, s, 1+r.Uint64N(8)))
		} else {
			must(m.write(u, s, 1+r.Uint64N(8)))
		}
	}
	for _, point := range []string{"lsmt/index-rewrite/synced", "lsmt/index-rewrite/renamed"} {
		must(failpoint.Arm(point, "error"))
		err := u.Flush()
		failpoint.Arm(point, "")
		if !errors.Is(err, failpoint.ErrInjected) {
			t.Fatalf("flush with %s armed: %v, want the injected error (no rewrite?)", point, err)
		}
		crash("rewrite failed at "+point, true)
	}
	before, _ := os.Stat(ip)
	flush()
	after, _ := os.Stat(ip)
	if os.SameFile(before, after) {
		t.Fatal("the flush after the failed ones did not rewrite the index")
	}
	crash("index rewritten", true)
	must(m.check(stackOf(t, u), false))
}

// checkCrashed opens the upper of a crashed copy (writable: opening frees
// and punches its garbage) and checks every sector against the model.
func checkCrashed(t *testing.T, root string, m *histModel, label string) {
	t.Helper()
	u, err := OpenUpper(filepath.Join(root, "up.data"), filepath.Join(root, "up.index"), false)
	if err != nil {
		t.Fatalf("%s: the upper does not open after a power loss: %v", label, err)
	}
	defer u.Close()
	if err := m.check(stackOf(t, u), true); err != nil {
		t.Fatalf("%s: %v", label, err)
	}
	if err := u.checkSpace(); err != nil {
		t.Fatalf("%s: %v", label, err)
	}
}

func stackOf(t *testing.T, u *Upper) *Stack {
	t.Helper()
	st, err := NewStack(nil, u)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
