package lsmt

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/google/btree"
)

// Upper is a writable layer: log-structured (a data file with appended data and
// an index file with appended mappings) or sparse (one file where sector s lives
// at byte 4096+512*s and the mappings are the file's allocated extents).
//
// The in-memory index is a B-tree so that overriding writes cost O(log n) even
// with a million live segments. Mappings are appended to the index file in
// batches, and a batch is written only after the data it maps was fsynced,
// then fsynced itself: whatever order the kernel writes dirty pages back in,
// after a crash or a power loss the index never points at data that is not
// on disk, so a range reads back its old or its new data, never zeros.
type Upper struct {
	mu        sync.RWMutex
	flushMu   sync.Mutex // serializes index batches (held across the fsyncs; mu is not)
	dataPath  string
	indexPath string
	data      *os.File
	index     *os.File // nil for a sparse layer
	hdr       HeaderTrailer
	tree      *btree.BTreeG[Segment]
	mapped    atomic.Bool // the tree ever held a mapping: reads of a fresh upper skip the lock
	dataEnd   uint64      // sectors: next append position (log-structured)
	indexEnd  int64       // bytes of the index file written (under flushMu)
	pending   []byte      // encoded mappings not yet written to the index file (under mu)
	spare     []byte      // the previous batch's buffer, for reuse
	readOnly  bool
	closed    bool
	// Recovered counts index bytes dropped at open (a torn or invalid tail).
	Recovered int64
}

const pendingLimit = 64 << 10

// ErrReadOnly is returned for writes to something opened read-only.
var ErrReadOnly = errors.New("lsmt: read-only")

func newTree() *btree.BTreeG[Segment] {
	return btree.NewG[Segment](32, func(a, b Segment) bool { return a.Offset < b.Offset })
}

// CreateUpper creates a log-structured writable layer of virtualSize bytes.
// parent is recorded as the parent uuid (the top lower layer), may be nil.
func CreateUpper(dataPath, indexPath string, virtualSize uint64, parent UUID) (*Upper, error) {
	if virtualSize == 0 || virtualSize%SectorSize != 0 || virtualSize > MaxVirtualSize {
		return nil, fmt.Errorf("create upper %s: virtual size %d must be a positive multiple of 512", dataPath, virtualSize)
	}
	id := NewUUID()
	dh := HeaderTrailer{Flags: FlagHeader | FlagData, VirtualSize: virtualSize, UUID: id, ParentUUID: parent}
	ih := HeaderTrailer{Flags: FlagHeader, IndexOffset: HeaderSize, VirtualSize: virtualSize, UUID: id, ParentUUID: parent}
	if err := writeNew(dataPath, dh.Marshal()); err != nil {
		return nil, fmt.Errorf("create upper data %s: %w", dataPath, err)
	}
	if err := writeNew(indexPath, ih.Marshal()); err != nil {
		return nil, fmt.Errorf("create upper index %s: %w", indexPath, err)
	}
	// The names must be durable before a config names them.
	if err := syncDirs(dataPath, indexPath); err != nil {
		return nil, fmt.Errorf("create upper %s: %w", dataPath, err)
	}
	return OpenUpper(dataPath, indexPath, false)
}

// CreateSparseUpper creates a sparse writable layer file of 4096+virtualSize bytes.
func CreateSparseUpper(path string, virtualSize uint64, parent UUID) (*Upper, error) {
	if virtualSize == 0 || virtualSize%SectorSize != 0 || virtualSize > MaxVirtualSize {
		return nil, fmt.Errorf("create sparse upper %s: virtual size %d must be a positive multiple of 512", path, virtualSize)
	}
	h := HeaderTrailer{Flags: FlagHeader | FlagData | FlagSparse, VirtualSize: virtualSize, UUID: NewUUID(), ParentUUID: parent}
	if err := writeNew(path, h.Marshal()); err != nil {
		return nil, fmt.Errorf("create sparse upper %s: %w", path, err)
	}
	if err := os.Truncate(path, int64(HeaderSize+virtualSize)); err != nil {
		return nil, fmt.Errorf("create sparse upper %s: %w", path, err)
	}
	if err := syncDirs(path); err != nil {
		return nil, fmt.Errorf("create sparse upper %s: %w", path, err)
	}
	return OpenUpper(path, "", false)
}

// syncDirs fsyncs the directories holding paths (each once).
func syncDirs(paths ...string) error {
	done := map[string]bool{}
	for _, p := range paths {
		d := filepath.Dir(p)
		if done[d] {
			continue
		}
		done[d] = true
		if err := atomicfile.SyncDir(d); err != nil {
			return err
		}
	}
	return nil
}

func writeNew(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// OpenUpper opens a writable layer. indexPath "" means a sparse layer. A
// read-only open never modifies the files (no recovery truncation).
func OpenUpper(dataPath, indexPath string, readOnly bool) (*Upper, error) {
	u := &Upper{dataPath: dataPath, indexPath: indexPath, readOnly: readOnly, tree: newTree()}
	if err := u.open(); err != nil {
		u.closeFiles()
		return nil, fmt.Errorf("open upper %s: %w", dataPath, err)
	}
	return u, nil
}

func (u *Upper) open() error {
	flag := os.O_RDWR
	if u.readOnly {
		flag = os.O_RDONLY
	}
	var err error
	if u.data, err = os.OpenFile(u.dataPath, flag, 0); err != nil {
		return err
	}
	st, err := u.data.Stat()
	if err != nil {
		return err
	}
	buf := make([]byte, HTSize)
	if err := readFull(u.data, buf, 0); err != nil {
		return fmt.Errorf("data header: %w", err)
	}
	dh, err := ParseHeaderTrailer(buf)
	if err != nil {
		return fmt.Errorf("data header: %w", err)
	}
	if !dh.IsHeader() || !dh.IsData() || dh.IsSealed() {
		return fmt.Errorf("%w: data header flags %#x are not those of a writable data file", ErrFormat, dh.Flags)
	}
	u.hdr = dh
	if st.Size() < HeaderSize {
		return fmt.Errorf("%w: data file is %d bytes, shorter than its 4096-byte header", ErrFormat, st.Size())
	}
	if u.indexPath == "" {
		if !dh.IsSparse() {
			return fmt.Errorf("%w: no index file given and the data file is not sparse", ErrFormat)
		}
		return u.loadSparse(st.Size())
	}
	if dh.IsSparse() {
		return fmt.Errorf("%w: data file is sparse but an index file was given", ErrFormat)
	}
	u.dataEnd = (uint64(st.Size()) + SectorSize - 1) / SectorSize
	if u.index, err = os.OpenFile(u.indexPath, flag, 0); err != nil {
		return err
	}
	return u.loadIndex()
}

func (u *Upper) loadIndex() error {
	st, err := u.index.Stat()
	if err != nil {
		return err
	}
	buf := make([]byte, HTSize)
	if err := readFull(u.index, buf, 0); err != nil {
		return fmt.Errorf("index %s header: %w", u.indexPath, err)
	}
	ih, err := ParseHeaderTrailer(buf)
	if err != nil {
		return fmt.Errorf("index %s header: %w", u.indexPath, err)
	}
	if !ih.IsHeader() || ih.IsData() {
		return fmt.Errorf("%w: index %s header flags %#x are not those of an index file", ErrFormat, u.indexPath, ih.Flags)
	}
	if ih.UUID != u.hdr.UUID {
		return fmt.Errorf("%w: index %s uuid %s differs from the data file's %s", ErrFormat, u.indexPath, ih.UUID, u.hdr.UUID)
	}
	if ih.VirtualSize != 0 {
		u.hdr.VirtualSize = ih.VirtualSize
	}
	if u.hdr.VirtualSize == 0 || u.hdr.VirtualSize%SectorSize != 0 {
		return fmt.Errorf("%w: virtual size %d is not a positive multiple of 512", ErrFormat, u.hdr.VirtualSize)
	}
	start := int64(HeaderSize)
	if st.Size() < start {
		return fmt.Errorf("%w: index %s is %d bytes, shorter than its 4096-byte header", ErrFormat, u.indexPath, st.Size())
	}
	if ih.IndexOffset != 0 && ih.IndexOffset != HeaderSize {
		return fmt.Errorf("%w: index %s index_offset %d, want 4096", ErrFormat, u.indexPath, ih.IndexOffset)
	}
	size := st.Size()
	vsec := u.hdr.VirtualSize / SectorSize
	chunk := make([]byte, max(min(1<<20, (size-start)/MappingSize*MappingSize), MappingSize))
	good := start
	for pos := start; pos+MappingSize <= size; {
		n := min(int64(len(chunk)), (size-pos)/MappingSize*MappingSize)
		if err := readFull(u.index, chunk[:n], pos); err != nil {
			return fmt.Errorf("index %s: %w", u.indexPath, err)
		}
		for i := int64(0); i < n; i += MappingSize {
			s := DecodeMapping(chunk[i:])
			if !s.IsPadding() {
				if reason := u.badEntry(s, vsec); reason != "" {
					slog.Warn("lsmt: upper index ends in an invalid entry; dropping the tail",
						"index", u.indexPath, "offset", pos+i, "reason", reason)
					return u.truncateIndex(pos+i, size)
				}
				u.insertLocked(s)
			}
			good = pos + i + MappingSize
		}
		pos += n
	}
	return u.truncateIndex(good, size)
}

func (u *Upper) badEntry(s Segment, vsec uint64) string {
	switch {
	case s.Length > MaxSegmentLen:
		return "length too large"
	case s.End() > vsec:
		return "past the virtual size"
	case !s.Zeroed && (s.MOffset < HeaderSize/SectorSize || s.MOffset+uint64(s.Length) > u.dataEnd):
		return "points past the end of the data file"
	}
	return ""
}

// truncateIndex drops a torn or invalid tail [good, size).
func (u *Upper) truncateIndex(good, size int64) error {
	u.indexEnd = good
	if good == size {
		return nil
	}
	u.Recovered = size - good
	if u.readOnly {
		return nil
	}
	if err := u.index.Truncate(good); err != nil {
		return fmt.Errorf("truncate torn index %s to %d: %w", u.indexPath, good, err)
	}
	return nil
}

func (u *Upper) loadSparse(size int64) error {
	vs := u.hdr.VirtualSize
	if vs == 0 || vs%SectorSize != 0 {
		return fmt.Errorf("%w: sparse virtual size %d is not a positive multiple of 512", ErrFormat, vs)
	}
	if size < int64(HeaderSize+vs) && !u.readOnly {
		if err := u.data.Truncate(int64(HeaderSize + vs)); err != nil {
			return err
		}
	}
	end := int64(HeaderSize + vs)
	err := DataRanges(u.data, HeaderSize, end, func(d, h int64) {
		s0 := uint64(d-HeaderSize) / SectorSize
		s1 := (uint64(h-HeaderSize) + SectorSize - 1) / SectorSize
		for s := s0; s < s1; {
			n := min(s1-s, MaxSegmentLen)
			u.tree.ReplaceOrInsert(Segment{Offset: s, MOffset: s + HeaderSize/SectorSize, Length: uint32(n)})
			u.mapped.Store(true)
			s += n
		}
	})
	if err != nil {
		return fmt.Errorf("sparse data of %s: %w", u.dataPath, err)
	}
	return nil
}

// Sparse reports whether this is a sparse layer.
func (u *Upper) Sparse() bool { return u.index == nil }

// Header is the data file's header.
func (u *Upper) Header() HeaderTrailer { return u.hdr }

// UUID is the layer's identity.
func (u *Upper) UUID() UUID { return u.hdr.UUID }

// VirtualSize in bytes.
func (u *Upper) VirtualSize() int64 { return int64(u.hdr.VirtualSize) }

// Paths are the data and index file names (index "" when sparse).
func (u *Upper) Paths() (data, index string) { return u.dataPath, u.indexPath }

// Align is the write granularity: a sector, or a 4 KiB block for a sparse
// layer, whose mappings after reopening are file-system blocks.
func (u *Upper) Align() int64 {
	if u.Sparse() {
		return 4096
	}
	return SectorSize
}

// DataReaderAt reads the data file at physical offsets.
func (u *Upper) DataReaderAt() io.ReaderAt { return u.data }

// Lookup appends the live mappings that overlap [off, off+n) sectors, clipped.
func (u *Upper) Lookup(dst []Segment, off, n uint64) []Segment {
	if !u.mapped.Load() {
		return dst
	}
	u.mu.RLock()
	if u.tree.Len() > 0 {
		dst = u.lookupLocked(dst, off, n)
	}
	u.mu.RUnlock()
	return dst
}

func (u *Upper) lookupLocked(dst []Segment, off, n uint64) []Segment {
	end := off + n
	u.tree.DescendLessOrEqual(Segment{Offset: off}, func(it Segment) bool {
		if it.End() > off {
			dst = append(dst, it.Clip(off, end))
		}
		return false
	})
	u.tree.AscendRange(Segment{Offset: off + 1}, Segment{Offset: end}, func(it Segment) bool {
		dst = append(dst, it.Clip(off, end))
		return true
	})
	return dst
}

// insertLocked adds s, cutting whatever it overrides.
func (u *Upper) insertLocked(s Segment) {
	end := s.End()
	var hits [4]Segment
	hit := hits[:0]
	hit = u.lookupRaw(hit, s.Offset, end)
	for _, h := range hit {
		u.tree.Delete(h)
		if h.Offset < s.Offset {
			u.tree.ReplaceOrInsert(h.Clip(h.Offset, s.Offset))
		}
		if h.End() > end {
			u.tree.ReplaceOrInsert(h.Clip(end, h.End()))
		}
	}
	u.tree.ReplaceOrInsert(s)
	u.mapped.Store(true)
}

// lookupRaw appends the whole (unclipped) segments overlapping [off, end).
func (u *Upper) lookupRaw(dst []Segment, off, end uint64) []Segment {
	u.tree.DescendLessOrEqual(Segment{Offset: off}, func(it Segment) bool {
		if it.End() > off {
			dst = append(dst, it)
		}
		return false
	})
	u.tree.AscendRange(Segment{Offset: off + 1}, Segment{Offset: end}, func(it Segment) bool {
		dst = append(dst, it)
		return true
	})
	return dst
}

// Segments returns a sorted copy of the live mappings.
func (u *Upper) Segments() []Segment {
	u.mu.RLock()
	defer u.mu.RUnlock()
	out := make([]Segment, 0, u.tree.Len())
	u.tree.Ascend(func(it Segment) bool {
		out = append(out, it)
		return true
	})
	return out
}

// Len is the number of live mappings.
func (u *Upper) Len() int {
	u.mu.RLock()
	defer u.mu.RUnlock()
	return u.tree.Len()
}

func (u *Upper) checkRange(op string, off, n int64) error {
	if u.readOnly {
		return fmt.Errorf("%s upper %s: %w", op, u.dataPath, ErrReadOnly)
	}
	if off < 0 || n < 0 || off%SectorSize != 0 || n%SectorSize != 0 {
		return fmt.Errorf("%s upper %s: range [%d,+%d) is not sector-aligned", op, u.dataPath, off, n)
	}
	if off+n > int64(u.hdr.VirtualSize) {
		return fmt.Errorf("%s upper %s: range [%d,+%d) is past the virtual size %d", op, u.dataPath, off, n, u.hdr.VirtualSize)
	}
	return nil
}

// WriteAt writes sector-aligned data at the logical byte offset off.
func (u *Upper) WriteAt(p []byte, off int64) (int, error) {
	if err := u.checkRange("write", off, int64(len(p))); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	sec := uint64(off) / SectorSize
	n := uint64(len(p)) / SectorSize
	if u.Sparse() {
		if _, err := u.data.WriteAt(p, HeaderSize+off); err != nil {
			return 0, fmt.Errorf("write upper %s: %w", u.dataPath, err)
		}
		u.mu.Lock()
		defer u.mu.Unlock()
		for done := uint64(0); done < n; {
			l := min(n-done, MaxSegmentLen)
			u.insertLocked(Segment{Offset: sec + done, MOffset: sec + done + HeaderSize/SectorSize, Length: uint32(l)})
			done += l
		}
		return len(p), nil
	}
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return 0, fmt.Errorf("write upper %s: closed", u.dataPath)
	}
	if phys, ok := u.inPlaceLocked(sec, n); ok {
		// An overwrite of data this upper holds whole: no new mapping, no
		// growth (the live upper is this VM's alone; sealed layers never
		// change).
		u.mu.Unlock()
		if _, err := u.data.WriteAt(p, int64(phys)*SectorSize); err != nil {
			return 0, fmt.Errorf("write upper %s: %w", u.dataPath, err)
		}
		return len(p), nil
	}
	if limit := u.maxDataSectors(); u.dataEnd+n > limit {
		u.mu.Unlock()
		return 0, fmt.Errorf("write upper %s: its data would pass %d bytes (twice the disk): %w",
			u.dataPath, limit*SectorSize, syscall.ENOSPC)
	}
	phys := u.dataEnd
	u.dataEnd += n
	u.mu.Unlock()
	if _, err := u.data.WriteAt(p, int64(phys)*SectorSize); err != nil {
		return 0, fmt.Errorf("write upper %s: %w", u.dataPath, err)
	}
	u.mu.Lock()
	for done := uint64(0); done < n; {
		l := min(n-done, MaxSegmentLen)
		u.addLocked(Segment{Offset: sec + done, MOffset: phys + done, Length: uint32(l)})
		done += l
	}
	full := len(u.pending) >= pendingLimit
	u.mu.Unlock()
	if full {
		if err := u.flushIndex(false); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// inPlaceLocked returns where [sec, sec+n) lies in the data file when one
// data mapping of the upper covers all of it (mu held).
func (u *Upper) inPlaceLocked(sec, n uint64) (uint64, bool) {
	var phys uint64
	found := false
	u.tree.DescendLessOrEqual(Segment{Offset: sec}, func(it Segment) bool {
		if !it.Zeroed && it.End() >= sec+n {
			phys, found = it.MOffset+(sec-it.Offset), true
		}
		return false // only the mapping that starts at or before sec
	})
	return phys, found
}

// maxDataSectors bounds the data file of a log-structured upper: twice the
// virtual size (in-place overwrites keep ordinary use far below; a guest
// that writes in patterns that defeat them gets ENOSPC, the host disk
// does not fill).
func (u *Upper) maxDataSectors() uint64 {
	return HeaderSize/SectorSize + 2*u.hdr.VirtualSize/SectorSize
}

func (u *Upper) addLocked(s Segment) {
	u.insertLocked(s)
	var b [MappingSize]byte
	EncodeMapping(b[:], s)
	u.pending = append(u.pending, b[:]...)
}

// Trim makes the sector-aligned range read as zeros (hiding lower layers).
func (u *Upper) Trim(off, n int64) error {
	if err := u.checkRange("trim", off, n); err != nil {
		return err
	}
	if u.Sparse() {
		zero := make([]byte, min(n, 1<<20))
		for done := int64(0); done < n; {
			l := min(n-done, int64(len(zero)))
			if _, err := u.WriteAt(zero[:l], off+done); err != nil {
				return err
			}
			done += l
		}
		return nil
	}
	u.mu.Lock()
	sec, cnt := uint64(off)/SectorSize, uint64(n)/SectorSize
	for done := uint64(0); done < cnt; {
		l := min(cnt-done, MaxSegmentLen)
		u.addLocked(Segment{Offset: sec + done, Length: uint32(l), Zeroed: true})
		done += l
	}
	full := len(u.pending) >= pendingLimit
	u.mu.Unlock()
	if full {
		return u.flushIndex(false)
	}
	return nil
}

// Close flushes and closes the files.
func (u *Upper) Close() error {
	err := u.Flush()
	u.mu.Lock()
	u.closed = true
	u.mu.Unlock()
	if cerr := u.closeFiles(); err == nil {
		err = cerr
	}
	return err
}

func (u *Upper) closeFiles() error {
	var err error
	if u.data != nil {
		err = u.data.Close()
	}
	if u.index != nil {
		if cerr := u.index.Close(); err == nil {
			err = cerr
		}
	}
	return err
}
