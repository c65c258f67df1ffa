package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/agentenv/agentenv/storage/zfile"
)

func fill(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.IntN(256))
	}
	return b
}

func readAll(t *testing.T, im *Image) []byte {
	t.Helper()
	b := make([]byte, im.Size())
	if _, err := im.ReadAt(b, 0); err != nil {
		t.Fatalf("read %s: %v", im.Name(), err)
	}
	return b
}

// TestLifecycle drives the public API the way the storage daemon does:
// create, write, trim, flush, commit, stack a new upper on the commit,
// compress, reopen.
func TestLifecycle(t *testing.T) {
	for _, sparse := range []bool{false, true} {
		t.Run(map[bool]string{false: "log", true: "sparse"}[sparse], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dir := t.TempDir()
			const size = 4 << 20
			cfg0 := filepath.Join(dir, "img0.json")
			if _, err := Create(ctx, cfg0, CreateSpec{Size: size, Sparse: sparse}); err != nil {
				t.Fatal(err)
			}
			im, err := Open(ctx, cfg0, Options{})
			if err != nil {
				t.Fatal(err)
			}
			model := make([]byte, size)
			write := func(im *Image, off int, b []byte) {
				t.Helper()
				if _, err := im.WriteAt(b, int64(off)); err != nil {
					t.Fatalf("write at %d: %v", off, err)
				}
				copy(model[off:], b)
			}
			write(im, 0, fill(1, 65536))
			write(im, 1000, fill(2, 3000)) // unaligned
			write(im, 1<<20, fill(3, 1<<20))
			if err := im.Trim(1<<20+100, 5000); err != nil {
				t.Fatal(err)
			}
			clear(model[1<<20+100 : 1<<20+5100])
			if got := readAll(t, im); !bytes.Equal(got, model) {
				t.Fatal("image differs from the model before commit")
			}
			layer := filepath.Join(dir, "l0.lsmt")
			info, err := im.Commit(ctx, layer, CommitOptions{Message: "first"})
			if err != nil {
				t.Fatal(err)
			}
			if info.UUID.IsNil() || info.Segments == 0 {
				t.Fatalf("commit info %+v", info)
			}
			if err := im.Close(); err != nil {
				t.Fatal(err)
			}
			cfg1 := filepath.Join(dir, "img1.json")
			if _, err := Create(ctx, cfg1, CreateSpec{Lowers: []string{"l0.lsmt"}, Sparse: sparse}); err != nil {
				t.Fatal(err)
			}
			im1, err := Open(ctx, cfg1, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer im1.Close()
			if im1.Size() != size {
				t.Fatalf("size %d, want %d", im1.Size(), size)
			}
			if got := readAll(t, im1); !bytes.Equal(got, model) {
				t.Fatal("stacked image differs from the committed content")
			}
			if up := im1.Stack().Upper(); up.Header().ParentUUID != info.UUID {
				t.Fatalf("upper parent %s, want %s", up.Header().ParentUUID, info.UUID)
			}
			write(im1, 4096*3, fill(4, 8192))
			if err := im1.Flush(); err != nil {
				t.Fatal(err)
			}
			layer2 := filepath.Join(dir, "l1.zfile")
			if _, err := im1.Commit(ctx, layer2, CommitOptions{Compress: &zfile.Options{}}); err != nil {
				t.Fatal(err)
			}
			ro, err := OpenLayers(ctx, []string{layer, layer2}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer ro.Close()
			if got := readAll(t, ro); !bytes.Equal(got, model) {
				t.Fatal("two-layer stack with a ZFile differs from the model")
			}
			if _, err := ro.WriteAt([]byte{1}, 0); !errors.Is(err, ErrReadOnly) {
				t.Fatalf("write to read-only image: %v", err)
			}
			merged := filepath.Join(dir, "merged.lsmt")
			if _, err := Merge(ctx, []string{layer, layer2}, merged, CommitOptions{Message: "m"}); err != nil {
				t.Fatal(err)
			}
			m, err := OpenLayers(ctx, []string{merged}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if got := readAll(t, m); !bytes.Equal(got, model) {
				t.Fatal("merged layer differs from the model")
			}
		})
	}
}

func TestOpenErrorsNameTheFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.lsmt")
	if err := os.WriteFile(bad, make([]byte, 10000), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := OpenLayers(context.Background(), []string{bad}, Options{})
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte(bad)) {
		t.Fatalf("error %v does not name %s", err, bad)
	}
}

// TestRemoteLower serves a ZFile layer over HTTP (range requests on the
// loopback) and stacks a local upper on it.
func TestRemoteLower(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	raw := fill(9, 2<<20)
	clear(raw[1<<20 : 1<<20+300000])
	os.WriteFile(filepath.Join(dir, "disk.raw"), raw, 0o644)
	layer := filepath.Join(dir, "base.zfile")
	if _, err := ImportRaw(ctx, filepath.Join(dir, "disk.raw"), layer, CommitOptions{Compress: &zfile.Options{BlockSize: 16384}}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	defer srv.Close()
	cfg := &Config{Lowers: []LayerRef{{URL: srv.URL + "/base.zfile"}}, Upper: &UpperRef{Data: "u.data", Index: "u.index"}}
	if _, err := Create(ctx, filepath.Join(dir, "remote.json"), CreateSpec{Lowers: []string{srv.URL + "/base.zfile"}, UpperData: "u.data", UpperIndex: "u.index"}); err != nil {
		t.Fatal(err)
	}
	im, err := OpenConfig(ctx, cfg, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if got := readAll(t, im); !bytes.Equal(got, raw) {
		t.Fatal("remote layer content differs")
	}
	if _, err := im.WriteAt([]byte("local"), 10); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 20)
	im.ReadAt(got, 0)
	if string(got[10:15]) != "local" || !bytes.Equal(got[:10], raw[:10]) {
		t.Fatal("upper over a remote lower")
	}
}

// TestConcurrentIO: writers on disjoint regions, readers everywhere, flushes,
// as an NBD server issues them; the final disk matches (run with -race too).
func TestConcurrentIO(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	raw := fill(11, 4<<20)
	os.WriteFile(filepath.Join(dir, "base.raw"), raw, 0o644)
	if _, err := ImportRaw(ctx, filepath.Join(dir, "base.raw"), filepath.Join(dir, "base.lsmt"), CommitOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, sparse := range []bool{false, true} {
		cfg := filepath.Join(dir, fmt.Sprintf("c%v.json", sparse))
		if _, err := Create(ctx, cfg, CreateSpec{Lowers: []string{"base.lsmt"}, Sparse: sparse}); err != nil {
			t.Fatal(err)
		}
		im, err := Open(ctx, cfg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		want := bytes.Clone(raw)
		const writers, region = 4, 1 << 20
		var wg sync.WaitGroup
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(w), 0))
				for range 200 {
					off := w*region + r.IntN(region/4096-4)*4096
					b := fill(r.Uint64(), 4096*(1+r.IntN(4)))
					if r.IntN(5) == 0 {
						if err := im.Trim(int64(off), int64(len(b))); err != nil {
							t.Error(err)
							return
						}
						clear(want[off : off+len(b)])
					} else {
						if _, err := im.WriteAt(b, int64(off)); err != nil {
							t.Error(err)
							return
						}
						copy(want[off:], b)
					}
					if r.IntN(50) == 0 {
						if err := im.Flush(); err != nil {
							t.Error(err)
						}
					}
				}
			}()
		}
		for g := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(g), 9))
				p := make([]byte, 8192)
				for range 500 {
					if _, err := im.ReadAt(p, r.Int64N(int64(len(raw)-len(p)))); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if got := readAll(t, im); !bytes.Equal(got, want) {
			t.Fatalf("sparse=%v: disk differs after concurrent I/O", sparse)
		}
		if err := im.Close(); err != nil {
			t.Fatal(err)
		}
		im, err = Open(ctx, cfg, Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, im); !bytes.Equal(got, want) {
			t.Fatalf("sparse=%v: disk differs after reopening", sparse)
		}
		im.Close()
	}
}

// TestCloseWhileReading: closing an image while goroutines read a layered
// stack from it (io_uring batches over its layer files) gives readers
// errors or right bytes, never a crash or bytes from another file.
func TestCloseWhileReading(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	raw := fill(21, 2<<20)
	os.WriteFile(filepath.Join(dir, "base.raw"), raw, 0o644)
	if _, err := ImportRaw(ctx, filepath.Join(dir, "base.raw"), filepath.Join(dir, "l0.lsmt"), CommitOptions{}); err != nil {
		t.Fatal(err)
	}
	// A second layer rewriting every other 64 KiB, so big reads span both.
	cfg := filepath.Join(dir, "build.json")
	if _, err := Create(ctx, cfg, CreateSpec{Lowers: []string{"l0.lsmt"}}); err != nil {
		t.Fatal(err)
	}
	im, err := Open(ctx, cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Clone(raw)
	for off := 0; off < len(raw); off += 128 << 10 {
		b := fill(uint64(off), 64<<10)
		copy(want[off:], b)
		if _, err := im.WriteAt(b, int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := im.Commit(ctx, filepath.Join(dir, "l1.lsmt"), CommitOptions{}); err != nil {
		t.Fatal(err)
	}
	im.Close()
	for _, noMmap := range []bool{false, true} {
		for range 5 {
			st, err := OpenLayers(ctx, []string{filepath.Join(dir, "l0.lsmt"), filepath.Join(dir, "l1.lsmt")}, Options{NoMmap: noMmap})
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(g), 5))
					p := make([]byte, 512<<10)
					for range 200 {
						off := r.Int64N(int64(len(raw)-len(p))/4096) * 4096
						if _, err := st.ReadAt(p, off); err != nil {
							return // closed under us: an error is the right answer
						}
						if !bytes.Equal(p, want[off:off+int64(len(p))]) {
							t.Errorf("noMmap=%v: wrong bytes at %d while closing", noMmap, off)
							return
						}
					}
				})
			}
			st.Close()
			wg.Wait()
		}
	}
}
