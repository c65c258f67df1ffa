package lsmt

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/internal/crashdisk"
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
