package lsmt

import (
	"errors"
	"fmt"
	"io"
)

// Layer is an opened sealed (read-only) LSMT layer.
type Layer struct {
	name    string
	Header  HeaderTrailer
	Trailer HeaderTrailer
	idx     *Index
	r       io.ReaderAt // the LSMT bytes (the decompressed view of a ZFile)
	srcs    [1]io.ReaderAt
	size    int64 // size of the LSMT bytes
	closer  io.Closer
	// Compressed is set when the layer's file is a ZFile.
	Compressed bool
	// RawPadding counts padding mappings in the on-disk index.
	RawPadding int
}

// maxIndexEntries bounds the index we are willing to load (256 MiB of mappings).
const maxIndexEntries = 16 << 20

// indexChunk is how many mappings one read of a sealed index takes (1 MiB).
const indexChunk = 64 << 10

// OpenSealed parses a sealed LSMT layer from r, whose length is size. name is
// used in errors. The layer does not own r unless SetCloser is called.
func OpenSealed(name string, r io.ReaderAt, size int64) (*Layer, error) {
	l, err := openSealed(name, r, size)
	if err != nil {
		return nil, fmt.Errorf("open layer %s: %w", name, err)
	}
	return l, nil
}

func openSealed(name string, r io.ReaderAt, size int64) (*Layer, error) {
	if size < 2*HeaderSize {
		return nil, fmt.Errorf("%w: file is %d bytes, too short for a header and a trailer", ErrFormat, size)
	}
	l := &Layer{name: name, r: r, size: size, srcs: [1]io.ReaderAt{r}}
	buf := make([]byte, HTSize)
	if err := readFull(r, buf, 0); err != nil {
		return nil, fmt.Errorf("read header: %w", err)
	}
	var err error
	if l.Header, err = ParseHeaderTrailer(buf); err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	if !l.Header.IsHeader() {
		return nil, fmt.Errorf("%w: header block does not have the header flag (flags %#x)", ErrFormat, l.Header.Flags)
	}
	if err := readFull(r, buf, size-HeaderSize); err != nil {
		return nil, fmt.Errorf("read trailer: %w", err)
	}
	t, err := ParseHeaderTrailer(buf)
	if err != nil {
		return nil, fmt.Errorf("trailer at offset %d: %w (not a sealed layer?)", size-HeaderSize, err)
	}
	switch {
	case t.IsHeader():
		return nil, fmt.Errorf("%w: trailer has the header flag set (flags %#x)", ErrFormat, t.Flags)
	case !t.IsData():
		return nil, fmt.Errorf("%w: trailer is not a data-file trailer (flags %#x)", ErrFormat, t.Flags)
	case !t.IsSealed():
		return nil, fmt.Errorf("%w: trailer is not sealed (flags %#x)", ErrFormat, t.Flags)
	}
	l.Trailer = t
	limit := uint64(size - HeaderSize)
	if t.IndexOffset < HeaderSize || t.IndexOffset%SectorSize != 0 || t.IndexOffset > limit {
		return nil, fmt.Errorf("%w: index_offset %d outside [%d,%d] or not 512-aligned", ErrFormat, t.IndexOffset, HeaderSize, limit)
	}
	if t.IndexSize > (limit-t.IndexOffset)/MappingSize || t.IndexSize > maxIndexEntries {
		return nil, fmt.Errorf("%w: index_size %d entries does not fit between index_offset %d and the trailer", ErrFormat, t.IndexSize, t.IndexOffset)
	}
	// The index is read in chunks and only real mappings are kept, so what
	// opening costs follows the mappings present, not the claimed count: a
	// ZFile of a few KiB can decompress to an index of millions of padding
	// entries.
	chunk := min(t.IndexSize, indexChunk)
	raw := make([]byte, chunk*MappingSize)
	segs := make([]Segment, 0, chunk)
	for done := uint64(0); done < t.IndexSize; done += chunk {
		chunk = min(chunk, t.IndexSize-done)
		b := raw[:chunk*MappingSize]
		if err := readFull(r, b, int64(t.IndexOffset+done*MappingSize)); err != nil {
			return nil, fmt.Errorf("read index: %w", err)
		}
		for i := 0; i < len(b); i += MappingSize {
			s := DecodeMapping(b[i:])
			if s.IsPadding() {
				l.RawPadding++
				continue
			}
			segs = append(segs, s)
		}
	}
	vs := (t.VirtualSize + SectorSize - 1) / SectorSize
	if err := validateSegments(segs, vs, HeaderSize/SectorSize, t.IndexOffset/SectorSize); err != nil {
		return nil, fmt.Errorf("index: %w", err)
	}
	l.idx = NewIndex(segs)
	return l, nil
}

// Name is the name given at open.
func (l *Layer) Name() string { return l.name }

// Index is the layer's own index.
func (l *Layer) Index() *Index { return l.idx }

// UUID is the layer's identity from its trailer.
func (l *Layer) UUID() UUID { return l.Trailer.UUID }

// ParentUUID is the identity of the layer this one was committed on.
func (l *Layer) ParentUUID() UUID { return l.Trailer.ParentUUID }

// VirtualSize is the size of the virtual disk in bytes.
func (l *Layer) VirtualSize() int64 { return int64(l.Trailer.VirtualSize) }

// FileSize is the size of the LSMT bytes (decompressed size for a ZFile).
func (l *Layer) FileSize() int64 { return l.size }

// DataReaderAt reads the raw LSMT bytes (physical offsets).
func (l *Layer) DataReaderAt() io.ReaderAt { return l.r }

// SetCloser makes Close close c.
func (l *Layer) SetCloser(c io.Closer) { l.closer = c }

// Close releases the layer's file if it owns one.
func (l *Layer) Close() error {
	if l.closer != nil {
		return l.closer.Close()
	}
	return nil
}

// ReadAt reads the layer's virtual disk alone; unmapped ranges read as zeros.
func (l *Layer) ReadAt(p []byte, off int64) (int, error) {
	return readVirtual(p, off, l.VirtualSize(), func(q []byte, o int64) error {
		var buf [8]Segment
		s0, n := sectorSpan(o, len(q))
		return readSegments(q, o, l.idx.Lookup(buf[:0], s0, n), l.srcs[:], nil)
	})
}

func readFull(r io.ReaderAt, p []byte, off int64) error {
	n, err := r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("read %d bytes at offset %d: %w", len(p), off, err)
}

// readVirtual clips a read to the virtual size and reports io.EOF past it.
func readVirtual(p []byte, off, size int64, fill func([]byte, int64) error) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("lsmt: negative offset %d", off)
	}
	if off >= size {
		return 0, io.EOF
	}
	n := len(p)
	var eof error
	if int64(n) > size-off {
		n = int(size - off)
		eof = io.EOF
	}
	if err := fill(p[:n], off); err != nil {
		return 0, err
	}
	return n, eof
}

// sectorSpan is the sector range [s0, s0+n) covering the bytes [off, off+len).
func sectorSpan(off int64, l int) (uint64, uint64) {
	s0 := uint64(off) / SectorSize
	s1 := (uint64(off) + uint64(l) + SectorSize - 1) / SectorSize
	return s0, s1 - s0
}
