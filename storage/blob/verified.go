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
// that gives bytes matching the table: a source whose range verifies but
// for some chunks keeps those, and only the chunks that did not verify go
// to the next sources (one bad chunk of a peer does not send a whole
// read-around to the store).
func (v *Verified) fill(buf []byte, first int64) error {
	if len(v.sources) == 0 {
		return fmt.Errorf("read layer %s: no source holds it", v.t.LayerDigest())
	}
	return v.fillFromSources(buf, first, 0, nil)
}

// fillFromSources is fill with the sources from index from on; errs are
// why the sources before failed for these chunks.
func (v *Verified) fillFromSources(buf []byte, first int64, from int, errs []error) error {
	cs := v.t.ChunkSize
	for i := from; i < len(v.sources); i++ {
		s := v.sources[i]
		bad, err := v.fillFrom(s, buf, first)
		if err != nil {
			if errors.Is(err, ErrCorrupt) {
				v.bad[i].Add(1)
			}
			errs = append(errs, fmt.Errorf("from %s: %w", s.Name(), err))
			continue
		}
		v.fetched[i].Add(int64(len(buf)) - chunkBytes(bad, cs, int64(len(buf))))
		if len(bad) > 0 {
			v.bad[i].Add(1)
		}
		for _, b := range bad {
			chunk := buf[b.i*cs : min((b.i+1)*cs, int64(len(buf)))]
			if err := v.fillFromSources(chunk, first+b.i, i+1, []error{fmt.Errorf("from %s: %w", s.Name(), b.err)}); err != nil {
				clear(buf) // the caller's buffer holds nothing unverified either
				return err
			}
		}
		return nil
	}
	clear(buf)
	return fmt.Errorf("read layer %s chunks %d-%d [%d,+%d): no source gave verified bytes: %w",
		v.t.LayerDigest(), first, first+(int64(len(buf))-1)/cs, first*cs, len(buf), errors.Join(errs...))
}

// badChunk is a chunk of a read (its index in the read) that did not
// verify, and why.
type badChunk struct {
	i   int64
	err error
}

// chunkBytes is the bytes of the given chunks of a chunk-aligned buffer of
// size bytes.
func chunkBytes(chunks []badChunk, cs, size int64) int64 {
	var n int64
	for _, c := range chunks {
		n += min((c.i+1)*cs, size) - c.i*cs
	}
	return n
}

// fillFrom reads chunks first.. into buf from s and returns the chunks
// (indexes into buf) whose bytes do not match the table; an error when s
// gave nothing usable (its size is not the layer's, a short read), or
// when every chunk is bad.
func (v *Verified) fillFrom(s Blob, buf []byte, first int64) ([]badChunk, error) {
	if s.Size() != v.t.Size {
		return nil, fmt.Errorf("layer %s: the source holds %d bytes, the table says %d: %w", v.t.LayerDigest(), s.Size(), v.t.Size, ErrCorrupt)
	}
	n, err := s.ReadAt(buf, first*v.t.ChunkSize)
	if n < len(buf) {
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("layer %s chunk %d: short read (%d of %d bytes): %w: %w",
			v.t.LayerDigest(), first+int64(n)/v.t.ChunkSize, n, len(buf), ErrCorrupt, err)
	}
	cs := v.t.ChunkSize
	var bad []badChunk
	count := (int64(len(buf)) + cs - 1) / cs
	for i := range count {
		if err := v.t.Verify(first+i, buf[i*cs:min((i+1)*cs, int64(len(buf)))]); err != nil {
			bad = append(bad, badChunk{i, err})
		}
	}
	if int64(len(bad)) == count {
		return nil, bad[0].err
	}
	return bad, nil
}
