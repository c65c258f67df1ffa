package uring

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func testFiles(t *testing.T, n, size int) ([]*os.File, [][]byte) {
	t.Helper()
	if !Enabled() {
		t.Skip("io_uring is not usable on this kernel (setup refused)")
	}
	dir := t.TempDir()
	var files []*os.File
	var data [][]byte
	r := rand.New(rand.NewPCG(1, uint64(n)))
	for i := range n {
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		p := filepath.Join(dir, string(rune('a'+i)))
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		files = append(files, f)
		data = append(data, b)
	}
	return files, data
}

// randomOps makes n reads of random ranges of random files, some split over
// several buffers, and returns them with the bytes each buffer must get.
func randomOps(r *rand.Rand, files []*os.File, data [][]byte, n int) ([]Op, [][]byte, [][]byte) {
	var ops []Op
	var bufs, want [][]byte
	for range n {
		k := r.IntN(len(files))
		size := len(data[k])
		off := r.IntN(size - 1)
		l := 1 + r.IntN(min(size-off, 256<<10))
		op := Op{Fd: int(files[k].Fd()), Off: int64(off)}
		for pos := off; pos < off+l; {
			piece := min(off+l-pos, 1+r.IntN(64<<10))
			b := make([]byte, piece)
			op.Iov = append(op.Iov, b)
			bufs = append(bufs, b)
			want = append(want, data[k][pos:pos+piece])
			pos += piece
		}
		ops = append(ops, op)
	}
	return ops, bufs, want
}

func TestReadBatchMatchesFiles(t *testing.T) {
	// Not parallel: TestReadBatchConcurrent may hold every ring the
	// process allows, and then ReadBatch rightly answers ErrUnavailable.
	files, data := testFiles(t, 4, 1<<20)
	r := rand.New(rand.NewPCG(7, 7))
	for _, n := range []int{1, 3, ringEntries, ringEntries*2 + 5} {
		ops, bufs, want := randomOps(r, files, data, n)
		if err := ReadBatch(ops); err != nil {
			t.Fatalf("%d ops: %v", n, err)
		}
		for i := range bufs {
			if !bytes.Equal(bufs[i], want[i]) {
				t.Fatalf("%d ops: buffer %d differs from the file", n, i)
			}
		}
	}
}

func TestReadBatchConcurrent(t *testing.T) {
	t.Parallel()
	files, data := testFiles(t, 3, 512<<10)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 3))
			for range 50 {
				ops, bufs, want := randomOps(r, files, data, 1+r.IntN(20))
				if err := ReadBatch(ops); err != nil && !errors.Is(err, ErrUnavailable) {
					errs <- err
					return
				} else if err != nil {
					continue // every ring busy: the caller would read the plain way
				}
				for i := range bufs {
					if !bytes.Equal(bufs[i], want[i]) {
						errs <- errors.New("concurrent batch read wrong bytes")
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestReadBatchErrors(t *testing.T) {
	// Not parallel: TestReadBatchConcurrent may hold every ring the
	// process allows, and then ReadBatch rightly answers ErrUnavailable.
	files, _ := testFiles(t, 1, 8192)
	past := []Op{{Fd: int(files[0].Fd()), Off: 4096, Iov: [][]byte{make([]byte, 2048), make([]byte, 4096)}}}
	if err := ReadBatch(past); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read past the end: %v, want io.ErrUnexpectedEOF", err)
	}
	dir, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	if err := ReadBatch([]Op{{Fd: int(dir.Fd()), Iov: [][]byte{make([]byte, 10)}}}); err == nil {
		t.Fatal("read of a directory succeeded")
	}
	if err := ReadBatch([]Op{{Fd: -1, Iov: [][]byte{make([]byte, 10)}}}); err == nil {
		t.Fatal("read of a bad descriptor succeeded")
	}
	// The ring is still good after the failures.
	fd := int(files[0].Fd())
	ok := []Op{{Fd: fd, Iov: [][]byte{make([]byte, 100)}}, {Fd: fd, Off: 8000, Iov: [][]byte{{}, make([]byte, 192)}}, {Fd: fd}}
	if err := ReadBatch(ok); err != nil {
		t.Fatalf("read after failures: %v", err)
	}
}

func TestDisabled(t *testing.T) {
	files, _ := testFiles(t, 1, 4096)
	SetEnabled(false)
	defer SetEnabled(true)
	if err := ReadBatch([]Op{{Fd: int(files[0].Fd()), Iov: [][]byte{make([]byte, 10)}}}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("disabled: %v, want ErrUnavailable", err)
	}
}
