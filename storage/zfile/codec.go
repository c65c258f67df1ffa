package zfile

import (
	"fmt"
	"sync"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

// codec compresses and decompresses single blocks; safe for concurrent use.
type codec interface {
	compress(dst, src []byte) ([]byte, error)
	decompress(dst, src []byte) ([]byte, error) // dst has the expected length
}

func newCodec(algo, level uint8, dict []byte) (codec, error) {
	switch algo {
	case AlgoZstd:
		return newZstdCodec(level, dict)
	case AlgoLZ4:
		if len(dict) > 0 {
			return nil, fmt.Errorf("%w: LZ4 with a dictionary is not supported", ErrFormat)
		}
		return lz4Codec{}, nil
	case AlgoLZO:
		return nil, fmt.Errorf("%w: algorithm mini-LZO (0) is not supported", ErrFormat)
	}
	return nil, fmt.Errorf("%w: unknown algorithm %d", ErrFormat, algo)
}

type zstdCodec struct {
	enc *zstd.Encoder
	dec *zstd.Decoder
}

var (
	sharedZstdMu  sync.Mutex
	sharedZstdDec *zstd.Decoder
	sharedZstdEnc = map[uint8]*zstd.Encoder{}
)

// maxWindow is the largest zstd window a block frame may declare. Frames
// without a content size (streaming writers, e.g. the zstd command reading a
// pipe: 2 MiB at level 3, 8 MiB at level 19) must declare one, though a block
// never references more than its own bytes. Decoding memory does not follow
// the declared window: DecodeAll decodes straight into the block's buffer and
// is capped at its length (WithDecodeAllCapLimit), so what a block may cost is
// bounded by the block size, and this cap only refuses absurd declarations.
const maxWindow = 8 << 20

func decoderOptions(maxOut uint64, dict []byte) []zstd.DOption {
	o := []zstd.DOption{zstd.WithDecoderMaxWindow(maxWindow), zstd.WithDecoderMaxMemory(max(maxOut, maxWindow)),
		zstd.WithDecodeAllCapLimit(true)}
	if dict != nil {
		o = append(o, zstd.WithDecoderDicts(dict))
	}
	return o
}

func newZstdCodec(level uint8, dict []byte) (*zstdCodec, error) {
	if len(dict) > 0 {
		dec, err := zstd.NewReader(nil, decoderOptions(MaxBlockSize, dict)...)
		if err != nil {
			return nil, fmt.Errorf("%w: zstd dictionary: %v", ErrFormat, err)
		}
		return &zstdCodec{dec: dec}, nil
	}
	// Encoders and decoders are costly to build and safe for concurrent
	// EncodeAll/DecodeAll, so one per level is shared process-wide.
	sharedZstdMu.Lock()
	defer sharedZstdMu.Unlock()
	if sharedZstdDec == nil {
		dec, err := zstd.NewReader(nil, append(decoderOptions(MaxBlockSize, nil), zstd.WithDecoderConcurrency(0))...)
		if err != nil {
			return nil, err
		}
		sharedZstdDec = dec
	}
	enc := sharedZstdEnc[level]
	if enc == nil {
		lvl := zstd.EncoderLevelFromZstd(int(max(level, 1)))
		var err error
		// Every block is a frame of its own (the format needs blocks that
		// decode alone): single-segment frames carry the content size and
		// skip the window descriptor. (The low-memory mode measured no
		// faster on 4 KiB blocks, so it is not used.)
		enc, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(lvl), zstd.WithEncoderCRC(false),
			zstd.WithEncoderConcurrency(0), zstd.WithWindowSize(MaxBlockSize), zstd.WithZeroFrames(true),
			zstd.WithSingleSegment(true))
		if err != nil {
			return nil, err
		}
		sharedZstdEnc[level] = enc
	}
	return &zstdCodec{enc: enc, dec: sharedZstdDec}, nil
}

var (
	tableDecOnce sync.Once
	tableDec     *zstdCodec
)

// tableZstd decodes compressed jump tables, which are larger than a block;
// the caller's buffer (sized from bytes on disk) caps the output.
func tableZstd() *zstdCodec {
	tableDecOnce.Do(func() {
		dec, err := zstd.NewReader(nil, append(decoderOptions(4*maxBlocks, nil), zstd.WithDecoderConcurrency(1))...)
		if err != nil {
			panic(fmt.Sprintf("zstd: table decoder: %v", err)) // fixed, valid options
		}
		tableDec = &zstdCodec{dec: dec}
	})
	return tableDec
}

func (c *zstdCodec) compress(dst, src []byte) ([]byte, error) {
	if c.enc == nil {
		return nil, fmt.Errorf("zstd: writing with a dictionary is not supported")
	}
	return c.enc.EncodeAll(src, dst[:0]), nil
}

func (c *zstdCodec) decompress(dst, src []byte) ([]byte, error) {
	// The full slice expression caps the output at the block: with
	// WithDecodeAllCapLimit a frame decoding to more fails instead of growing.
	out, err := c.dec.DecodeAll(src, dst[:0:len(dst)])
	if err != nil {
		return nil, fmt.Errorf("zstd: %w", err)
	}
	if len(out) != len(dst) || (len(out) > 0 && &out[0] != &dst[0]) {
		return nil, fmt.Errorf("%w: zstd block decodes to %d bytes, want %d", ErrFormat, len(out), len(dst))
	}
	return out, nil
}

type lz4Codec struct{}

var lz4Pool = sync.Pool{New: func() any { return new(lz4.Compressor) }}

func (lz4Codec) compress(dst, src []byte) ([]byte, error) {
	bound := lz4.CompressBlockBound(len(src))
	if cap(dst) < bound {
		dst = make([]byte, bound)
	}
	dst = dst[:bound]
	c := lz4Pool.Get().(*lz4.Compressor)
	n, err := c.CompressBlock(src, dst)
	lz4Pool.Put(c)
	if err != nil {
		return nil, fmt.Errorf("lz4: %w", err)
	}
	if n == 0 { // incompressible: the library declines; store literals only
		return lz4Literals(dst[:0], src), nil
	}
	return dst[:n], nil
}

// lz4Literals encodes src as one LZ4 sequence made only of literals.
func lz4Literals(dst, src []byte) []byte {
	n := len(src)
	if n < 15 {
		dst = append(dst, byte(n<<4))
	} else {
		dst = append(dst, 0xf0)
		for r := n - 15; ; r -= 255 {
			if r < 255 {
				dst = append(dst, byte(r))
				break
			}
			dst = append(dst, 255)
		}
	}
	return append(dst, src...)
}

func (lz4Codec) decompress(dst, src []byte) ([]byte, error) {
	n, err := lz4.UncompressBlock(src, dst)
	if err != nil {
		return nil, fmt.Errorf("lz4: %w", err)
	}
	if n != len(dst) {
		return nil, fmt.Errorf("%w: lz4 block decodes to %d bytes, want %d", ErrFormat, n, len(dst))
	}
	return dst, nil
}
