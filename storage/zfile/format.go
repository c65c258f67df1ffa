// Package zfile owns the overlaybd ZFile container: a sealed layer compressed
// in fixed-size blocks (zstd via klauspost/compress, LZ4 via pierrec/lz4) with a
// jump table of compressed lengths, optional per-block CRC32C and a CRC32C
// digest of the header. It writes ZFiles and reads them with random access.
// The layout follows overlaybd's ZFile format byte for byte; every parser treats
// its input as hostile.
package zfile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Layout constants.
const (
	HTSpace      = 512 // the header and the trailer each occupy 512 bytes
	HTBodySize   = 96
	MaxBlockSize = 64 << 10
	MinBlockSize = 512
	blockCRCSeed = 100007
	crcSize      = 4
)

// Flag bits.
const (
	FlagHeader          = 1 << 0
	FlagData            = 1 << 1
	FlagSealed          = 1 << 2
	FlagHeaderOverwrite = 1 << 3
	FlagDigest          = 1 << 4
	FlagCompressedIndex = 1 << 5
)

// Compression algorithms.
const (
	AlgoLZO  = 0
	AlgoLZ4  = 1
	AlgoZstd = 2
)

// Magic0 is "ZFile\0\1\0"; Magic1 is "tuji.yyf@Alibaba".
var (
	Magic0 = [8]byte{'Z', 'F', 'i', 'l', 'e', 0, 1, 0}
	Magic1 = [16]byte{'t', 'u', 'j', 'i', '.', 'y', 'y', 'f', '@', 'A', 'l', 'i', 'b', 'a', 'b', 'a'}
)

// ErrFormat marks bytes that are not a valid ZFile structure.
var ErrFormat = errors.New("zfile: bad format")

// ErrChecksum marks a CRC mismatch.
var ErrChecksum = errors.New("zfile: checksum mismatch")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32C is the raw Castagnoli update (no pre- or post-inversion), as the
// format's checksums use it: the hardware crc32 instruction run from seed.
func CRC32C(seed uint32, p []byte) uint32 {
	return ^crc32.Update(^seed, castagnoli, p)
}

// BlockCRC is the checksum appended after a compressed block.
func BlockCRC(p []byte) uint32 { return CRC32C(blockCRCSeed, p) }

// Header is a ZFile header or trailer.
type Header struct {
	Flags        uint64
	IndexOffset  uint64 // bytes
	IndexSize    uint64 // number of blocks (u32 entries)
	OriginalSize uint64
	IndexCRC     uint32
	BlockSize    uint32
	Algorithm    uint8
	Level        uint8
	UseDict      uint8
	DictSize     uint32
	Verify       bool
	Digest       uint32 // as read; Marshal computes it when FlagDigest is set
}

// IsHeader reports the header bit (clear in a trailer).
func (h *Header) IsHeader() bool { return h.Flags&FlagHeader != 0 }

// Marshal encodes h into its 512-byte space, computing the digest when
// FlagDigest is set.
func (h *Header) Marshal() []byte {
	b := make([]byte, HTSpace)
	le := binary.LittleEndian
	copy(b[0:8], Magic0[:])
	copy(b[8:24], Magic1[:])
	le.PutUint32(b[24:], HTBodySize)
	le.PutUint64(b[32:], h.Flags)
	le.PutUint64(b[40:], h.IndexOffset)
	le.PutUint64(b[48:], h.IndexSize)
	le.PutUint64(b[56:], h.OriginalSize)
	le.PutUint32(b[64:], h.IndexCRC)
	le.PutUint32(b[72:], h.BlockSize)
	b[76], b[77], b[78] = h.Algorithm, h.Level, h.UseDict
	le.PutUint32(b[84:], h.DictSize)
	if h.Verify {
		b[88] = 1
	}
	if h.Flags&FlagDigest != 0 {
		h.Digest = CRC32C(0, b)
		le.PutUint32(b[28:], h.Digest)
	}
	return b
}

// ParseHeader decodes a header or trailer from its 512-byte space and checks
// its magic, size field and (when present) digest.
func ParseHeader(b []byte) (Header, error) {
	var h Header
	if len(b) < HTSpace {
		return h, fmt.Errorf("%w: header/trailer is %d bytes, need %d", ErrFormat, len(b), HTSpace)
	}
	b = b[:HTSpace]
	le := binary.LittleEndian
	if !bytes.Equal(b[0:8], Magic0[:]) || !bytes.Equal(b[8:24], Magic1[:]) {
		return h, fmt.Errorf("%w: bad ZFile magic", ErrFormat)
	}
	// Upstream versions differ in the struct size they record; all keep the
	// fields we read at the same offsets, so accept any size that covers them.
	if sz := le.Uint32(b[24:]); sz < 89 || sz > HTSpace {
		return h, fmt.Errorf("%w: header size field is %d, want %d", ErrFormat, sz, HTBodySize)
	}
	h.Digest = le.Uint32(b[28:])
	h.Flags = le.Uint64(b[32:])
	h.IndexOffset = le.Uint64(b[40:])
	h.IndexSize = le.Uint64(b[48:])
	h.OriginalSize = le.Uint64(b[56:])
	h.IndexCRC = le.Uint32(b[64:])
	h.BlockSize = le.Uint32(b[72:])
	h.Algorithm, h.Level, h.UseDict = b[76], b[77], b[78]
	h.DictSize = le.Uint32(b[84:])
	h.Verify = b[88] != 0
	if h.Flags&FlagDigest != 0 {
		c := make([]byte, HTSpace)
		copy(c, b)
		le.PutUint32(c[28:], 0)
		if got := CRC32C(0, c); got != h.Digest {
			return h, fmt.Errorf("%w: header digest is %#08x, computed %#08x", ErrChecksum, h.Digest, got)
		}
	}
	return h, nil
}

// IsZFile reports whether b starts with the ZFile magic.
func IsZFile(b []byte) bool {
	return len(b) >= 24 && bytes.Equal(b[0:8], Magic0[:]) && bytes.Equal(b[8:24], Magic1[:])
}
