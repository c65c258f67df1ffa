package lsmt

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestOverwriteInPlace: rewriting data the upper holds (whole mappings or
// parts of one) neither adds mappings nor grows the data file, and reads
// return the newest bytes.
func TestOverwriteInPlace(t *testing.T) {
	dir := t.TempDir()
	u, err := CreateUpper(filepath.Join(dir, "d"), filepath.Join(dir, "i"), 4<<20, UUID{})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	st, err := NewStack(nil, u)
	if err != nil {
		t.Fatal(err)
	}
	region := bytes.Repeat([]byte{1}, 1<<20)
	if _, err := u.WriteAt(region, 1<<20); err != nil {
		t.Fatal(err)
	}
	st0, _ := os.Stat(filepath.Join(dir, "d"))
	segs := u.Len()
	for i := range 100 {
		b := bytes.Repeat([]byte{byte(i)}, 4096)
		if _, err := u.WriteAt(b, 1<<20+int64(i%256)*4096); err != nil {
			t.Fatal(err)
		}
		if _, err := u.WriteAt(bytes.Repeat([]byte{byte(i)}, 1<<20), 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := u.WriteAt(bytes.Repeat([]byte{7}, 4096), 1<<20+8192); err != nil {
		t.Fatal(err)
	}
	st1, _ := os.Stat(filepath.Join(dir, "d"))
	if st1.Size() != st0.Size() || u.Len() != segs {
		t.Fatalf("rewrites grew the upper: %d -> %d bytes, %d -> %d mappings", st0.Size(), st1.Size(), segs, u.Len())
	}
	got := make([]byte, 3*4096)
	if _, err := st.ReadAt(got, 1<<20+4096); err != nil {
		t.Fatal(err)
	}
	want := append(append(bytes.Repeat([]byte{99}, 4096), bytes.Repeat([]byte{7}, 4096)...), bytes.Repeat([]byte{99}, 4096)...)
	if !bytes.Equal(got, want) {
		t.Fatal("reads after in-place rewrites do not return the newest bytes")
	}
}

// TestUpperBoundIsENOSPC: writes that defeat in-place rewriting (each
// straddles two mappings) fill the upper's data to twice the disk, then
// fail with ENOSPC; the file stays bounded and what was written reads back.
func TestUpperBoundIsENOSPC(t *testing.T) {
	dir := t.TempDir()
	const size = 64 << 10
	u, err := CreateUpper(filepath.Join(dir, "d"), filepath.Join(dir, "i"), size, UUID{})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	stack, err := NewStack(nil, u)
	if err != nil {
		t.Fatal(err)
	}
	var last []byte
	var lastOff int64
	var werr error
	for i := 0; i < 10_000 && werr == nil; i++ {
		off := int64(i%2) * SectorSize // [0,2) then [1,3) sectors, alternately
		b := bytes.Repeat([]byte{byte(i)}, 2*SectorSize)
		if _, werr = u.WriteAt(b, off); werr == nil {
			last, lastOff = b, off
		}
	}
	if !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("a full upper answered %v, want ENOSPC", werr)
	}
	st, _ := os.Stat(filepath.Join(dir, "d"))
	if st.Size() > HeaderSize+2*size {
		t.Fatalf("the data file grew to %d bytes (bound %d)", st.Size(), HeaderSize+2*size)
	}
	got := make([]byte, len(last))
	if _, err := stack.ReadAt(got, lastOff); err != nil || !bytes.Equal(got, last) {
		t.Fatalf("the last accepted write does not read back: %v", err)
	}
}
