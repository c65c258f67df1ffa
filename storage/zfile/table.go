package zfile

import (
	"encoding/binary"
	"fmt"
	"math"
)

// maxBlocks bounds the jump table we load (64M entries = 256 MiB of table,
// a 256 GiB layer at 4 KiB blocks).
const maxBlocks = 64 << 20

// checkTrailer checks the trailer's geometry against the file size before
// anything is allocated from it: every count it implies must be backed by
// bytes on disk (a block is at least one byte, a raw jump-table entry four).
func (z *Reader) checkTrailer(t *Header, size int64) error {
	switch {
	case t.BlockSize < MinBlockSize || t.BlockSize > MaxBlockSize:
		return fmt.Errorf("%w: block_size %d outside [%d,%d]", ErrFormat, t.BlockSize, MinBlockSize, MaxBlockSize)
	case t.DictSize > uint32(size):
		return fmt.Errorf("%w: dict_size %d exceeds the file", ErrFormat, t.DictSize)
	case t.OriginalSize > math.MaxInt64:
		return fmt.Errorf("%w: original size %d does not fit in a signed 64-bit size", ErrFormat, t.OriginalSize)
	}
	z.bs = int64(t.BlockSize)
	limit := uint64(size - HTSpace)
	dataStart := HTSpace + uint64(t.DictSize)
	if t.IndexOffset < dataStart || t.IndexOffset > limit {
		return fmt.Errorf("%w: jump table offset %d outside [%d,%d]", ErrFormat, t.IndexOffset, dataStart, limit)
	}
	// Computed without overflow: (size + bs - 1) / bs wraps for sizes near 2^64.
	blocks := t.OriginalSize / uint64(t.BlockSize)
	if t.OriginalSize%uint64(t.BlockSize) != 0 {
		blocks++
	}
	if blocks > maxBlocks {
		return fmt.Errorf("%w: original size %d needs %d blocks, more than %d", ErrFormat, t.OriginalSize, blocks, maxBlocks)
	}
	if blocks > t.IndexOffset-dataStart {
		return fmt.Errorf("%w: %d blocks cannot fit in %d bytes of block data", ErrFormat, blocks, t.IndexOffset-dataStart)
	}
	stored := t.IndexSize // compressed: bytes of the stored table
	if t.Flags&FlagCompressedIndex == 0 {
		if t.IndexSize != blocks {
			return fmt.Errorf("%w: %d blocks of %d bytes cannot hold original size %d", ErrFormat, t.IndexSize, t.BlockSize, t.OriginalSize)
		}
		stored = 4 * blocks // no overflow: blocks <= maxBlocks
	} else if blocks == 0 || stored == 0 {
		return fmt.Errorf("%w: a compressed jump table of %d bytes for %d blocks", ErrFormat, stored, blocks)
	}
	if stored > limit-t.IndexOffset {
		return fmt.Errorf("%w: jump table [%d,+%d bytes) does not fit before the trailer at %d", ErrFormat, t.IndexOffset, stored, limit)
	}
	z.tableBytes = int64(stored)
	z.size = int64(t.OriginalSize)
	return nil
}

// loadJumpTable reads the jump table (decompressing it when the trailer says
// it is compressed, as newer upstream writers do: the whole table is one
// stream of the data's algorithm, index_size is its stored length and
// index_crc covers the stored bytes) and turns it into block offsets.
func (z *Reader) loadJumpTable() error {
	t := &z.tr
	stored := make([]byte, z.tableBytes)
	if err := readFull(z.r, stored, int64(t.IndexOffset)); err != nil {
		return fmt.Errorf("jump table: %w", err)
	}
	if got := CRC32C(0, stored); got != t.IndexCRC {
		return fmt.Errorf("%w: jump table crc is %#08x, trailer says %#08x", ErrChecksum, got, t.IndexCRC)
	}
	nb := (z.size + z.bs - 1) / z.bs
	table := stored
	if t.Flags&FlagCompressedIndex != 0 {
		var err error
		if table, err = decompressTable(t.Algorithm, stored, int(4*nb)); err != nil {
			return err
		}
	}
	z.offs = make([]int64, nb+1)
	pos := int64(HTSpace) + int64(t.DictSize)
	minLen := uint32(1)
	if t.Verify {
		minLen = crcSize + 1
	}
	for i := range nb {
		l := binary.LittleEndian.Uint32(table[4*i:])
		if l < minLen || int(l) > z.maxCompressed() {
			return fmt.Errorf("%w: block %d has compressed length %d", ErrFormat, i, l)
		}
		z.offs[i] = pos
		pos += int64(l)
	}
	z.offs[nb] = pos
	if pos != int64(t.IndexOffset) {
		return fmt.Errorf("%w: blocks end at %d but the jump table starts at %d", ErrFormat, pos, t.IndexOffset)
	}
	return nil
}

// decompressTable decodes a compressed jump table into exactly want bytes.
func decompressTable(algo uint8, src []byte, want int) ([]byte, error) {
	dst := make([]byte, want)
	var err error
	switch algo {
	case AlgoZstd:
		_, err = tableZstd().decompress(dst, src)
	case AlgoLZ4:
		_, err = lz4Codec{}.decompress(dst, src)
	default:
		err = fmt.Errorf("%w: compressed jump table with algorithm %d", ErrFormat, algo)
	}
	if err != nil {
		return nil, fmt.Errorf("compressed jump table: %w", err)
	}
	return dst, nil
}

func (z *Reader) maxCompressed() int {
	// zstd and LZ4 both bound expansion well under this for blocks <= 64 KiB.
	return int(z.bs) + int(z.bs)/8 + 1024 + crcSize
}
