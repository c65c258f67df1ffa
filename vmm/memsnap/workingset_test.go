package memsnap

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/vmm/memsnap/memsnaptest"
)

// TestWorkingSet: the pages a process touched in its private mapping are
// its working set; stored and prefetched, they come back into the page
// cache after being dropped from it; a damaged or foreign one is refused.
func TestWorkingSet(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const n = 64
	var data []int64
	for p := int64(0); p < n; p++ {
		data = append(data, p)
	}
	mem := filepath.Join(dir, "mem")
	writeMemFile(t, mem, n, 3, data)
	if _, err := Prefetch(mem); !errors.Is(err, ErrNoWorkingSet) {
		t.Fatalf("prefetch without a working set: %v, want ErrNoWorkingSet", err)
	}
	proc := startHelper(t, memsnaptest.Spec{File: mem, Reads: []int64{1, 2, 3, 10}, Writes: []int64{4, 40}})
	ws, err := WorkingSet(proc.Pid, mem)
	if err != nil {
		t.Fatal(err)
	}
	proc.Stop()
	// Read faults also map the cached pages around them (the kernel's
	// fault-around, 64 KiB): the set covers what was touched, and nothing
	// far from it.
	covers := func(p int64) bool {
		return slices.ContainsFunc(ws, func(e Extent) bool { return e.Off <= p*ps && p*ps < e.Off+e.Len })
	}
	for _, p := range []int64{1, 2, 3, 4, 10, 40} {
		if !covers(p) {
			t.Errorf("working set %v lacks touched page %d", ws, p)
		}
	}
	for _, p := range []int64{20, 30, 50, 60} {
		if covers(p) {
			t.Errorf("working set %v holds untouched page %d", ws, p)
		}
	}
	var total int64
	for _, e := range ws {
		total += e.Len
	}
	if err := WriteWorkingSet(mem, ws); err != nil {
		t.Fatal(err)
	}

	f, err := os.Open(mem)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil { // dirty pages stay cached
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	if res := resident(t, f); res[10] || res[40] {
		t.Skip("this filesystem keeps the file's pages cached after POSIX_FADV_DONTNEED; the prefetch cannot be observed")
	}
	got, err := Prefetch(mem)
	if err != nil || got != total {
		t.Fatalf("prefetch: %d bytes, %v; want %d", got, err, total)
	}
	waitResident(t, f, []int64{1, 2, 3, 4, 10, 40})

	// A working set of another file, or one past this file's end, is refused.
	if err := os.WriteFile(WorkingSetPath(mem), []byte(`{"size":4096,"extents":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Prefetch(mem); err == nil {
		t.Fatal("prefetch with the working set of another file's size: no error")
	}
	if err := os.WriteFile(WorkingSetPath(mem), []byte(`{"size":262144,"extents":[{"off":258048,"len":8192}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Prefetch(mem); err == nil {
		t.Fatal("prefetch of an extent past the end: no error")
	}
	if err := os.WriteFile(WorkingSetPath(mem), []byte(`{"size":`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Prefetch(mem); err == nil {
		t.Fatal("prefetch of a truncated working set: no error")
	}
}

// waitResident waits until every page in pages of f is in the page cache.
func waitResident(t *testing.T, f *os.File, pages []int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		res := resident(t, f)
		missing := []int64{}
		for _, p := range pages {
			if !res[p] {
				missing = append(missing, p)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pages %v not in the page cache after the prefetch", missing)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// resident reports, per page of f, whether it is in the page cache.
func resident(t *testing.T, f *os.File) []bool {
	t.Helper()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, fi.Size()/ps)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	out := make([]bool, len(vec))
	for i, v := range vec {
		out[i] = v&1 != 0
	}
	return out
}

// TestCapKeepsTheFirstBytes: a capped working set keeps its first extents
// in file order, the last one cut to fit, and is whole when it fits.
func TestCapKeepsTheFirstBytes(t *testing.T) {
	ws := []Extent{{Off: 0, Len: 8192}, {Off: 65536, Len: 16384}, {Off: 1 << 20, Len: 4096}}
	for _, tc := range []struct {
		max  int64
		want []Extent
	}{
		{1 << 30, ws},
		{8192 + 4096, []Extent{{Off: 0, Len: 8192}, {Off: 65536, Len: 4096}}},
		{8192, []Extent{{Off: 0, Len: 8192}}},
		{0, nil},
	} {
		got := Cap(ws, tc.max)
		if !slices.Equal(got, tc.want) || Bytes(got) > tc.max {
			t.Errorf("Cap(%d) = %v, want %v", tc.max, got, tc.want)
		}
	}
	if Bytes(ws) != 8192+16384+4096 {
		t.Errorf("Bytes = %d", Bytes(ws))
	}
}

// TestParseWorkingSet: one carried from another node is checked on its
// own terms: a size, extents inside it, a bounded count.
func TestParseWorkingSet(t *testing.T) {
	size, ext, err := ParseWorkingSet([]byte(`{"size":8192,"extents":[{"off":4096,"len":4096}]}`))
	if err != nil || size != 8192 || len(ext) != 1 {
		t.Fatalf("a valid working set: %d %v %v", size, ext, err)
	}
	for _, bad := range []string{`{"size":0,"extents":[]}`, `{"size":8192,"extents":[{"off":8192,"len":1}]}`,
		`{"size":8192,"extents":[{"off":0,"len":0}]}`, `[`, `{"size":-1}`} {
		if _, _, err := ParseWorkingSet([]byte(bad)); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
	if _, _, err := ParseWorkingSet(make([]byte, MaxWorkingSetBytes+1)); err == nil {
		t.Error("a working set over the limit parsed")
	}
}
