package lsmt

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"syscall"
	"testing"
)

// Helpers of the tests of the upper's space: sectors tagged with their own
// number and a version, a model of what each sector may read, and a check
// of the space sets.

// tagSector fills b (one sector) with the content of version ver of sector
// sec; version 0 is zeros (never written, or trimmed).
func tagSector(b []byte, sec, ver uint64) {
	if ver == 0 {
		clear(b)
		return
	}
	binary.LittleEndian.PutUint64(b, sec+1)
	binary.LittleEndian.PutUint64(b[8:], ver)
	for i := 16; i < SectorSize; i++ {
		b[i] = byte(sec*31+ver*7+uint64(i)) | 1
	}
}

// sectorTag reads back what tagSector wrote: the sector and version, or
// ok false for bytes no version of any sector has (garbage, a torn write).
func sectorTag(b []byte) (sec, ver uint64, ok bool) {
	if isZero(b) {
		return 0, 0, true
	}
	sec, ver = binary.LittleEndian.Uint64(b)-1, binary.LittleEndian.Uint64(b[8:])
	var want [SectorSize]byte
	tagSector(want[:], sec, ver)
	return sec, ver, ver != 0 && string(want[:]) == string(b)
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// histModel is what each sector of a disk holds (cur, a version) and what
// it may read after a crash: any version it had since the last flush.
type histModel struct {
	cur  []uint64
	hist [][]uint64
	ver  uint64 // the last version handed out
}

func newHistModel(sectors int) *histModel {
	m := &histModel{cur: make([]uint64, sectors), hist: make([][]uint64, sectors)}
	for s := range m.hist {
		m.hist[s] = []uint64{0}
	}
	return m
}

func (m *histModel) set(s, v uint64) {
	m.cur[s] = v
	if !slices.Contains(m.hist[s], v) {
		m.hist[s] = append(m.hist[s], v)
	}
}

// flushed: a flush returned, every sector is durable as it is now.
func (m *histModel) flushed() {
	for s := range m.hist {
		m.hist[s] = append(m.hist[s][:0], m.cur[s])
	}
}

// write writes n sectors at sec, each a new version, through w.
func (m *histModel) write(w interface {
	WriteAt([]byte, int64) (int, error)
}, sec, n uint64) error {
	b := make([]byte, n*SectorSize)
	for i := range n {
		m.ver++
		tagSector(b[i*SectorSize:(i+1)*SectorSize], sec+i, m.ver)
	}
	if _, err := w.WriteAt(b, int64(sec)*SectorSize); err != nil {
		return fmt.Errorf("write [%d,+%d): %w", sec, n, err)
	}
	for i := range n {
		m.set(sec+i, m.ver-n+1+i)
	}
	return nil
}

func (m *histModel) trim(t interface{ Trim(int64, int64) error }, sec, n uint64) error {
	if err := t.Trim(int64(sec)*SectorSize, int64(n)*SectorSize); err != nil {
		return fmt.Errorf("trim [%d,+%d): %w", sec, n, err)
	}
	for i := range n {
		m.set(sec+i, 0)
	}
	return nil
}

// check reads the whole disk: every sector must hold its current version
// (crashed false) or one it had since the last flush (crashed true).
func (m *histModel) check(r interface {
	ReadAt([]byte, int64) (int, error)
}, crashed bool) error {
	disk := make([]byte, len(m.cur)*SectorSize)
	if _, err := r.ReadAt(disk, 0); err != nil {
		return err
	}
	for s := range m.cur {
		sec, ver, ok := sectorTag(disk[s*SectorSize : (s+1)*SectorSize])
		switch {
		case !ok:
			return fmt.Errorf("sector %d holds bytes no write wrote", s)
		case ver != 0 && sec != uint64(s):
			return fmt.Errorf("sector %d holds sector %d's data (version %d)", s, sec, ver)
		case !crashed && ver != m.cur[s]:
			return fmt.Errorf("sector %d holds version %d, want %d", s, ver, m.cur[s])
		case crashed && !slices.Contains(m.hist[s], ver):
			return fmt.Errorf("sector %d holds version %d after a crash, want one of %v", s, ver, m.hist[s])
		}
	}
	return nil
}

// allocated is how many bytes of the host's disk a file holds.
func allocated(t testing.TB, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Blocks * 512
}

// checkSpace verifies the space sets of a quiescent log-structured upper
// (no operation in flight): live data, free, limbo, durable and waiting
// space never overlap, and together they are all of [HeaderSize, dataEnd).
func (u *Upper) checkSpace() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	type labelled struct {
		extent
		what string
	}
	var all []labelled
	u.tree.Ascend(func(s Segment) bool {
		if !s.Zeroed {
			all = append(all, labelled{extent{s.MOffset, uint64(s.Length)}, fmt.Sprintf("live %d", s.Offset)})
		}
		return true
	})
	var free uint64
	u.sp.free.byStart.Ascend(func(e extent) bool {
		all = append(all, labelled{e, "free"})
		free += e.n
		return true
	})
	if free != u.sp.free.total || u.sp.free.bySize.Len() != u.sp.free.byStart.Len() {
		return fmt.Errorf("free extents disagree: %d sectors counted, %d recorded, %d by size, %d by start",
			free, u.sp.free.total, u.sp.free.bySize.Len(), u.sp.free.byStart.Len())
	}
	for _, set := range []struct {
		name string
		es   []extent
	}{{"limbo", u.sp.limbo}, {"durable", u.sp.durable}, {"waiting", u.sp.waiting}} {
		for _, e := range set.es {
			all = append(all, labelled{e, set.name})
		}
	}
	slices.SortFunc(all, func(a, b labelled) int { return cmp.Compare(a.start, b.start) })
	pos := uint64(HeaderSize / SectorSize)
	for _, e := range all {
		if e.start != pos {
			if e.start < pos {
				return fmt.Errorf("%s space [%d,+%d) overlaps other space (up to %d)", e.what, e.start, e.n, pos)
			}
			return fmt.Errorf("space [%d,%d) is neither live, free nor on its way to free (leaked)", pos, e.start)
		}
		pos = e.end()
	}
	if pos != u.dataEnd {
		return fmt.Errorf("space ends at %d, the data file at %d", pos, u.dataEnd)
	}
	return nil
}
