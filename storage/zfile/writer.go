package zfile

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
)

// Options for Compress.
type Options struct {
	BlockSize   int   // 4 KiB .. 64 KiB, a power of two; default DefaultBlockSize
	Algorithm   uint8 // AlgoZstd (default) or AlgoLZ4
	Level       uint8 // zstd level; default 3
	NoVerify    bool  // omit the per-block CRC32C
	Concurrency int   // compressing goroutines; default GOMAXPROCS
}

// DefaultBlockSize is 16 KiB: per-block costs of zstd (frame and entropy
// tables) make 4 KiB blocks compress and decompress about 4x slower, while a
// 16 KiB block is still small against the 128 KiB read-ahead of a guest and
// costs only microseconds to decode for a 4 KiB random read. Any power of two
// from 4 to 64 KiB can be chosen and is read by overlaybd too.
const DefaultBlockSize = 16 << 10

func (o *Options) normalize() error {
	if o.BlockSize == 0 {
		o.BlockSize = DefaultBlockSize
	}
	if o.BlockSize < 4096 || o.BlockSize > MaxBlockSize || o.BlockSize&(o.BlockSize-1) != 0 {
		return fmt.Errorf("zfile: block size %d must be a power of two in [4096, 65536]", o.BlockSize)
	}
	if o.Algorithm == 0 {
		o.Algorithm = AlgoZstd
	}
	if o.Algorithm != AlgoZstd && o.Algorithm != AlgoLZ4 {
		return fmt.Errorf("zfile: cannot write algorithm %d (zstd=2, lz4=1)", o.Algorithm)
	}
	if o.Level == 0 {
		o.Level = 3
	}
	if o.Concurrency <= 0 {
		o.Concurrency = runtime.GOMAXPROCS(0)
	}
	return nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// batchBytes is how much raw data one parallel compression round takes.
const batchBytes = 1 << 20

// Compress reads src to its end and writes a ZFile to dst. When dst is also an
// io.WriterAt (a file), the header is rewritten at the end with the trailer's
// fields (header_overwrite), as overlaybd does. It returns the trailer.
func Compress(ctx context.Context, dst io.Writer, src io.Reader, opt Options) (Header, error) {
	if err := opt.normalize(); err != nil {
		return Header{}, err
	}
	c, err := newCodec(opt.Algorithm, opt.Level, nil)
	if err != nil {
		return Header{}, err
	}
	h := Header{Flags: FlagHeader | FlagData | FlagDigest, BlockSize: uint32(opt.BlockSize),
		Algorithm: opt.Algorithm, Level: opt.Level, Verify: !opt.NoVerify}
	cw := &countWriter{w: bufio.NewWriterSize(dst, 1<<20)}
	if _, err := cw.Write(h.Marshal()); err != nil {
		return h, fmt.Errorf("zfile: write header: %w", err)
	}
	jump, raw, err := compressBlocks(ctx, cw, src, c, opt)
	if err != nil {
		return h, err
	}
	table := make([]byte, 4*len(jump))
	for i, l := range jump {
		binary.LittleEndian.PutUint32(table[4*i:], l)
	}
	t := h
	t.Flags = FlagData | FlagSealed | FlagDigest
	t.IndexOffset = uint64(cw.n)
	t.IndexSize = uint64(len(jump))
	t.OriginalSize = uint64(raw)
	t.IndexCRC = CRC32C(0, table)
	if _, err := cw.Write(table); err != nil {
		return h, fmt.Errorf("zfile: write jump table: %w", err)
	}
	if _, err := cw.Write(t.Marshal()); err != nil {
		return h, fmt.Errorf("zfile: write trailer: %w", err)
	}
	if err := cw.w.(*bufio.Writer).Flush(); err != nil {
		return h, fmt.Errorf("zfile: write: %w", err)
	}
	if wa, ok := dst.(io.WriterAt); ok {
		// As upstream: the overwritten header is a header (not sealed)
		// carrying the trailer's fields.
		oh := t
		oh.Flags = (oh.Flags | FlagHeader | FlagHeaderOverwrite) &^ FlagSealed
		if _, err := wa.WriteAt(oh.Marshal(), 0); err != nil {
			return t, fmt.Errorf("zfile: overwrite header: %w", err)
		}
	}
	t.Marshal() // fills t.Digest
	return t, nil
}

// compressBlocks compresses src in batches, each batch in parallel, and writes
// the blocks in order. It returns the jump table and the raw size.
func compressBlocks(ctx context.Context, w io.Writer, src io.Reader, c codec, opt Options) ([]uint32, int64, error) {
	bs := opt.BlockSize
	batch := max(batchBytes/bs, 4*opt.Concurrency)
	in := make([]byte, batch*bs)
	out := make([][]byte, batch)
	errs := make([]error, batch)
	var jump []uint32
	var raw int64
	for {
		if err := ctx.Err(); err != nil {
			return nil, 0, err
		}
		n, rerr := io.ReadFull(src, in)
		if rerr != nil && !errors.Is(rerr, io.ErrUnexpectedEOF) && !errors.Is(rerr, io.EOF) {
			return nil, 0, fmt.Errorf("zfile: read source: %w", rerr)
		}
		nb := (n + bs - 1) / bs
		var wg sync.WaitGroup
		per := (nb + opt.Concurrency - 1) / max(opt.Concurrency, 1)
		for lo := 0; lo < nb; lo += per {
			hi := min(lo+per, nb)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := lo; i < hi; i++ {
					blk := in[i*bs : min((i+1)*bs, n)]
					out[i], errs[i] = compressBlock(c, out[i], blk, !opt.NoVerify)
				}
			}()
		}
		wg.Wait()
		for i := 0; i < nb; i++ {
			if errs[i] != nil {
				return nil, 0, errs[i]
			}
			if _, err := w.Write(out[i]); err != nil {
				return nil, 0, fmt.Errorf("zfile: write block: %w", err)
			}
			jump = append(jump, uint32(len(out[i])))
		}
		raw += int64(n)
		if n < len(in) {
			return jump, raw, nil
		}
	}
}

func compressBlock(c codec, dst, blk []byte, verify bool) ([]byte, error) {
	out, err := c.compress(dst[:0], blk)
	if err != nil {
		return nil, err
	}
	if verify {
		out = binary.LittleEndian.AppendUint32(out, BlockCRC(out))
	}
	return out, nil
}
