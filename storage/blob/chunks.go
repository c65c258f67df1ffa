package blob

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
)

// ErrCorrupt marks bytes of a layer that do not match its chunk table (a
// corrupted, truncated or replaced object, or a source answering with other
// bytes): they are never served.
var ErrCorrupt = errors.New("layer bytes do not match the chunk table")

// Chunk tables: a layer stored remotely is read in fixed-size chunks, each
// checked against its sha256 in the table before a byte of it is used. The
// table binds itself to its layer (size and whole-layer digest) and is
// itself stored by its digest, so a manifest naming the table's digest pins
// every byte of the layer.
//
// Encoding (big-endian): "AENVCHK1", chunk size (uint32), zero (uint32),
// layer size (uint64), layer sha256 (32 bytes), then one sha256 per chunk.
const (
	chunkMagic   = "AENVCHK1"
	chunkHeader  = 8 + 4 + 4 + 8 + 32
	MinChunkSize = 4 << 10
	MaxChunkSize = 16 << 20
	// DefaultChunkSize is the cache's default block: small enough that a
	// sparse working set (a restore's touched pages) fetches little more than
	// it reads (bench/repository), large enough for few requests on a whole read.
	DefaultChunkSize = 256 << 10
	// MaxChunkTableSize bounds a table read from storage: 2^20 chunks (a
	// 256 GiB layer at the default chunk size, 1 TiB at 1 MiB).
	MaxChunkTableSize = chunkHeader + 32*(1<<20)
)

// ChunkTable lists the sha256 of every chunk of one layer.
type ChunkTable struct {
	ChunkSize int64
	Size      int64    // the layer's size
	Layer     [32]byte // the layer's sha256
	sums      []byte   // 32 bytes per chunk
}

// LayerDigest is the layer's digest, "sha256:<hex>".
func (t *ChunkTable) LayerDigest() string { return "sha256:" + hex.EncodeToString(t.Layer[:]) }

// Chunks is the number of chunks.
func (t *ChunkTable) Chunks() int64 { return int64(len(t.sums) / 32) }

// chunkLen is the length of chunk i (the last one may be short).
func (t *ChunkTable) chunkLen(i int64) int64 { return min(t.ChunkSize, t.Size-i*t.ChunkSize) }

// Verify checks that data is chunk i of the layer.
func (t *ChunkTable) Verify(i int64, data []byte) error {
	if i < 0 || i >= t.Chunks() {
		return fmt.Errorf("layer %s: chunk %d out of range (%d chunks): %w", t.LayerDigest(), i, t.Chunks(), ErrCorrupt)
	}
	if want := t.chunkLen(i); int64(len(data)) != want {
		return fmt.Errorf("layer %s chunk %d [%d,+%d): got %d bytes: %w", t.LayerDigest(), i, i*t.ChunkSize, want, len(data), ErrCorrupt)
	}
	sum := sha256.Sum256(data)
	if !bytes.Equal(sum[:], t.sums[i*32:i*32+32]) {
		return fmt.Errorf("layer %s chunk %d [%d,+%d): sha256 %x, the table says %x: %w",
			t.LayerDigest(), i, i*t.ChunkSize, len(data), sum[:6], t.sums[i*32:i*32+6], ErrCorrupt)
	}
	return nil
}

func validChunkSize(cs int64) bool {
	return cs >= MinChunkSize && cs <= MaxChunkSize && cs&(cs-1) == 0
}

// BuildChunkTable reads r to its end and returns its chunk table (the
// layer's own sha256 comes with it: one pass over the file).
func BuildChunkTable(r io.Reader, chunkSize int64) (*ChunkTable, error) {
	if !validChunkSize(chunkSize) {
		return nil, fmt.Errorf("build chunk table: chunk size %d is not a power of two in [%d, %d]", chunkSize, MinChunkSize, MaxChunkSize)
	}
	t := &ChunkTable{ChunkSize: chunkSize}
	whole := sha256.New()
	buf := make([]byte, chunkSize)
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			sum := sha256.Sum256(buf[:n])
			t.sums = append(t.sums, sum[:]...)
			whole.Write(buf[:n])
			t.Size += int64(n)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("build chunk table: %w", err)
		}
	}
	copy(t.Layer[:], whole.Sum(nil))
	return t, nil
}

// Encode returns the table's stored form.
func (t *ChunkTable) Encode() []byte {
	out := make([]byte, chunkHeader, chunkHeader+len(t.sums))
	copy(out, chunkMagic)
	binary.BigEndian.PutUint32(out[8:], uint32(t.ChunkSize))
	binary.BigEndian.PutUint64(out[16:], uint64(t.Size))
	copy(out[24:], t.Layer[:])
	return append(out, t.sums...)
}

// ParseChunkTable decodes a table read from storage (untrusted): the chunk
// count must be exactly what the layer size and chunk size make.
func ParseChunkTable(data []byte) (*ChunkTable, error) {
	bad := func(why string, args ...any) error {
		return fmt.Errorf("parse chunk table: %s: %w", fmt.Sprintf(why, args...), ErrCorrupt)
	}
	if len(data) < chunkHeader || string(data[:8]) != chunkMagic {
		return nil, bad("not a chunk table (%d bytes)", len(data))
	}
	if len(data) > MaxChunkTableSize {
		return nil, bad("%d bytes, more than %d", len(data), MaxChunkTableSize)
	}
	cs := int64(binary.BigEndian.Uint32(data[8:]))
	if !validChunkSize(cs) || binary.BigEndian.Uint32(data[12:]) != 0 {
		return nil, bad("chunk size %d", cs)
	}
	size := binary.BigEndian.Uint64(data[16:])
	if size > 1<<50 {
		return nil, bad("layer size %d", size)
	}
	n := (int64(size) + cs - 1) / cs
	if int64(len(data)-chunkHeader) != 32*n {
		return nil, bad("%d bytes of digests for %d chunks", len(data)-chunkHeader, n)
	}
	t := &ChunkTable{ChunkSize: cs, Size: int64(size), sums: bytes.Clone(data[chunkHeader:])}
	copy(t.Layer[:], data[24:56])
	return t, nil
}
