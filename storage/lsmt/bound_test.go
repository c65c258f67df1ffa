package lsmt

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
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

// boundSlack is what the data file may hold past the virtual size: its
// header, the growth allowed before freed space is reclaimed, and the file
// system's own blocks (an extent tree of a file full of holes).
func boundSlack(vs uint64) int64 {
	return HeaderSize + int64(growSlack(vs/SectorSize))*SectorSize + 64<<10
}

func newBoundUpper(t *testing.T, vs uint64) (*Upper, *Stack, string) {
	t.Helper()
	dir := t.TempDir()
	dp := filepath.Join(dir, "d")
	u, err := CreateUpper(dp, filepath.Join(dir, "i"), vs, UUID{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	st, err := NewStack(nil, u)
	if err != nil {
		t.Fatal(err)
	}
	return u, st, dp
}

// TestStraddlingWritesStayBounded: writes that each cover parts of two
// mappings ([0,2) then [1,3) sectors alternately, and 8 KiB writes at 4 KiB
// offsets over 4 KiB mappings) run 10,000 rounds each without an error;
// the data file's blocks stay within the disk's size and every read
// matches the model. The old upper appended each such write and answered
// ENOSPC once its data passed twice the disk.
func TestStraddlingWritesStayBounded(t *testing.T) {
	const vs = 1 << 20
	u, st, dp := newBoundUpper(t, vs)
	m := newHistModel(vs / SectorSize)
	for i := range 10_000 {
		if err := m.write(st, uint64(i%2), 2); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
	}
	for s := uint64(8); s < vs/SectorSize; s += 8 {
		if err := m.write(st, s, 8); err != nil {
			t.Fatal(err)
		}
	}
	r := rand.New(rand.NewPCG(1, 1))
	for i := range 10_000 {
		blk := 1 + r.Uint64N(vs/4096-2)
		if err := m.write(st, blk*8, 16); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
	}
	if err := m.check(st, false); err != nil {
		t.Fatal(err)
	}
	if a := allocated(t, dp); a > vs+boundSlack(vs) {
		t.Fatalf("the data file holds %d bytes of the host's disk, bound %d", a, vs+boundSlack(vs))
	}
	if err := u.checkSpace(); err != nil {
		t.Fatal(err)
	}
}

// TestTrimRewriteChurnStaysBounded: trims and writes of random ranges (a
// file system that discards what it frees), 10,000 rounds without a flush
// of their own: no error, reads match the model, the data file's blocks
// stay within the disk's size and its logical end within the soft limit.
// The old upper kept trimmed data and answered ENOSPC.
func TestTrimRewriteChurnStaysBounded(t *testing.T) {
	const vs = 2 << 20
	u, st, dp := newBoundUpper(t, vs)
	m := newHistModel(vs / SectorSize)
	if err := m.write(st, 0, vs/SectorSize); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(2, 2))
	for i := range 10_000 {
		s := r.Uint64N(vs / SectorSize)
		n := 1 + r.Uint64N(min(vs/SectorSize-s, 256))
		var err error
		if r.IntN(2) == 0 {
			err = m.trim(st, s, n)
		} else {
			err = m.write(st, s, n)
		}
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if i%5000 == 0 {
			if err := m.check(st, false); err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
		}
	}
	if err := m.check(st, false); err != nil {
		t.Fatal(err)
	}
	if a := allocated(t, dp); a > vs+boundSlack(vs) {
		t.Fatalf("the data file holds %d bytes of the host's disk, bound %d", a, vs+boundSlack(vs))
	}
	if fi, _ := os.Stat(dp); fi.Size() > int64(u.softLimit())*SectorSize {
		t.Fatalf("the data file grew to %d bytes, past the soft limit %d", fi.Size(), u.softLimit()*SectorSize)
	}
	if err := u.checkSpace(); err != nil {
		t.Fatal(err)
	}
}

// TestIndexStaysBounded: under trim and rewrite churn with a flush every
// 500 operations (each appends a batch), the index file never holds more
// than its rewrite threshold allows: the larger of 64 Ki entries and four
// per live mapping, plus one batch. The old upper's index grew with every
// operation.
func TestIndexStaysBounded(t *testing.T) {
	const vs = 1 << 20
	u, st, _ := newBoundUpper(t, vs)
	_, ip := u.Paths()
	m := newHistModel(vs / SectorSize)
	r := rand.New(rand.NewPCG(3, 3))
	last, rewrites := int64(0), 0
	for i := range 80_000 {
		s := r.Uint64N(vs / SectorSize)
		n := 1 + r.Uint64N(min(vs/SectorSize-s, 16))
		var err error
		if i%2 == 0 {
			err = m.trim(st, s, n)
		} else {
			err = m.write(st, s, n)
		}
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if i%500 != 499 {
			continue
		}
		if err := u.Flush(); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(ip)
		if err != nil {
			t.Fatal(err)
		}
		entries := (fi.Size() - HeaderSize) / MappingSize
		bound := max(defaultRewriteMin, 4*int64(u.Len())) + pendingLimit/MappingSize
		if entries > bound {
			t.Fatalf("round %d: the index holds %d entries for %d live mappings (bound %d)", i, entries, u.Len(), bound)
		}
		if entries < last {
			rewrites++
		}
		last = entries
	}
	if rewrites == 0 {
		t.Fatal("the index was never rewritten: the test tests nothing")
	}
	if err := m.check(st, false); err != nil {
		t.Fatal(err)
	}
	// What the rewritten index says is what the upper read before.
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	d, _ := u.Paths()
	u2, err := OpenUpper(d, ip, true)
	if err != nil {
		t.Fatal(err)
	}
	defer u2.Close()
	st2, _ := NewStack(nil, u2)
	if err := m.check(st2, false); err != nil {
		t.Fatalf("after reopening: %v", err)
	}
}
