package zfile

import (
	"bytes"
	"context"
	"math"
	"testing"
)

// hostileZFile is a header and a trailer with the given geometry and an empty
// (or absent) block area: a file of about a KiB claiming any size.
func hostileZFile(orig, indexSize uint64, data int) []byte {
	h := Header{Flags: FlagHeader | FlagData | FlagDigest, BlockSize: 4096, Algorithm: AlgoZstd, Level: 3}
	out := bytes.NewBuffer(h.Marshal())
	out.Write(make([]byte, data))
	t := h
	t.Flags = FlagData | FlagSealed | FlagDigest
	t.IndexOffset, t.IndexSize, t.OriginalSize = uint64(out.Len()), indexSize, orig
	table := make([]byte, 4*min(indexSize, 1<<20))
	t.IndexCRC = CRC32C(0, table)
	out.Write(table)
	out.Write(t.Marshal())
	return out.Bytes()
}

// TestHostileGeometry: sizes whose block count overflows, or whose blocks
// cannot be on disk, do not open (and so can neither report Size() == -1 nor
// pass Verify with no blocks).
func TestHostileGeometry(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		orig, idx uint64
		data      int
	}{
		{"size 2^64-1, zero blocks (count wraps)", math.MaxUint64, 0, 0},
		{"size 2^64-4095, zero blocks", math.MaxUint64 - 4094, 0, 0},
		{"size 2^63, zero blocks", 1 << 63, 0, 0},
		{"size past int64 with a plausible count", math.MaxUint64, math.MaxUint64/4096 + 1, 0},
		{"more blocks than bytes of block data", 1000 * 4096, 1000, 10},
	}
	for _, c := range cases {
		b := hostileZFile(c.orig, c.idx, c.data)
		z, err := Open("hostile", bytes.NewReader(b), int64(len(b)))
		if err == nil {
			verr := z.Verify(context.Background())
			t.Errorf("%s: opened with Size() %d (Verify: %v)", c.name, z.Size(), verr)
		}
	}
}
