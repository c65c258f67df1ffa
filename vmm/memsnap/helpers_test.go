package memsnap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agentenv/agentenv/internal/atomicfile"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/storage/lsmt"
	"github.com/agentenv/agentenv/vmm/memsnap/memsnaptest"
)

var ps = int64(pageSize)

// dirs are the filesystems memory files live on: the test's temporary
// directory (a disk filesystem here) and tmpfs.
func dirs(t *testing.T) map[string]string {
	out := map[string]string{"tempdir": t.TempDir()}
	if d, err := os.MkdirTemp("/dev/shm", "memsnap-test-"); err == nil {
		t.Cleanup(func() { os.RemoveAll(d) })
		out["tmpfs"] = d
	}
	return out
}

// writeMemFile writes a sparse file of n pages where the pages in data hold
// Pattern(seed, page) and the rest are holes; it returns the file's content.
func writeMemFile(t *testing.T, path string, n int64, seed uint64, data []int64) []byte {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(n * ps); err != nil {
		t.Fatal(err)
	}
	content := make([]byte, n*ps)
	for _, p := range data {
		pg := content[p*ps : (p+1)*ps]
		memsnaptest.Pattern(pg, seed, p)
		if _, err := f.WriteAt(pg, p*ps); err != nil {
			t.Fatal(err)
		}
	}
	return content
}

// apply returns mem after the helper of spec ran on it.
func apply(mem []byte, spec memsnaptest.Spec) []byte {
	out := bytes.Clone(mem)
	for _, p := range spec.Writes {
		memsnaptest.Pattern(out[p*ps:(p+1)*ps], spec.Seed, p)
	}
	for _, p := range spec.Zeros {
		clear(out[p*ps : (p+1)*ps])
	}
	return out
}

func startHelper(t *testing.T, spec memsnaptest.Spec) *memsnaptest.Proc {
	t.Helper()
	p, err := memsnaptest.Start(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop() })
	return p
}

// layerPages opens a sealed layer and returns its data pages and zeroed pages
// (pages must be whole: every mapping is page-aligned in our layers).
func layerPages(t *testing.T, path string) (l *lsmt.Layer, data, zeroed []int64) {
	t.Helper()
	l, err := lsmt.OpenLayerFile(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	spp := uint64(ps / lsmt.SectorSize)
	for _, s := range l.Index().Segments() {
		if s.Offset%spp != 0 || uint64(s.Length)%spp != 0 {
			t.Fatalf("layer %s: mapping %+v is not page-aligned", path, s)
		}
		for p := s.Offset / spp; p < s.End()/spp; p++ {
			if s.Zeroed {
				zeroed = append(zeroed, int64(p))
			} else {
				data = append(data, int64(p))
			}
		}
	}
	return l, data, zeroed
}

func sorted(s []int64) []int64 {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// fataler is what readFile needs of a *testing.T or a *rapid.T.
type fataler interface {
	Helper()
	Fatal(args ...any)
}

func readFile(t fataler, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// isHole reports whether a page of the file is a hole.
func isHole(t *testing.T, path string, page int64) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	off, err := unix.Seek(int(f.Fd()), page*ps, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) {
		return true
	}
	if err != nil {
		t.Fatal(err)
	}
	return off >= (page+1)*ps
}

// firstDiff describes where two byte slices differ, for failure messages.
func firstDiff(a, b []byte) string {
	if len(a) != len(b) {
		return fmt.Sprintf("lengths %d and %d", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			return fmt.Sprintf("byte %d (page %d): %#x vs %#x", i, int64(i)/ps, a[i], b[i])
		}
	}
	return "nothing"
}

func noTemp(t *testing.T, out string) {
	t.Helper()
	ents, _ := os.ReadDir(filepath.Dir(out))
	for _, e := range ents {
		if atomicfile.IsTemp(e.Name()) {
			t.Errorf("temporary file %s left behind next to %s", e.Name(), filepath.Base(out))
		}
	}
}
