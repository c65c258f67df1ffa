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
// A write answered before that flush survives the death of the process
// (not of the machine) through the pending journal (upperjournal.go).
//
// The data file of a log-structured upper stays within the disk's size: a
// write over data the upper holds goes in place, only the rest gets space,
// and a trim frees the space of what it covers (punched out of the file) for
// later writes, once the index that no longer maps it is durable and no
// operation in flight still uses it (alloc.go, reclaim.go). The index file
// is rewritten from the live mappings when it holds many more entries than
// they are (upperflush.go).
//
// Locks: mu guards the tree (and treeVer), pending, the space sets, dataEnd, epoch and
// closed; it is held for lookups and bookkeeping, never across I/O.
// flushMu serializes index writes (batches, the rewrite) and guards index,
// indexEnd and dirDirty; it is held across fsyncs, and takes mu inside it
// (never the other way round). Operations that read or write the data file
// at looked-up offsets hold a pin (reclaim.go), released without locks.
type Upper struct {
	mu          sync.RWMutex
	flushMu     sync.Mutex
	dataPath    string
	indexPath   string
	data        *os.File
	raw         syscall.RawConn // data's descriptor, for fallocate
	index       *os.File        // nil for a sparse layer (flushMu)
	journal     *os.File        // INDEX.pending, the pending mappings (mu; upperjournal.go)
	journalEnd  int64           // bytes of the journal written (mu)
	journalHead []byte          // the journal's header in this boot, nil without a boot id (set at open)
	indexHead   []byte          // the index file's header block, kept by a rewrite
	sparse      bool
	hdr         HeaderTrailer
	tree        *btree.BTreeG[Segment]
	treeVer     uint64      // counts changes of the tree
	mapped      atomic.Bool // the tree ever held a mapping: reads of a fresh upper skip the lock
	dataEnd     uint64      // sectors: the data file's logical end (log-structured)
	indexEnd    int64       // bytes of the index file written (flushMu)
	dirDirty    bool        // a rewritten index was renamed, its directory not yet fsynced (flushMu)
	pending     []byte      // encoded mappings not yet written to the index file
	spare       []byte      // the previous batch's buffer, for reuse
	sp          spaceState  // the data file's unreferenced space
	_           [64]byte    // the pins change with every I/O: a cache line of their own
	pins        [2]atomic.Int64
	_           [48]byte
	noPunch     atomic.Bool // the file system cannot punch holes
	// rewriteMin is the index size (entries) below which it is never
	// rewritten, however few live mappings it has.
	rewriteMin int64
	slack      uint64 // sectors the data may pass the virtual size by (growSlack)
	readOnly   bool
	closed     bool
	// Recovered counts index bytes dropped at open (a torn or invalid tail).
	Recovered int64
}

const pendingLimit = 64 << 10

// defaultRewriteMin: an index of up to 64 Ki entries (1 MiB) is never rewritten.
const defaultRewriteMin = 1 << 16

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
	u := &Upper{dataPath: dataPath, indexPath: indexPath, readOnly: readOnly, tree: newTree(),
		sparse: indexPath == "", rewriteMin: defaultRewriteMin}
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
	if u.raw, err = u.data.SyscallConn(); err != nil {
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
	if !u.readOnly {
		removeStaleRewrites(u.indexPath)
	}
	if u.index, err = os.OpenFile(u.indexPath, flag, 0); err != nil {
		return err
	}
	if err := u.loadIndex(); err != nil {
		return err
	}
	if u.journalHead, err = u.journalHeader(); err != nil {
		return fmt.Errorf("pending journal of %s: %w", u.indexPath, err)
	}
	replayed, err := u.replayJournal()
	if err != nil {
		return err
	}
	if !u.readOnly {
		if err := u.recoverJournal(replayed); err != nil {
			return fmt.Errorf("pending journal of %s: %w", u.indexPath, err)
		}
	}
	return u.initSpace()
}

func (u *Upper) loadIndex() error {
	st, err := u.index.Stat()
	if err != nil {
		return err
	}
	if st.Size() < HeaderSize {
		return fmt.Errorf("%w: index %s is %d bytes, shorter than its 4096-byte header", ErrFormat, u.indexPath, st.Size())
	}
	u.indexHead = make([]byte, HeaderSize)
	if err := readFull(u.index, u.indexHead, 0); err != nil {
		return fmt.Errorf("index %s header: %w", u.indexPath, err)
	}
	ih, err := ParseHeaderTrailer(u.indexHead[:HTSize])
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
	u.slack = growSlack(u.hdr.VirtualSize / SectorSize)
	start := int64(HeaderSize)
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
				u.insertLocked(s, nil)
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
func (u *Upper) Sparse() bool { return u.sparse }

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

// DataReaderAt reads the data file at physical offsets. The space of a
// trimmed range is reused by later writes: offsets from Segments hold their
// data only while the upper is not written (or under PinnedSegments).
func (u *Upper) DataReaderAt() io.ReaderAt { return u.data }

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

// Close flushes and closes the files.
func (u *Upper) Close() error {
	err := u.Flush()
	u.mu.Lock()
	u.closed = true
	u.mu.Unlock()
	u.flushMu.Lock() // a flush in flight may be swapping the index file
	u.mu.Lock()
	u.closeJournal(err == nil)
	u.mu.Unlock()
	cerr := u.closeFiles()
	u.flushMu.Unlock()
	if err == nil {
		err = cerr
	}
	return err
}

func (u *Upper) closeFiles() error {
	u.closeJournal(false)
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
