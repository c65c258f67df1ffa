// Package lsmt owns the overlaybd LSMT layer format: sealed (read-only) layers,
// writable upper layers (log-structured data + index files, and the sparse
// variant), stacks of layers read top-down, and the writers that commit an upper
// or merge several sealed layers into a new sealed layer. The byte layout follows
// overlaybd's LSMT format so that files are interchangeable with overlaybd's own
// tools. Every parser here treats its input as hostile: bad bytes
// give an error that names the file and the field, never a panic.
//
// A log-structured upper holds at most its disk's size of data: writes over
// data it holds go in place, trims punch the space of what they cover out of
// the data file, and later writes reuse it once the trim is durable; the index
// file is rewritten when it holds mostly overridden entries (see Upper).
package lsmt

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
)

// Sizes of the on-disk structures.
const (
	SectorSize      = 512
	HeaderSize      = 4096 // the HeaderTrailer block on disk
	HTSize          = 390  // the packed HeaderTrailer body
	MappingSize     = 16
	MaxLayers       = 255           // overlaybd's limit for a stack
	MaxSegmentLen   = (1 << 14) - 1 // sectors in one mapping
	MaxLogicalOff   = (1 << 50) - 1 // also the offset of a padding mapping
	MaxPhysicalOff  = (1 << 55) - 1 // sectors
	IndexAlignCount = 256           // a sealed index is padded to this many entries
	MaxVirtualSize  = MaxLogicalOff * SectorSize
	uuidLen         = 37
	userTagLen      = 256
)

// Flag bits of a HeaderTrailer.
const (
	FlagHeader = 1 << 0 // 1 = header, 0 = trailer
	FlagData   = 1 << 1 // 1 = data file, 0 = index file
	FlagSealed = 1 << 2
	FlagSparse = 1 << 4 // sparse writable layer
)

// Magic0 is "LSMT\0\1\2\0" read as a little-endian u64.
const Magic0 uint64 = 0x00020100544d534c

// Magic1 is the 16-byte second magic of every LSMT HeaderTrailer.
var Magic1 = [16]byte{0x65, 0x7e, 0x63, 0xd2, 0x94, 0x44, 0x08, 0x4c, 0xa2, 0xd2, 0xc8, 0xec, 0x4f, 0xcf, 0xae, 0x8a}

// ErrFormat marks bytes that are not a valid LSMT structure.
var ErrFormat = errors.New("lsmt: bad format")

// UUID is a layer identity, stored on disk as hyphenated ASCII plus NUL.
type UUID [16]byte

// NewUUID returns a random (version 4) UUID.
func NewUUID() UUID {
	var u UUID
	if _, err := rand.Read(u[:]); err != nil {
		panic(fmt.Sprintf("lsmt: crypto/rand: %v", err)) // never happens on Linux
	}
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return u
}

// IsNil reports whether u is the all-zero UUID.
func (u UUID) IsNil() bool { return u == UUID{} }

// String returns the hyphenated form.
func (u UUID) String() string {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:])
}

// ParseUUID parses the hyphenated form; the empty string is the nil UUID.
func ParseUUID(s string) (UUID, error) {
	var u UUID
	if s == "" {
		return u, nil
	}
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return u, fmt.Errorf("%w: uuid %q is not in 8-4-4-4-12 form", ErrFormat, s)
	}
	h := s[0:8] + s[9:13] + s[14:18] + s[19:23] + s[24:]
	if _, err := hex.Decode(u[:], []byte(h)); err != nil {
		return UUID{}, fmt.Errorf("%w: uuid %q: %v", ErrFormat, s, err)
	}
	return u, nil
}

// HeaderTrailer is the 390-byte structure at the start (header) and end
// (trailer) of LSMT files.
type HeaderTrailer struct {
	Flags       uint32
	IndexOffset uint64 // bytes
	IndexSize   uint64 // number of 16-byte mappings
	VirtualSize uint64 // bytes
	UUID        UUID
	ParentUUID  UUID
	Version     uint8
	SubVersion  uint8
	Tag         string // commit message, at most 255 bytes
}

// IsHeader and friends decode the flag bits.
func (h *HeaderTrailer) IsHeader() bool { return h.Flags&FlagHeader != 0 }
func (h *HeaderTrailer) IsData() bool   { return h.Flags&FlagData != 0 }
func (h *HeaderTrailer) IsSealed() bool { return h.Flags&FlagSealed != 0 }
func (h *HeaderTrailer) IsSparse() bool { return h.Flags&FlagSparse != 0 }

// Marshal encodes h into a zero-padded 4096-byte block.
func (h *HeaderTrailer) Marshal() []byte {
	b := make([]byte, HeaderSize)
	le := binary.LittleEndian
	le.PutUint64(b[0:], Magic0)
	copy(b[8:24], Magic1[:])
	le.PutUint32(b[24:], HTSize)
	le.PutUint32(b[28:], h.Flags)
	le.PutUint64(b[32:], h.IndexOffset)
	le.PutUint64(b[40:], h.IndexSize)
	le.PutUint64(b[48:], h.VirtualSize)
	copy(b[56:56+36], h.UUID.String())
	copy(b[93:93+36], h.ParentUUID.String())
	v, sv := h.Version, h.SubVersion
	if v == 0 {
		v, sv = 1, 1
	}
	b[132], b[133] = v, sv
	tag := h.Tag
	if len(tag) > userTagLen-1 {
		tag = tag[:userTagLen-1]
	}
	copy(b[134:134+userTagLen-1], tag)
	return b
}

// ParseHeaderTrailer decodes a HeaderTrailer from at least HTSize bytes.
func ParseHeaderTrailer(b []byte) (HeaderTrailer, error) {
	var h HeaderTrailer
	if len(b) < HTSize {
		return h, fmt.Errorf("%w: header/trailer is %d bytes, need %d", ErrFormat, len(b), HTSize)
	}
	le := binary.LittleEndian
	if le.Uint64(b[0:]) != Magic0 || !bytes.Equal(b[8:24], Magic1[:]) {
		return h, fmt.Errorf("%w: bad LSMT magic", ErrFormat)
	}
	if sz := le.Uint32(b[24:]); sz != HTSize {
		return h, fmt.Errorf("%w: header/trailer size field is %d, want %d", ErrFormat, sz, HTSize)
	}
	h.Flags = le.Uint32(b[28:])
	h.IndexOffset = le.Uint64(b[32:])
	h.IndexSize = le.Uint64(b[40:])
	h.VirtualSize = le.Uint64(b[48:])
	var err error
	if h.UUID, err = parseUUIDField(b[56:93]); err != nil {
		return h, fmt.Errorf("uuid field: %w", err)
	}
	if h.ParentUUID, err = parseUUIDField(b[93:130]); err != nil {
		return h, fmt.Errorf("parent_uuid field: %w", err)
	}
	h.Version, h.SubVersion = b[132], b[133]
	h.Tag = cString(b[134 : 134+userTagLen])
	if h.VirtualSize > MaxVirtualSize {
		return h, fmt.Errorf("%w: virtual_size %d exceeds the format's limit", ErrFormat, h.VirtualSize)
	}
	return h, nil
}

func parseUUIDField(b []byte) (UUID, error) { return ParseUUID(cString(b)) }

func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
