package memsnap

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/atomicfile"
)

// A working set is the part of a memory file that a VM restored from it
// touched in its first moments: reading it ahead into the page cache while
// the next VM restores saves that VM its page faults' disk reads. It is a
// hint: a missing or damaged one costs only the prefetch.

// Extent is a byte range of a memory file.
type Extent struct {
	Off int64 `json:"off"`
	Len int64 `json:"len"`
}

// WorkingSet returns the parts of memFile that process pid's private
// mappings of it hold (pages the process read or wrote), in file order,
// adjacent pages merged.
func WorkingSet(pid int, memFile string) ([]Extent, error) {
	regions, err := FindRegions(pid, memFile)
	if err != nil {
		return nil, err
	}
	pm, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return nil, fmt.Errorf("working set of pid %d: %w", pid, err)
	}
	defer pm.Close()
	var out []Extent
	ents := make([]byte, 8*pagemapBatch)
	for _, r := range regions {
		pages := r.Size() / uint64(pageSize)
		for first := uint64(0); first < pages; first += pagemapBatch {
			n := min(pages-first, pagemapBatch)
			addr := r.Start + first*uint64(pageSize)
			if got, err := pm.ReadAt(ents[:8*n], int64(addr/uint64(pageSize)*8)); got != int(8*n) {
				return nil, fmt.Errorf("working set of pid %d: read pagemap at %#x: %v: %w", pid, addr, err, ErrProcessGone)
			}
			for i := uint64(0); i < n; i++ {
				if binary.LittleEndian.Uint64(ents[8*i:])&(pmPresent|pmSwapped) == 0 {
					continue
				}
				off := int64(r.FileOffset + (first+i)*uint64(pageSize))
				if k := len(out) - 1; k >= 0 && out[k].Off+out[k].Len == off {
					out[k].Len += int64(pageSize)
				} else {
					out = append(out, Extent{Off: off, Len: int64(pageSize)})
				}
			}
		}
	}
	return out, nil
}

// maxWorkingSetExtents bounds a working set file (a few MiB of JSON).
const maxWorkingSetExtents = 1 << 16

// workingSetFile is what WriteWorkingSet stores.
type workingSetFile struct {
	Size    int64    `json:"size"` // of the memory file it describes
	Extents []Extent `json:"extents"`
}

// WriteWorkingSet stores extents of memFile as its working set (next to
// it, atomically), keeping the first maxWorkingSetExtents.
func WriteWorkingSet(memFile string, extents []Extent) error {
	return WriteWorkingSetTo(WorkingSetPath(memFile), memFile, extents)
}

// WriteWorkingSetTo stores extents of memFile as a working set at path
// (for a file that cannot hold one next to it: a shared export).
func WriteWorkingSetTo(path, memFile string, extents []Extent) error {
	size, err := SizeOf(memFile)
	if err != nil {
		return fmt.Errorf("write working set of %s: %w", memFile, err)
	}
	b, err := encodeWorkingSet(size, extents)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("write working set of %s: %w", memFile, err)
	}
	return nil
}

// encodeWorkingSet is the stored form of the working set extents of a
// memory file of size bytes (the first maxWorkingSetExtents).
func encodeWorkingSet(size int64, extents []Extent) ([]byte, error) {
	return json.Marshal(workingSetFile{Size: size, Extents: extents[:min(len(extents), maxWorkingSetExtents)]})
}

// SizeOf is the size of a memory file or block device (whose stat size
// is 0).
func SizeOf(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", path, err)
	}
	return size, nil
}

// WorkingSetPath is where memFile's working set is stored.
func WorkingSetPath(memFile string) string { return memFile + ".workingset" }

// ErrNoWorkingSet: the memory file has no working set stored.
var ErrNoWorkingSet = errors.New("no working set")

// ReadWorkingSet reads the working set stored at path for a memory file of
// size bytes: ErrNoWorkingSet when none is stored, an error for one that
// does not describe such a file (every extent inside it, at most
// maxWorkingSetExtents of them).
func ReadWorkingSet(path string, size int64) ([]Extent, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNoWorkingSet
	}
	if err != nil {
		return nil, fmt.Errorf("read working set %s: %w", path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxWorkingSetBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read working set %s: %w", path, err)
	}
	got, extents, err := ParseWorkingSet(data)
	if err != nil {
		return nil, fmt.Errorf("read working set %s: %w", path, err)
	}
	if got != size {
		return nil, fmt.Errorf("working set %s of a %d-byte file does not describe a %d-byte file", path, got, size)
	}
	return extents, nil
}

// MaxWorkingSetBytes bounds a stored working set: one of the most extents
// is a few MiB of JSON.
const MaxWorkingSetBytes = 16 << 20

// ParseWorkingSet parses a stored working set (untrusted: one carried by
// the snapshot repository from another node) and returns the size of the
// memory file it describes and its extents, every one inside that size, at
// most maxWorkingSetExtents of them.
func ParseWorkingSet(data []byte) (int64, []Extent, error) {
	if len(data) > MaxWorkingSetBytes {
		return 0, nil, fmt.Errorf("working set of more than %d bytes", MaxWorkingSetBytes)
	}
	var ws workingSetFile
	if err := json.Unmarshal(data, &ws); err != nil {
		return 0, nil, fmt.Errorf("parse working set: %w", err)
	}
	if ws.Size <= 0 || len(ws.Extents) > maxWorkingSetExtents {
		return 0, nil, fmt.Errorf("working set of a %d-byte file with %d extents (at most %d)", ws.Size, len(ws.Extents), maxWorkingSetExtents)
	}
	for _, e := range ws.Extents {
		if e.Off < 0 || e.Len <= 0 || e.Off > ws.Size-e.Len {
			return 0, nil, fmt.Errorf("working set: extent %d+%d outside the file (%d bytes)", e.Off, e.Len, ws.Size)
		}
	}
	return ws.Size, ws.Extents, nil
}

// Bytes is the number of bytes extents cover.
func Bytes(extents []Extent) int64 {
	var n int64
	for _, e := range extents {
		n += e.Len
	}
	return n
}

// Cap keeps the first extents, in file order, that fit in max bytes (the
// last one cut to fit).
func Cap(extents []Extent, max int64) []Extent {
	var n int64
	for i, e := range extents {
		if n+e.Len > max {
			out := slices.Clone(extents[:i])
			if rest := max - n; rest > 0 {
				out = append(out, Extent{Off: e.Off, Len: rest})
			}
			return out
		}
		n += e.Len
	}
	return extents
}

// Prefetch reads memFile's stored working set ahead into the page cache:
// it queues the reads (POSIX_FADV_WILLNEED) and returns, so they run while
// the VMM starts. It returns the bytes asked for; ErrNoWorkingSet when none
// is stored; an error for a stored one that does not fit the file.
func Prefetch(memFile string) (int64, error) {
	f, err := os.Open(memFile)
	if err != nil {
		return 0, fmt.Errorf("prefetch %s: %w", memFile, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("prefetch %s: %w", memFile, err)
	}
	extents, err := ReadWorkingSet(WorkingSetPath(memFile), fi.Size())
	if err != nil {
		return 0, fmt.Errorf("prefetch %s: %w", memFile, err)
	}
	return ReadAhead(f, extents)
}

// ReadAhead queues reads of extents of f into the page cache
// (POSIX_FADV_WILLNEED) and returns the bytes asked for.
func ReadAhead(f *os.File, extents []Extent) (int64, error) {
	var total int64
	for _, e := range extents {
		if err := unix.Fadvise(int(f.Fd()), e.Off, e.Len, unix.FADV_WILLNEED); err != nil {
			return total, fmt.Errorf("read ahead %s: %w", f.Name(), err)
		}
		total += e.Len
	}
	return total, nil
}
