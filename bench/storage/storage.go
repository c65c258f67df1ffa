// Package storage benchmarks the layered image stack against plain references
// measured in the same run: pread of a flat raw file with the same content
// (random 4 KiB reads, sequential reads), the index at 1 thousand and 1 million
// segments, and ZFile compression against the zstd CLI. Each result is printed
// as a ratio (ours / reference); see storage_test.go.
package storage

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/storage/lsmt"
	"github.com/agentenv/agentenv/storage/zfile"
)

// Fixture is a 4-layer stack and a flat raw file with the same content.
type Fixture struct {
	Dir    string
	Raw    string   // flat raw file
	Layers []string // sealed layers, bottom first
	Config string   // image config: the layers + an empty upper
	Size   int64
}

// fillMixed writes semi-compressible bytes: runs of random and text-like data.
func fillMixed(r *rand.Rand, b []byte) {
	const text = "the quick brown fox jumps over the lazy dog 0123456789 "
	for i := 0; i < len(b); {
		l := min(len(b)-i, 512+r.IntN(8192))
		if r.IntN(3) == 0 {
			for k := 0; k+8 <= l; k += 8 {
				v := r.Uint64()
				for j := range 8 {
					b[i+k+j] = byte(v >> (8 * j))
				}
			}
		} else {
			s := r.IntN(len(text))
			for k := range l {
				b[i+k] = text[(s+k)%len(text)]
			}
		}
		i += l
	}
}

// NewFixture builds the stack in dir: a full base layer imported from a raw
// file, then three layers each committed from an upper that rewrote ~10% of
// the disk in scattered 4-64 KiB extents.
func NewFixture(ctx context.Context, dir string, size int64) (*Fixture, error) {
	f := &Fixture{Dir: dir, Size: size, Raw: filepath.Join(dir, "flat.raw"), Config: filepath.Join(dir, "image.json")}
	r := rand.New(rand.NewPCG(42, 42))
	base := make([]byte, size)
	fillMixed(r, base)
	basePath := filepath.Join(dir, "base.raw")
	if err := os.WriteFile(basePath, base, 0o644); err != nil {
		return nil, err
	}
	l0 := filepath.Join(dir, "l0.lsmt")
	if _, err := image.ImportRaw(ctx, basePath, l0, image.CommitOptions{Message: "base"}); err != nil {
		return nil, err
	}
	os.Remove(basePath)
	f.Layers = []string{l0}
	for i := 1; i <= 3; i++ {
		cfg := filepath.Join(dir, fmt.Sprintf("build%d.json", i))
		if _, err := image.Create(ctx, cfg, image.CreateSpec{Lowers: f.Layers}); err != nil {
			return nil, err
		}
		im, err := image.Open(ctx, cfg, image.Options{})
		if err != nil {
			return nil, err
		}
		buf := make([]byte, 64<<10)
		for written := int64(0); written < size/10; {
			n := int64(4096 * (1 + r.IntN(16)))
			off := r.Int64N(size/4096-16) * 4096
			fillMixed(r, buf[:n])
			if _, err := im.WriteAt(buf[:n], off); err != nil {
				return nil, err
			}
			written += n
		}
		li := filepath.Join(dir, fmt.Sprintf("l%d.lsmt", i))
		if _, err := im.Commit(ctx, li, image.CommitOptions{}); err != nil {
			return nil, err
		}
		im.Close()
		f.Layers = append(f.Layers, li)
	}
	if _, err := image.Create(ctx, f.Config, image.CreateSpec{Lowers: f.Layers}); err != nil {
		return nil, err
	}
	im, err := image.OpenLayers(ctx, f.Layers, image.Options{})
	if err != nil {
		return nil, err
	}
	defer im.Close()
	if err := image.Export(ctx, im, f.Raw); err != nil {
		return nil, err
	}
	return f, nil
}

// Verify compares the image with the raw file.
func (f *Fixture) Verify(ctx context.Context) error {
	im, err := image.Open(ctx, f.Config, image.Options{ReadOnly: true})
	if err != nil {
		return err
	}
	defer im.Close()
	raw, err := os.Open(f.Raw)
	if err != nil {
		return err
	}
	defer raw.Close()
	a, b := make([]byte, 1<<20), make([]byte, 1<<20)
	for off := int64(0); off < f.Size; off += int64(len(a)) {
		n := int(min(int64(len(a)), f.Size-off))
		if _, err := im.ReadAt(a[:n], off); err != nil && err != io.EOF {
			return err
		}
		if _, err := raw.ReadAt(b[:n], off); err != nil && err != io.EOF {
			return err
		}
		if !bytes.Equal(a[:n], b[:n]) {
			return fmt.Errorf("image and raw file differ in [%d,+%d)", off, n)
		}
	}
	return nil
}

// RandomReads runs 4 KiB aligned random reads from threads goroutines for d
// and returns reads per second.
func RandomReads(r io.ReaderAt, size int64, threads int, d time.Duration) float64 {
	var total atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	for t := range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(t), 7))
			buf := make([]byte, 4096)
			blocks := size / 4096
			n := int64(0)
			for {
				for range 256 {
					r.ReadAt(buf, rng.Int64N(blocks)*4096)
				}
				n += 256
				if time.Now().After(deadline) {
					break
				}
			}
			total.Add(n)
		}()
	}
	start := time.Now()
	wg.Wait()
	return float64(total.Load()) / time.Since(start).Seconds()
}

// SequentialRead reads the whole disk with bs-sized reads, in passes until
// at least d has passed (one pass when d is 0), and returns MB/s.
func SequentialRead(r io.ReaderAt, size int64, bs int, d time.Duration) float64 {
	buf := make([]byte, bs)
	start := time.Now()
	var total int64
	for {
		for off := int64(0); off < size; off += int64(bs) {
			r.ReadAt(buf, off)
		}
		total += size
		if time.Since(start) >= d {
			break
		}
	}
	return float64(total) / 1e6 / time.Since(start).Seconds()
}

// BuildIndex returns an index of n segments of 8 sectors with 8-sector gaps.
func BuildIndex(n int) *lsmt.Index {
	segs := make([]lsmt.Segment, n)
	for i := range segs {
		segs[i] = lsmt.Segment{Offset: uint64(i) * 16, Length: 8, MOffset: uint64(i)*8 + 8}
	}
	return lsmt.NewIndex(segs)
}

// IndexLookups runs random 8-sector lookups for d and returns lookups/s.
func IndexLookups(x *lsmt.Index, d time.Duration) float64 {
	rng := rand.New(rand.NewPCG(1, 1))
	span := uint64(x.Len()) * 16
	var dst [4]lsmt.Segment
	n := 0
	start := time.Now()
	deadline := start.Add(d)
	for {
		for range 4096 {
			x.Lookup(dst[:0], rng.Uint64N(span), 8)
		}
		n += 4096
		if time.Now().After(deadline) {
			break
		}
	}
	return float64(n) / time.Since(start).Seconds()
}

// ZFileResult holds compression throughputs in MB/s of raw data (wall
// clock), the same per CPU-second (robust when the machine is shared), and
// the compression ratios.
type ZFileResult struct {
	OursCompress, OursDecompress       float64
	CLICompress, CLIDecompress         float64
	OursCompressCPU, OursDecompressCPU float64
	CLICompressCPU, CLIDecompressCPU   float64
	OursRatio, CLIRatio                float64 // compressed / raw size
}

// SelfCPUSeconds is the CPU time this process has used.
func SelfCPUSeconds() float64 { return selfCPU() }

func selfCPU() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func childCPU(c *exec.Cmd) float64 {
	return (c.ProcessState.UserTime() + c.ProcessState.SystemTime()).Seconds()
}

// runCLI runs a command and returns its wall and CPU seconds.
func runCLI(ctx context.Context, name string, args ...string) (float64, float64, error) {
	c := exec.CommandContext(ctx, name, args...)
	start := time.Now()
	out, err := c.CombinedOutput()
	if err != nil {
		return 0, 0, fmt.Errorf("%s %v: %v: %s", name, args, err, out)
	}
	return time.Since(start).Seconds(), childCPU(c), nil
}

// CompareZstd compresses and decompresses the file at path with our ZFile
// (blockSize blocks, zstd level 3, CRCs) and with the `zstd -3` CLI, rounds
// times interleaved, keeping the best of each (load from elsewhere on the
// machine only ever slows a run down).
func CompareZstd(ctx context.Context, path string, blockSize, rounds int) (ZFileResult, error) {
	var res ZFileResult
	for range max(rounds, 1) {
		r, err := compareOnce(ctx, path, blockSize)
		if err != nil {
			return res, err
		}
		res.OursCompress = max(res.OursCompress, r.OursCompress)
		res.OursDecompress = max(res.OursDecompress, r.OursDecompress)
		res.CLICompress = max(res.CLICompress, r.CLICompress)
		res.CLIDecompress = max(res.CLIDecompress, r.CLIDecompress)
		res.OursCompressCPU = max(res.OursCompressCPU, r.OursCompressCPU)
		res.OursDecompressCPU = max(res.OursDecompressCPU, r.OursDecompressCPU)
		res.CLICompressCPU = max(res.CLICompressCPU, r.CLICompressCPU)
		res.CLIDecompressCPU = max(res.CLIDecompressCPU, r.CLIDecompressCPU)
		res.OursRatio, res.CLIRatio = r.OursRatio, r.CLIRatio
	}
	return res, nil
}

func compareOnce(ctx context.Context, path string, blockSize int) (ZFileResult, error) {
	var res ZFileResult
	st, err := os.Stat(path)
	if err != nil {
		return res, err
	}
	size := float64(st.Size())
	dir := filepath.Dir(path)
	zpath := filepath.Join(dir, "bench.zfile")
	defer os.Remove(zpath)
	in, err := os.Open(path)
	if err != nil {
		return res, err
	}
	out, err := os.Create(zpath)
	if err != nil {
		return res, err
	}
	start, cpu := time.Now(), selfCPU()
	_, err = zfile.Compress(ctx, out, in, zfile.Options{BlockSize: blockSize})
	res.OursCompress = size / 1e6 / time.Since(start).Seconds()
	res.OursCompressCPU = size / 1e6 / (selfCPU() - cpu)
	in.Close()
	out.Close()
	if err != nil {
		return res, err
	}
	zst, _ := os.Stat(zpath)
	res.OursRatio = float64(zst.Size()) / size

	cpath := filepath.Join(dir, "bench.zst")
	defer os.Remove(cpath)
	wall, cpus, err := runCLI(ctx, "zstd", "-3", "-q", "-f", path, "-o", cpath)
	if err != nil {
		return res, err
	}
	res.CLICompress, res.CLICompressCPU = size/1e6/wall, size/1e6/cpus
	cst, _ := os.Stat(cpath)
	res.CLIRatio = float64(cst.Size()) / size

	zf, err := os.Open(zpath)
	if err != nil {
		return res, err
	}
	defer zf.Close()
	z, err := zfile.Open(zpath, zf, zst.Size())
	if err != nil {
		return res, err
	}
	start, cpu = time.Now(), selfCPU()
	if err := z.WriteTo(ctx, io.Discard); err != nil {
		return res, err
	}
	res.OursDecompress = size / 1e6 / time.Since(start).Seconds()
	res.OursDecompressCPU = size / 1e6 / (selfCPU() - cpu)
	wall, cpus, err = runCLI(ctx, "zstd", "-d", "-q", "-f", cpath, "-o", "/dev/null")
	if err != nil {
		return res, err
	}
	res.CLIDecompress, res.CLIDecompressCPU = size/1e6/wall, size/1e6/cpus
	return res, nil
}
