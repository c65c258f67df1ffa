package lsmt

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/storage/zfile"
)

// The corpus under testdata/foreign holds ZFiles whose compressed bytes were
// made by other tools than our writer: the zstd command reading a pipe (frames
// without a content size, 2 MiB window) and jump tables compressed as a whole,
// as newer upstream writers do. layer.lsmt is the LSMT layer they all hold.
// Regenerate with: go test ./storage/lsmt -run TestForeignCorpus -update-corpus
var updateCorpus = flag.Bool("update-corpus", false, "rewrite testdata/foreign with the zstd command")

const corpusDir = "testdata/foreign"

var corpusFiles = []struct {
	name       string
	blockSize  int
	compressed bool // jump table compressed by the zstd command
	verify     bool
}{
	{"zstdcli-4k.zfile", 4096, false, true},
	{"zstdcli-16k-noverify.zfile", 16 << 10, false, false},
	{"zstdcli-4k-ctable.zfile", 4096, true, true},
	{"zstdcli-64k-ctable.zfile", 64 << 10, true, false},
}

// corpusLayer is a small sealed layer from our writer: data, a hole and a
// zeroed range, with a parent so stacks of it can be checked too.
func corpusLayer(t testing.TB) []byte {
	t.Helper()
	var out bytes.Buffer
	x, err := NewExtentWriter(&out, SealOptions{VirtualSize: 1 << 20, Message: "foreign corpus",
		UUID: mustUUID(t, "6f1c6d2e-54a1-4c55-9a44-2e4d3b2f8a10")})
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 96<<10)
	for i := range data {
		data[i] = byte(i*7 + i/4096)
	}
	if err := x.WriteData(4096, data); err != nil {
		t.Fatal(err)
	}
	if err := x.WriteZeroed(256<<10, 64<<10); err != nil {
		t.Fatal(err)
	}
	if err := x.WriteData(512<<10, bytes.Repeat([]byte("agentenv"), 4096)); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// zstdCLI compresses b with the zstd command fed through a pipe, so the frame
// has no content size (what any streaming writer produces).
func zstdCLI(t testing.TB, b []byte) []byte {
	t.Helper()
	cmd := exec.Command("zstd", "-3", "-q", "-c")
	cmd.Stdin = bytes.NewReader(b) // not an *os.File: exec feeds it through a pipe
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("zstd: %v", err)
	}
	return out
}

// foreignZFile lays out a ZFile around blocks compressed by the zstd command.
func foreignZFile(t testing.TB, raw []byte, bs int, compressTable, verify bool) []byte {
	t.Helper()
	h := zfile.Header{Flags: zfile.FlagHeader | zfile.FlagData | zfile.FlagDigest, BlockSize: uint32(bs),
		Algorithm: zfile.AlgoZstd, Level: 3, Verify: verify}
	out := bytes.NewBuffer(h.Marshal())
	var table []byte
	for off := 0; off < len(raw); off += bs {
		blk := zstdCLI(t, raw[off:min(off+bs, len(raw))])
		if verify {
			blk = binary.LittleEndian.AppendUint32(blk, zfile.BlockCRC(blk))
		}
		out.Write(blk)
		table = binary.LittleEndian.AppendUint32(table, uint32(len(blk)))
	}
	tr := h
	tr.Flags = zfile.FlagData | zfile.FlagSealed | zfile.FlagDigest
	tr.IndexOffset, tr.IndexSize, tr.OriginalSize = uint64(out.Len()), uint64(len(table)/4), uint64(len(raw))
	if compressTable {
		table = zstdCLI(t, table)
		tr.Flags |= zfile.FlagCompressedIndex
		tr.IndexSize = uint64(len(table))
	}
	tr.IndexCRC = zfile.CRC32C(0, table)
	out.Write(table)
	out.Write(tr.Marshal())
	return out.Bytes()
}

func TestForeignCorpus(t *testing.T) {
	t.Parallel()
	if *updateCorpus {
		if _, err := exec.LookPath("zstd"); err != nil {
			t.Fatal("-update-corpus needs the zstd command")
		}
		raw := corpusLayer(t)
		writeCorpus(t, "layer.lsmt", raw)
		for _, c := range corpusFiles {
			writeCorpus(t, c.name, foreignZFile(t, raw, c.blockSize, c.compressed, c.verify))
		}
	}
	want, err := os.ReadFile(filepath.Join(corpusDir, "layer.lsmt"))
	if err != nil {
		t.Fatal(err)
	}
	ref, err := OpenSealed("layer.lsmt", bytes.NewReader(want), int64(len(want)))
	if err != nil {
		t.Fatal(err)
	}
	wantDisk := readAll(t, ref)
	for _, c := range corpusFiles {
		t.Run(c.name, func(t *testing.T) {
			l, err := OpenLayerFile(filepath.Join(corpusDir, c.name))
			if err != nil {
				t.Fatalf("a valid layer written by another tool does not open: %v", err)
			}
			defer l.Close()
			if !l.Compressed || l.UUID() != ref.UUID() {
				t.Fatalf("compressed %v uuid %s, want a ZFile of %s", l.Compressed, l.UUID(), ref.UUID())
			}
			if got := readAll(t, l); !bytes.Equal(got, wantDisk) {
				t.Fatalf("virtual disk differs from the reference at byte %d", firstDiff(got, wantDisk))
			}
			f, err := os.Open(filepath.Join(corpusDir, c.name))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			st, _ := f.Stat()
			z, err := zfile.Open(c.name, f, st.Size())
			if err != nil {
				t.Fatal(err)
			}
			if err := z.Verify(context.Background()); err != nil {
				t.Fatalf("verify: %v", err)
			}
			if z.CompressedSize() != st.Size() {
				t.Fatalf("compressed size %d, file is %d bytes", z.CompressedSize(), st.Size())
			}
		})
	}
}

func writeCorpus(t testing.TB, name string, b []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(corpusDir, name), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func readAll(t testing.TB, l *Layer) []byte {
	t.Helper()
	b := make([]byte, l.VirtualSize())
	if _, err := l.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

// mustUUID parses a fixed UUID (the corpus must be reproducible).
func mustUUID(t testing.TB, s string) UUID {
	t.Helper()
	u, err := ParseUUID(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
