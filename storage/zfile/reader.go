package zfile

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
)

// Reader gives random access to the decompressed bytes of a ZFile.
type Reader struct {
	r     io.ReaderAt
	hdr   Header // the header as stored
	tr    Header // the trailer
	offs  []int64
	codec codec
	bs    int64
	size  int64
	// tableBytes is the stored size of the jump table (compressed or not).
	tableBytes int64
	cache      [cacheSlots]cacheSlot
	bufs       sync.Pool
	closer     io.Closer
}

const cacheSlots = 64

type cacheSlot struct {
	mu   sync.Mutex
	blk  int64 // block index + 1; 0 = empty
	data []byte
}

// Open parses a ZFile of the given size. name is used in errors.
func Open(name string, r io.ReaderAt, size int64) (*Reader, error) {
	z, err := open(r, size)
	if err != nil {
		return nil, fmt.Errorf("open zfile %s: %w", name, err)
	}
	return z, nil
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

func open(r io.ReaderAt, size int64) (*Reader, error) {
	if size < 2*HTSpace {
		return nil, fmt.Errorf("%w: file is %d bytes, too short for a header and a trailer", ErrFormat, size)
	}
	z := &Reader{r: r}
	b := make([]byte, HTSpace)
	if err := readFull(r, b, 0); err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	var err error
	if z.hdr, err = ParseHeader(b); err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	if !z.hdr.IsHeader() {
		return nil, fmt.Errorf("%w: header block lacks the header flag (flags %#x)", ErrFormat, z.hdr.Flags)
	}
	if err := readFull(r, b, size-HTSpace); err != nil {
		return nil, fmt.Errorf("trailer: %w", err)
	}
	t, err := ParseHeader(b)
	if err != nil {
		return nil, fmt.Errorf("trailer at offset %d: %w", size-HTSpace, err)
	}
	if t.IsHeader() || t.Flags&FlagSealed == 0 {
		return nil, fmt.Errorf("%w: trailer flags %#x are not those of a sealed trailer", ErrFormat, t.Flags)
	}
	if err := z.checkTrailer(&t, size); err != nil {
		return nil, err
	}
	z.tr = t
	var dict []byte
	if t.UseDict != 0 && t.DictSize > 0 {
		dict = make([]byte, t.DictSize)
		if err := readFull(r, dict, HTSpace); err != nil {
			return nil, fmt.Errorf("dictionary: %w", err)
		}
	}
	if z.codec, err = newCodec(t.Algorithm, t.Level, dict); err != nil {
		return nil, err
	}
	if err := z.loadJumpTable(); err != nil {
		return nil, err
	}
	z.bufs.New = func() any { b := make([]byte, z.maxCompressed()); return &b }
	return z, nil
}

// Size is the decompressed size.
func (z *Reader) Size() int64 { return z.size }

// Trailer is the trailer as read.
func (z *Reader) Trailer() Header { return z.tr }

// StoredHeader is the header block as read.
func (z *Reader) StoredHeader() Header { return z.hdr }

// Blocks is the number of blocks.
func (z *Reader) Blocks() int { return len(z.offs) - 1 }

// CompressedSize is the size of the ZFile bytes up to and including the trailer.
func (z *Reader) CompressedSize() int64 {
	return int64(z.tr.IndexOffset) + z.tableBytes + HTSpace
}

// SetCloser makes Close close c.
func (z *Reader) SetCloser(c io.Closer) { z.closer = c }

// Close closes the underlying file when the reader owns it.
func (z *Reader) Close() error {
	if z.closer != nil {
		return z.closer.Close()
	}
	return nil
}

func (z *Reader) blockLen(i int64) int {
	return int(min(z.bs, z.size-i*z.bs))
}

// decodeBlock decompresses block i into dst (len = the block's raw length).
func (z *Reader) decodeBlock(i int64, dst []byte) error {
	bp := z.bufs.Get().(*[]byte)
	defer z.bufs.Put(bp)
	src := (*bp)[:z.offs[i+1]-z.offs[i]]
	if err := readFull(z.r, src, z.offs[i]); err != nil {
		return fmt.Errorf("block %d: %w", i, err)
	}
	return z.decodeFrom(i, src, dst)
}

// decodeFrom checks and decompresses block i, whose stored bytes are src.
func (z *Reader) decodeFrom(i int64, src, dst []byte) error {
	if z.tr.Verify {
		n := len(src)
		data := src[:n-crcSize]
		want := binary.LittleEndian.Uint32(src[n-crcSize:])
		if got := BlockCRC(data); got != want {
			return fmt.Errorf("block %d at offset %d: %w: stored %#08x, computed %#08x", i, z.offs[i], ErrChecksum, want, got)
		}
		src = data
	}
	if _, err := z.codec.decompress(dst, src); err != nil {
		return fmt.Errorf("block %d at offset %d: %w", i, z.offs[i], err)
	}
	return nil
}

// decodeRun decompresses whole blocks [b0, b1) into dst with one read of
// their stored bytes.
func (z *Reader) decodeRun(b0, b1 int64, dst []byte) error {
	if b1-b0 == 1 {
		return z.decodeBlock(b0, dst)
	}
	// A pooled buffer: a fresh one per run costs zeroing and, on a VM,
	// page faults that are dearer than decoding the blocks.
	bp := runBufs.Get().(*[]byte)
	defer runBufs.Put(bp)
	n := z.offs[b1] - z.offs[b0]
	if int64(cap(*bp)) < n {
		*bp = make([]byte, n)
	}
	src := (*bp)[:n]
	if err := readFull(z.r, src, z.offs[b0]); err != nil {
		return fmt.Errorf("blocks [%d,%d): %w", b0, b1, err)
	}
	for i := b0; i < b1; i++ {
		o := (i - b0) * z.bs
		s := src[z.offs[i]-z.offs[b0] : z.offs[i+1]-z.offs[b0]]
		if err := z.decodeFrom(i, s, dst[o:o+int64(z.blockLen(i))]); err != nil {
			return err
		}
	}
	return nil
}

// ReadAt reads decompressed bytes.
func (z *Reader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("zfile: negative offset %d", off)
	}
	if off >= z.size {
		return 0, io.EOF
	}
	var eof error
	if int64(len(p)) > z.size-off {
		p = p[:z.size-off]
		eof = io.EOF
	}
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		blk := pos / z.bs
		in := pos - blk*z.bs
		bl := z.blockLen(blk)
		if in == 0 && len(p)-done >= bl {
			// A run of whole blocks: one read, decoded straight into p.
			run := min(int64(len(p)-done)/z.bs, maxRun)
			if run == 0 || blk+run > int64(z.Blocks()) {
				run = 1
			}
			n := int((run-1)*z.bs) + z.blockLen(blk+run-1)
			if err := z.decodeRun(blk, blk+run, p[done:done+n]); err != nil {
				return done, err
			}
			done += n
			continue
		}
		n := min(len(p)-done, bl-int(in))
		if err := z.readCached(blk, p[done:done+n], int(in)); err != nil {
			return done, err
		}
		done += n
	}
	return done, eof
}

// maxRun bounds the blocks decoded from one read.
const maxRun = 256

var runBufs = sync.Pool{New: func() any { return new([]byte) }}

func (z *Reader) readCached(blk int64, dst []byte, in int) error {
	s := &z.cache[blk%cacheSlots]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.blk != blk+1 {
		if cap(s.data) < int(z.bs) {
			s.data = make([]byte, z.bs)
		}
		s.data = s.data[:z.blockLen(blk)]
		s.blk = 0
		if err := z.decodeBlock(blk, s.data); err != nil {
			return err
		}
		s.blk = blk + 1
	}
	copy(dst, s.data[in:])
	return nil
}

// Verify decodes every block, checking CRCs and decoded lengths.
func (z *Reader) Verify(ctx context.Context) error {
	return z.WriteTo(ctx, io.Discard)
}

// WriteTo decompresses the whole file to w, decoding batches of blocks on
// GOMAXPROCS goroutines.
func (z *Reader) WriteTo(ctx context.Context, w io.Writer) error {
	return z.WriteToN(ctx, w, runtime.GOMAXPROCS(0))
}

var batchBufs = sync.Pool{New: func() any { return new([]byte) }}

// WriteToN decompresses the whole file to w with workers goroutines (1:
// all in the caller's goroutine).
func (z *Reader) WriteToN(ctx context.Context, w io.Writer, workers int) error {
	nb := int64(z.Blocks())
	workers = max(workers, 1)
	// Batches of at most 4 MiB, in a pooled buffer: a fresh 16 MiB buffer
	// per call cost as many page faults (on a VM) as decoding the blocks.
	batch := max(1, min(256, int64(4<<20)/z.bs, nb)) // a small file gets a small buffer
	bp := batchBufs.Get().(*[]byte)
	defer batchBufs.Put(bp)
	if int64(cap(*bp)) < batch*z.bs {
		*bp = make([]byte, batch*z.bs)
	}
	buf := (*bp)[:batch*z.bs]
	errs := make([]error, workers)
	for lo := int64(0); lo < nb; lo += batch {
		if err := ctx.Err(); err != nil {
			return err
		}
		hi := min(lo+batch, nb)
		if err := z.decodeBatch(buf, lo, hi, errs); err != nil {
			return err
		}
		end := (hi-lo-1)*z.bs + int64(z.blockLen(hi-1))
		if _, err := w.Write(buf[:end]); err != nil {
			return fmt.Errorf("zfile: write: %w", err)
		}
	}
	return nil
}

// decodeBatch decodes blocks [lo, hi) into buf, split among len(errs) goroutines.
func (z *Reader) decodeBatch(buf []byte, lo, hi int64, errs []error) error {
	workers := int64(len(errs))
	run := func(a, b int64) error {
		o := (a - lo) * z.bs
		end := (b-1-lo)*z.bs + int64(z.blockLen(b-1))
		return z.decodeRun(a, b, buf[o:end])
	}
	if workers == 1 {
		return run(lo, hi)
	}
	clear(errs)
	var wg sync.WaitGroup
	per := (hi - lo + workers - 1) / workers
	for k := int64(0); k < workers; k++ {
		a, b := lo+k*per, min(lo+(k+1)*per, hi)
		if a >= b {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[k] = run(a, b)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
