package zfile

import (
	"bytes"
	"context"
	"os/exec"
	"runtime"
	"testing"

	"github.com/agentenv/agentenv/internal/testenv"
)

// zstdPipe compresses b with the zstd command reading a pipe: the frame has
// no content size and declares the level's window.
func zstdPipe(t *testing.T, b []byte, args ...string) []byte {
	t.Helper()
	if _, err := exec.LookPath("zstd"); err != nil {
		testenv.Missing(t, "zstd command not installed (scripts/setup.sh installs it)")
	}
	cmd := exec.Command("zstd", append([]string{"-q", "-c"}, args...)...)
	cmd.Stdin = bytes.NewReader(b)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("zstd %v: %v", args, err)
	}
	return out
}

// TestZstdFramesWithoutContentSize: streaming frames decode, cost memory by
// the block and not by their declared window, and cannot overflow the block.
func TestZstdFramesWithoutContentSize(t *testing.T) {
	raw := testData(16 << 10)
	c, err := newCodec(AlgoZstd, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, level := range []string{"-1", "-3", "-19"} { // windows of 512 KiB .. 8 MiB
		frame := zstdPipe(t, raw, level)
		if frame[4]&0xe0 != 0 {
			t.Fatalf("zstd %s: frame header %#x has a content size; the test needs a streaming frame", level, frame[4])
		}
		dst := make([]byte, len(raw))
		if _, err := c.decompress(dst, frame); err != nil {
			t.Fatalf("zstd %s frame: %v", level, err)
		}
		if !bytes.Equal(dst, raw) {
			t.Fatalf("zstd %s frame decodes to different bytes", level)
		}
		var a, b runtime.MemStats
		runtime.ReadMemStats(&a)
		for range 50 {
			c.decompress(dst, frame)
		}
		runtime.ReadMemStats(&b)
		if per := (b.TotalAlloc - a.TotalAlloc) / 50; per > 64<<10 {
			t.Errorf("zstd %s frame: %d bytes allocated per 16 KiB block", level, per)
		}
		if _, err := c.decompress(make([]byte, len(raw)-1), frame); err == nil {
			t.Errorf("zstd %s frame decoding past its block was accepted", level)
		}
	}
	// A declared window past the fixed cap is refused, whatever the block.
	if _, err := c.decompress(make([]byte, len(raw)), zstdPipe(t, raw, "-3", "--long=27")); err == nil {
		t.Error("a frame declaring a 128 MiB window was accepted")
	}
}

// withCompressedTable rewrites a ZFile's jump table as newer upstream writers
// store it: one stream of the data's algorithm, index_size its byte length.
func withCompressedTable(t *testing.T, z []byte, c codec) []byte {
	t.Helper()
	tr, err := ParseHeader(z[len(z)-HTSpace:])
	if err != nil {
		t.Fatal(err)
	}
	table := z[tr.IndexOffset : tr.IndexOffset+4*tr.IndexSize]
	stored, err := c.compress(nil, table)
	if err != nil {
		t.Fatal(err)
	}
	tr.Flags |= FlagCompressedIndex
	tr.IndexSize, tr.IndexCRC = uint64(len(stored)), CRC32C(0, stored)
	out := append(bytes.Clone(z[:tr.IndexOffset]), stored...)
	return append(out, tr.Marshal()...)
}

func TestCompressedJumpTables(t *testing.T) {
	t.Parallel()
	raw := testData(200 << 10)
	for _, algo := range []uint8{AlgoZstd, AlgoLZ4} {
		var buf bytes.Buffer
		if _, err := Compress(context.Background(), &buf, bytes.NewReader(raw), Options{BlockSize: 4096, Algorithm: algo}); err != nil {
			t.Fatal(err)
		}
		c, err := newCodec(algo, 3, nil)
		if err != nil {
			t.Fatal(err)
		}
		b := withCompressedTable(t, buf.Bytes(), c)
		z, err := Open("ctable", bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatalf("algorithm %d: a ZFile with a compressed jump table does not open: %v", algo, err)
		}
		var out bytes.Buffer
		if err := z.WriteTo(context.Background(), &out); err != nil || !bytes.Equal(out.Bytes(), raw) {
			t.Fatalf("algorithm %d: content differs (%v)", algo, err)
		}
		if z.CompressedSize() != int64(len(b)) {
			t.Fatalf("compressed size %d of a %d-byte file", z.CompressedSize(), len(b))
		}
		// A table that decodes to one entry too few or too many is refused.
		for _, delta := range []int{-4096, 4096} {
			bad := bytes.Clone(b)
			tr, _ := ParseHeader(bad[len(bad)-HTSpace:])
			tr.OriginalSize = uint64(int(tr.OriginalSize) + delta)
			copy(bad[len(bad)-HTSpace:], tr.Marshal())
			if _, err := Open("ctable", bytes.NewReader(bad), int64(len(bad))); err == nil {
				t.Errorf("algorithm %d: a table for a size off by %d opened", algo, delta)
			}
		}
	}
}
