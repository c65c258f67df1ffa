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
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

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

// Layout says how the three layers above the base were written.
type Layout int

const (
	// Fragmented: each layer rewrote ~10% of the disk in 4-64 KiB extents
	// scattered over the whole disk: a worst case, where a 1 MiB read of
	// the stack is some 16 pieces from 4 layer files.
	Fragmented Layout = iota
	// Unpacked: each layer wrote ~10% of the disk as an unpacked image
	// layer does: files of 64 KiB-1 MiB laid out one after another from
	// where the file system's allocator was (small gaps between them),
	// plus scattered 4 KiB metadata blocks (inode tables, bitmaps,
	// directories).
	Unpacked
)

func (l Layout) String() string {
	if l == Unpacked {
		return "unpacked-image layers"
	}
	return "fragmented layers"
}

// NewFixture builds the Fragmented stack in dir.
func NewFixture(ctx context.Context, dir string, size int64) (*Fixture, error) {
	return NewFixtureLayout(ctx, dir, size, Fragmented)
}

// writeLayer makes the writes of one layer above the base.
func writeLayer(im *image.Image, r *rand.Rand, size int64, layout Layout) error {
	buf := make([]byte, 1<<20)
	write := func(off, n int64) error {
		n = min(n, size-off)
		fillMixed(r, buf[:n])
		_, err := im.WriteAt(buf[:n], off)
		return err
	}
	if layout == Fragmented {
		for written := int64(0); written < size/10; {
			n := int64(4096 * (1 + r.IntN(16)))
			if err := write(r.Int64N(size/4096-16)*4096, n); err != nil {
				return err
			}
			written += n
		}
		return nil
	}
	off := r.Int64N(size/4096) * 4096
	for written := int64(0); written < size/10; {
		n := int64(64<<10) << r.IntN(5) // 64 KiB .. 1 MiB
		n += int64(r.IntN(int(n/4096))) * 4096
		n = min(n, 1<<20)
		if off+n > size {
			off = 0
		}
		if err := write(off, n); err != nil {
			return err
		}
		written += n
		off += n + int64(r.IntN(16))*4096
		if r.IntN(8) == 0 { // a metadata block somewhere else
			if err := write(r.Int64N(size/4096)*4096, 4096); err != nil {
				return err
			}
		}
	}
	return nil
}

// NewFixtureLayout builds the stack in dir: a full base layer imported from
// a raw file, then three layers each committed from an upper written as
// layout says, and the flat raw file of the result.
func NewFixtureLayout(ctx context.Context, dir string, size int64, layout Layout) (*Fixture, error) {
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
		if err := writeLayer(im, r, size, layout); err != nil {
			im.Close()
			return nil, err
		}
		li := filepath.Join(dir, fmt.Sprintf("l%d.lsmt", i))
		if _, err := im.Commit(ctx, li, image.CommitOptions{}); err != nil {
			im.Close()
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

// Recache drops the page cache of the flat file and of every layer file and
// reads each back whole with 1 MiB reads, so that all of them are cached
// alike: by read-ahead, not by whatever write sizes made each file (the page
// cache keeps the folio sizes a file was written with, and larger folios copy
// faster).
func (f *Fixture) Recache() error {
	for _, p := range append([]string{f.Raw}, f.Layers...) {
		if err := recache(p); err != nil {
			return err
		}
	}
	return nil
}

func recache(path string) error {
	fd, err := os.Open(path)
	if err != nil {
		return err
	}
	defer fd.Close()
	if err := fd.Sync(); err != nil {
		return fmt.Errorf("recache %s: %w", path, err)
	}
	if err := unix.Fadvise(int(fd.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("recache %s: %w", path, err)
	}
	st, err := fd.Stat()
	if err != nil {
		return err
	}
	SequentialRead(fd, st.Size(), 1<<20, 0)
	return nil
}

// PieceStats is how many pieces (runs of one layer) a request of bs bytes
// resolves to in the stack, on average over the disk.
func PieceStats(im *image.Image, size int64, bs int) float64 {
	x := im.Stack().MergedIndex()
	var buf []lsmt.Segment
	n := 0
	for off := int64(0); off < size; off += int64(bs) {
		buf = x.Lookup(buf[:0], uint64(off)/lsmt.SectorSize, uint64(bs)/lsmt.SectorSize)
		n += len(buf)
	}
	return float64(n) / float64(size/int64(bs))
}

// Verify compares the image, opened with opt, with the raw file.
func (f *Fixture) Verify(ctx context.Context, opt image.Options) error {
	opt.ReadOnly = true
	im, err := image.Open(ctx, f.Config, opt)
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
// clock) and the same per CPU-second (robust when the machine is shared):
// ours with one goroutine (like for like with the single-threaded zstd CLI)
// and with Threads goroutines; and the compression ratios.
type ZFileResult struct {
	Threads                    int
	Compress1, Decompress1     Rate    // ours, one goroutine
	CompressN, DecompressN     Rate    // ours, Threads goroutines
	CLICompress, CLIDecompress Rate    // zstd -3 -T1, zstd -d
	OursRatio, CLIRatio        float64 // compressed / raw size
}

// Rate is a throughput by wall clock and per CPU-second.
type Rate struct{ Wall, CPU float64 }

func (r *Rate) best(o Rate) { r.Wall, r.CPU = max(r.Wall, o.Wall), max(r.CPU, o.CPU) }

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
	res := ZFileResult{Threads: runtime.GOMAXPROCS(0)}
	for range max(rounds, 1) {
		r, err := compareOnce(ctx, path, blockSize, res.Threads)
		if err != nil {
			return res, err
		}
		res.Compress1.best(r.Compress1)
		res.Decompress1.best(r.Decompress1)
		res.CompressN.best(r.CompressN)
		res.DecompressN.best(r.DecompressN)
		res.CLICompress.best(r.CLICompress)
		res.CLIDecompress.best(r.CLIDecompress)
		res.OursRatio, res.CLIRatio = r.OursRatio, r.CLIRatio
	}
	return res, nil
}

// timed runs f and returns the rate of size bytes by wall clock and per
// CPU-second of this process.
func timed(size float64, f func() error) (Rate, error) {
	start, cpu := time.Now(), selfCPU()
	err := f()
	return Rate{Wall: size / 1e6 / time.Since(start).Seconds(), CPU: size / 1e6 / (selfCPU() - cpu)}, err
}

func compressFile(ctx context.Context, path, zpath string, opt zfile.Options) error {
	in, err := os.Open(path)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(zpath)
	if err != nil {
		return err
	}
	if _, err := zfile.Compress(ctx, out, in, opt); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func decompressFile(ctx context.Context, zpath string, workers int) error {
	zf, err := os.Open(zpath)
	if err != nil {
		return err
	}
	defer zf.Close()
	st, err := zf.Stat()
	if err != nil {
		return err
	}
	z, err := zfile.Open(zpath, zf, st.Size())
	if err != nil {
		return err
	}
	return z.WriteToN(ctx, io.Discard, workers)
}

func compareOnce(ctx context.Context, path string, blockSize, threads int) (ZFileResult, error) {
	res := ZFileResult{Threads: threads}
	st, err := os.Stat(path)
	if err != nil {
		return res, err
	}
	size := float64(st.Size())
	dir := filepath.Dir(path)
	zpath := filepath.Join(dir, "bench.zfile")
	defer os.Remove(zpath)
	// Ours: the file is read through the page cache, as the CLI reads it.
	for _, c := range []struct {
		rate    *Rate
		threads int
	}{{&res.CompressN, threads}, {&res.Compress1, 1}} {
		if *c.rate, err = timed(size, func() error {
			return compressFile(ctx, path, zpath, zfile.Options{BlockSize: blockSize, Concurrency: c.threads})
		}); err != nil {
			return res, err
		}
	}
	zst, err := os.Stat(zpath)
	if err != nil {
		return res, err
	}
	res.OursRatio = float64(zst.Size()) / size

	cpath := filepath.Join(dir, "bench.zst")
	defer os.Remove(cpath)
	wall, cpus, err := runCLI(ctx, "zstd", "-3", "-T1", "-q", "-f", path, "-o", cpath)
	if err != nil {
		return res, err
	}
	res.CLICompress = Rate{Wall: size / 1e6 / wall, CPU: size / 1e6 / cpus}
	cst, err := os.Stat(cpath)
	if err != nil {
		return res, err
	}
	res.CLIRatio = float64(cst.Size()) / size

	for _, c := range []struct {
		rate    *Rate
		threads int
	}{{&res.Decompress1, 1}, {&res.DecompressN, threads}} {
		if *c.rate, err = timed(size, func() error { return decompressFile(ctx, zpath, c.threads) }); err != nil {
			return res, err
		}
	}
	wall, cpus, err = runCLI(ctx, "zstd", "-d", "-q", "-f", cpath, "-o", "/dev/null")
	if err != nil {
		return res, err
	}
	res.CLIDecompress = Rate{Wall: size / 1e6 / wall, CPU: size / 1e6 / cpus}
	return res, nil
}
