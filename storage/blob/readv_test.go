package blob

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestReadvAt: a vectored read fills the buffers in order from one range,
// through preadv or the mapping, for ranges of either size, and reports the
// end of the file.
func TestReadvAt(t *testing.T) {
	t.Parallel()
	data := make([]byte, 3*preadThreshold)
	for i := range data {
		data[i] = byte(i*13 + i>>11)
	}
	path := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, mmap := range []bool{false, true} {
		b, err := OpenLocal(path, mmap)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		v, ok := b.(VectorReaderAt)
		if !ok {
			t.Fatalf("%T does not read vectors", b)
		}
		for _, tc := range []struct {
			name  string
			sizes []int
			off   int64
		}{
			{"small", []int{100, 0, 4000, 7}, 5},
			{"large", []int{preadThreshold, 3, preadThreshold / 2}, 1000},
			{"many", manySizes(2100), 11}, // more than IOV_MAX buffers
		} {
			bufs := make([][]byte, len(tc.sizes))
			total := 0
			for i, n := range tc.sizes {
				bufs[i] = make([]byte, n)
				total += n
			}
			n, err := v.ReadvAt(bufs, tc.off)
			if err != nil || n != total {
				t.Fatalf("mmap=%v %s: n=%d err=%v, want %d", mmap, tc.name, n, err, total)
			}
			if got := bytes.Join(bufs, nil); !bytes.Equal(got, data[tc.off:tc.off+int64(total)]) {
				t.Fatalf("mmap=%v %s: wrong bytes", mmap, tc.name)
			}
		}
		bufs := [][]byte{make([]byte, 10), make([]byte, preadThreshold)}
		n, err := v.ReadvAt(bufs, int64(len(data))-20)
		if n != 20 || err != io.EOF {
			t.Fatalf("mmap=%v past the end: n=%d err=%v, want 20 and EOF", mmap, n, err)
		}
	}
}

func manySizes(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = 1 + i%3
	}
	return s
}
