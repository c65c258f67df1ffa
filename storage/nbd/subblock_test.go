package nbd

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"

	"github.com/agentenv/agentenv/storage/lsmt"
)

// stackBackend is a layered image (a sealed lower of 0xee under a writable
// upper) served as an export: the path where sub-block writes are widened.
func stackBackend(t *testing.T, size int64, sparse bool) *lsmt.Stack {
	t.Helper()
	dir := t.TempDir()
	var u *lsmt.Upper
	var err error
	if sparse {
		u, err = lsmt.CreateSparseUpper(filepath.Join(dir, "up.sparse"), uint64(size), lsmt.UUID{})
	} else {
		u, err = lsmt.CreateUpper(filepath.Join(dir, "up.data"), filepath.Join(dir, "up.index"), uint64(size), lsmt.UUID{})
	}
	if err != nil {
		t.Fatal(err)
	}
	st, err := lsmt.NewStack(nil, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.WriteAt(bytes.Repeat([]byte{0xee}, int(size)), 0); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestConcurrentSubBlockWrites: many clients write small non-overlapping
// pieces that share blocks (the server advertises a minimum block of 1, so a
// client may); a model of every byte must match what reads back. A widened
// write that is not atomic per block loses its neighbours' bytes.
func TestConcurrentSubBlockWrites(t *testing.T) {
	t.Parallel()
	const size = 64 << 10
	for _, sparse := range []bool{false, true} {
		t.Run(fmt.Sprintf("sparse=%v", sparse), func(t *testing.T) {
			t.Parallel()
			st := stackBackend(t, size, sparse)
			_, addr := serve(t, "unix", Export{Name: "disk", Backend: st})
			model := bytes.Repeat([]byte{0xee}, size)
			// Pieces of 1..200 bytes covering the disk, dealt to writers at random.
			type piece struct{ off, n int }
			var pieces []piece
			r := rand.New(rand.NewPCG(7, uint64(size)))
			for off := 0; off < size; {
				n := min(1+r.IntN(200), size-off)
				pieces = append(pieces, piece{off, n})
				off += n
			}
			r.Shuffle(len(pieces), func(i, j int) { pieces[i], pieces[j] = pieces[j], pieces[i] })
			const writers = 16
			clients := make([]*Client, 4)
			for i := range clients {
				clients[i] = dial(t, "unix", addr, "disk")
			}
			var wg sync.WaitGroup
			errs := make(chan error, writers)
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := clients[w%len(clients)]
					for i := w; i < len(pieces); i += writers {
						p := pieces[i]
						b := bytes.Repeat([]byte{byte(i%251 + 1)}, p.n)
						if _, err := c.WriteAt(b, int64(p.off)); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			for i, p := range pieces {
				for k := range p.n {
					model[p.off+k] = byte(i%251 + 1)
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			got := make([]byte, size)
			if _, err := clients[0].ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			lost := 0
			first := -1
			for i := range got {
				if got[i] != model[i] {
					if first < 0 {
						first = i
					}
					lost++
				}
			}
			if lost > 0 {
				t.Fatalf("%d of %d bytes lost (first at %d: %#x, want %#x)", lost, size, first, got[first], model[first])
			}
		})
	}
}
