package blob

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"
)

// Verified reads a layer from one or more sources (peers, then the object
// store), checking every chunk against the layer's table: a source whose
// bytes do not match is passed over for the next one, and when none matches
// the read fails naming the layer digest and the chunk. Put a Cache in front
// (OpenVerified) so that verified chunks are kept and reads are chunk-aligned.
type Verified struct {
	t       *ChunkTable
	name    string
	sources []Blob
	fetched []atomic.Int64 // bytes read from each source
	bad     []atomic.Int64 // reads from each source that failed verification
}

// NewVerified reads the layer of t from sources, in order of preference.
func NewVerified(t *ChunkTable, name string, sources ...Blob) *Verified {
	return &Verified{t: t, name: name, sources: sources,
		fetched: make([]atomic.Int64, len(sources)), bad: make([]atomic.Int64, len(sources))}
}

// OpenVerified is a Cache of chunk-sized blocks in front of a Verified: the
// size limit and eviction of the cache, and only verified bytes in it.
func OpenVerified(t *ChunkTable, name string, opt CacheOptions, sources ...Blob) *Cache {
	opt.BlockSize = t.ChunkSize
	return NewCache(NewVerified(t, name, sources...), opt)
}

func (v *Verified) Size() int64  { return v.t.Size }
func (v *Verified) Name() string { return v.name }

// Table returns the chunk table the reads are checked against.
func (v *Verified) Table() *ChunkTable { return v.t }

// Fetched returns the bytes read from each source so far, and how many
// reads of each failed verification.
func (v *Verified) Fetched() (bytes, rejected []int64) {
	for i := range v.sources {
		bytes = append(bytes, v.fetched[i].Load())
		rejected = append(rejected, v.bad[i].Load())
	}
	return bytes, rejected
}

// Close closes every source.
func (v *Verified) Close() error {
	var errs []error
	for _, s := range v.sources {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// ReadAt reads the chunks that cover [off, off+len(p)) from the first
// source whose bytes verify, and copies the asked range out of them.
func (v *Verified) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read layer %s: negative offset", v.t.LayerDigest())
	}
	if off >= v.t.Size {
		return 0, io.EOF
	}
	var eof error
	if int64(len(p)) > v.t.Size-off {
		p, eof = p[:v.t.Size-off], io.EOF
	}
	if len(p) == 0 {
		return 0, eof
	}
	cs := v.t.ChunkSize
	first, last := off/cs, (off+int64(len(p))-1)/cs
	start := first * cs
	end := min((last+1)*cs, v.t.Size)
	buf := p
	aligned := start == off && end == off+int64(len(p))
	if !aligned {
		buf = make([]byte, end-start)
	}
	if err := v.fill(buf, first); err != nil {
		return 0, err
	}
	if !aligned {
		copy(p, buf[off-start:])
	}
	return len(p), eof
}

// fill reads chunks first.. into buf (chunk-aligned) from the first source
// that gives bytes matching the table.
func (v *Verified) fill(buf []byte, first int64) error {
	if len(v.sources) == 0 {
		return fmt.Errorf("read layer %s: no source holds it", v.t.LayerDigest())
	}
	var errs []error
	for i, s := range v.sources {
		err := v.fillFrom(s, buf, first)
		if err == nil {
			v.fetched[i].Add(int64(len(buf)))
			return nil
		}
		if errors.Is(err, ErrCorrupt) {
			v.bad[i].Add(1)
		}
		errs = append(errs, fmt.Errorf("from %s: %w", s.Name(), err))
	}
	clear(buf) // the caller's buffer holds nothing unverified either
	cs := v.t.ChunkSize
	return fmt.Errorf("read layer %s chunks %d-%d [%d,+%d): no source gave verified bytes: %w",
		v.t.LayerDigest(), first, first+(int64(len(buf))-1)/cs, first*cs, len(buf), errors.Join(errs...))
}

func (v *Verified) fillFrom(s Blob, buf []byte, first int64) error {
	if s.Size() != v.t.Size {
		return fmt.Errorf("layer %s: the source holds %d bytes, the table says %d: %w", v.t.LayerDigest(), s.Size(), v.t.Size, ErrCorrupt)
	}
	n, err := s.ReadAt(buf, first*v.t.ChunkSize)
	if n < len(buf) {
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("layer %s chunk %d: short read (%d of %d bytes): %w: %w",
			v.t.LayerDigest(), first+int64(n)/v.t.ChunkSize, n, len(buf), ErrCorrupt, err)
	}
	cs := v.t.ChunkSize
	for i := int64(0); i*cs < int64(len(buf)); i++ {
		if err := v.t.Verify(first+i, buf[i*cs:min((i+1)*cs, int64(len(buf)))]); err != nil {
			return err
		}
	}
	return nil
}
