package memsnap

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzReadWorkingSet: a stored working set is a hint anyone with the data
// dir could have damaged: whatever it holds, reading it never panics, and
// what it accepts lies inside the file it claims to describe, bounded in
// count.
func FuzzReadWorkingSet(f *testing.F) {
	f.Add([]byte(`{"size":8192,"extents":[{"off":0,"len":4096}]}`), int64(8192))
	f.Add([]byte(`{"size":8192,"extents":[{"off":4096,"len":8192}]}`), int64(8192))
	f.Add([]byte(`{"size":-1,"extents":[{"off":-4096,"len":4096}]}`), int64(-1))
	f.Add([]byte(`{"size":9223372036854775807,"extents":[{"off":9223372036854775807,"len":1}]}`), int64(9223372036854775807))
	f.Add([]byte(`[1,2,3]`), int64(0))
	path := filepath.Join(f.TempDir(), "ws")
	f.Fuzz(func(t *testing.T, data []byte, size int64) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		extents, err := ReadWorkingSet(path, size)
		if err != nil {
			return
		}
		if len(extents) > maxWorkingSetExtents {
			t.Fatalf("%d extents accepted", len(extents))
		}
		for _, e := range extents {
			if e.Off < 0 || e.Len <= 0 || e.Off+e.Len > size || e.Off+e.Len < e.Off {
				t.Fatalf("extent %d+%d of a %d-byte file accepted", e.Off, e.Len, size)
			}
		}
	})
}
