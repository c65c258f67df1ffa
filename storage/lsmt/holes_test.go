package lsmt

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// failingSeeker answers SEEK_DATA with an error after the first range.
type failingSeeker struct {
	f     *os.File
	calls int
	err   error
}

func (s *failingSeeker) Seek(off int64, whence int) (int64, error) {
	if whence == seekData {
		if s.calls++; s.calls > 1 {
			return 0, &os.PathError{Op: "seek", Path: s.f.Name(), Err: s.err}
		}
	}
	return s.f.Seek(off, whence)
}

// TestDataRangesErrors: only ENXIO ends the scan; another SEEK_DATA error is
// an error, not the end of the data.
func TestDataRangesErrors(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "sparse")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, off := range []int64{0, 1 << 20, 2 << 20} {
		if _, err := f.WriteAt(make([]byte, 4096), off+8192); err != nil {
			t.Fatal(err)
		}
		f.WriteAt([]byte{1}, off+8192)
	}
	f.Truncate(4 << 20)
	var n int
	if err := DataRanges(f, 0, 4<<20, func(a, b int64) { n++ }); err != nil || n == 0 {
		t.Fatalf("plain scan: %d ranges, %v", n, err)
	}
	for _, errno := range []syscall.Errno{syscall.EIO, syscall.EINVAL, syscall.ESPIPE} {
		err := DataRanges(&failingSeeker{f: f, err: errno}, 0, 4<<20, func(a, b int64) {})
		if !errors.Is(err, errno) {
			t.Errorf("SEEK_DATA failing with %v: scan returned %v", errno, err)
		}
	}
	if err := DataRanges(&failingSeeker{f: f, err: syscall.ENXIO}, 0, 4<<20, func(a, b int64) {}); err != nil {
		t.Errorf("ENXIO is the end of the data, got %v", err)
	}
}
