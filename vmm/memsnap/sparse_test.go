package memsnap

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestImportSparseDiff: a Firecracker-style diff file (data extents where
// pages were dirtied, holes elsewhere) on top of a base: dirtied pages win,
// dirtied-to-zero pages hide the base, holes show the base.
func TestImportSparseDiff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	const pages = 64
	page := func(b byte) []byte { return bytes.Repeat([]byte{b}, int(ps)) }
	base := make([]byte, pages*ps)
	for p := int64(0); p < pages; p++ {
		copy(base[p*ps:], page(byte('a'+p%26)))
	}
	baseFile := filepath.Join(dir, "base.mem")
	if err := os.WriteFile(baseFile, base, 0o600); err != nil {
		t.Fatal(err)
	}
	baseLayer := filepath.Join(dir, "base.lsmt")
	if _, err := ImportFull(ctx, baseFile, baseLayer, "base"); err != nil {
		t.Fatal(err)
	}
	parent, err := LayerUUID(baseLayer)
	if err != nil {
		t.Fatal(err)
	}
	// The diff: pages 3 and 40 rewritten, page 7 and 8 dirtied to zeros.
	diffFile := filepath.Join(dir, "diff.mem")
	f, err := os.Create(diffFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(pages * ps); err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), base...)
	for p, content := range map[int64][]byte{3: page('X'), 40: page('Y'), 7: page(0), 8: page(0)} {
		if _, err := f.WriteAt(content, p*ps); err != nil {
			t.Fatal(err)
		}
		copy(want[p*ps:], content)
	}
	f.Close()
	diffLayer := filepath.Join(dir, "diff.lsmt")
	st, err := ImportSparseDiff(ctx, diffFile, diffLayer, parent, "diff")
	if err != nil {
		t.Fatal(err)
	}
	if st.Pages != 2 || st.ZeroPages != 2 {
		t.Fatalf("imported %d data and %d zero pages, want 2 and 2", st.Pages, st.ZeroPages)
	}
	out := filepath.Join(dir, "flat")
	if err := Materialize(ctx, []string{baseLayer, diffLayer}, out); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		for p := int64(0); p < pages; p++ {
			if !bytes.Equal(got[p*ps:(p+1)*ps], want[p*ps:(p+1)*ps]) {
				t.Fatalf("page %d: got %q..., want %q...", p, got[p*ps:p*ps+4], want[p*ps:p*ps+4])
			}
		}
	}
	// A file whose size is not a page multiple: the short tail page counts.
	odd := filepath.Join(dir, "odd.mem")
	if err := os.WriteFile(odd, append(page('Z'), bytes.Repeat([]byte{'T'}, 1024)...), 0o600); err != nil {
		t.Fatal(err)
	}
	if st, err := ImportSparseDiff(ctx, odd, filepath.Join(dir, "odd.lsmt"), parent, "odd"); err != nil || st.Pages != 2 {
		t.Fatalf("odd-sized diff: %+v %v, want 2 data pages", st, err)
	}
	if _, err := ImportSparseDiff(ctx, filepath.Join(dir, "missing"), filepath.Join(dir, "x.lsmt"), parent, ""); err == nil {
		t.Fatal("a missing diff file imported")
	}
	noTemp(t, filepath.Join(dir, "x.lsmt"))
}
