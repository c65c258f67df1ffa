package memfs

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/memfs/memfstest"
)

// mount mounts a server on a fresh directory, unmounted (and checked gone)
// when the test ends.
func mount(t *testing.T, opts Options) *Server {
	t.Helper()
	memfstest.Require(t)
	return mountOn(t, filepath.Join(t.TempDir(), "mem"), opts)
}

func mountOn(t *testing.T, dir string, opts Options) *Server {
	t.Helper()
	s, err := Mount(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if ok, err := Mounted(dir); err != nil || ok {
			t.Errorf("mount %s left behind (%v)", dir, err)
		}
	})
	return s
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

// add exports a copy of src under name and returns its path.
func add(t *testing.T, s *Server, name string, src []byte) string {
	t.Helper()
	p, err := s.Add(name, bytes.NewReader(src), int64(len(src)))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPrivateMappingServesTheSourceAndKeepsWritesPrivate(t *testing.T) {
	s := mount(t, Options{})
	src := randomBytes(8<<20+123, 1) // not a whole number of pages
	orig := bytes.Clone(src)
	p := add(t, s, "stack-1", src)

	mapCheck(t, p, orig, 2, true, false)
	if !bytes.Equal(src, orig) {
		t.Fatal("a write to a private mapping reached the source")
	}
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, orig) {
		t.Fatal("a write to a private mapping changed the export's bytes")
	}
	if st := s.Stats(); st.Reads == 0 || st.ReadErrs != 0 {
		t.Fatalf("stats %+v: want reads and no errors", st)
	}
}

func TestWritesAndTruncateAreRefused(t *testing.T) {
	s := mount(t, Options{})
	src := randomBytes(1<<20, 2)
	p := add(t, s, "stack-2", src)
	// A mapping's pages, cached and mapped, are not touched by a refused
	// write(2) on the same descriptor.
	mapCheck(t, p, src, 1, false, true)

	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("overwrite"), 0); !errors.Is(err, syscall.EPERM) {
		t.Errorf("write: %v, want EPERM", err)
	}
	if err := f.Truncate(0); !errors.Is(err, syscall.EPERM) {
		t.Errorf("ftruncate: %v, want EPERM", err)
	}
	if err := os.Truncate(p, 4096); !errors.Is(err, syscall.EPERM) {
		t.Errorf("truncate: %v, want EPERM", err)
	}
	if _, err := os.OpenFile(p, os.O_RDWR|os.O_TRUNC, 0); !errors.Is(err, syscall.EPERM) {
		t.Errorf("open O_TRUNC: %v, want EPERM", err)
	}
	if err := os.Chmod(p, 0o666); !errors.Is(err, syscall.EPERM) {
		t.Errorf("chmod: %v, want EPERM", err)
	}
	if err := os.WriteFile(filepath.Join(s.Dir(), "new"), nil, 0o600); err == nil {
		t.Error("creating a file in the mount succeeded")
	}
	got := make([]byte, len(src))
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, src) {
		t.Errorf("after refused writes the file reads differently (%v)", err)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Size() != int64(len(src)) || fi.Mode().Perm() != 0o600 {
		t.Errorf("stat after refused changes: %v, %v", fi, err)
	}
}

func TestSecondMappingNeedsNoReads(t *testing.T) {
	s := mount(t, Options{})
	src := randomBytes(16<<20, 3)
	p := add(t, s, "stack-3", src)
	mapCheck(t, p, src, 1, false, false)
	before := s.Stats().Reads
	if before == 0 {
		t.Fatal("the first mapping took no FUSE reads: the counter does not count")
	}
	mapCheck(t, p, src, 2, false, false) // another process, two more mappings
	got, err := os.ReadFile(p)           // a plain read of a third open
	if err != nil || !bytes.Equal(got, src) {
		t.Fatalf("read after mapping: %v", err)
	}
	// A cache dropped at the open would read the file again: about as
	// many reads as the first mapping. A few pages may have been reclaimed
	// meanwhile by the host's proactive reclaim (kdamond), slowly under
	// the race detector; each comes back with one read.
	if after := s.Stats().Reads; after-before > before/4 {
		t.Fatalf("a second open and mapping took %d more FUSE reads (the first %d): the page cache was not kept", after-before, before)
	} else if after != before {
		t.Logf("a second open and mapping took %d more FUSE reads of the first %d's: pages reclaimed meanwhile", after-before, before)
	}
}

func TestPrefetchedRangesNeedNoReads(t *testing.T) {
	s := mount(t, Options{})
	src := randomBytes(8<<20, 4)
	p := add(t, s, "stack-4", src)
	ranges := []Range{{Off: 1 << 20, Len: 2 << 20}, {Off: 6<<20 + 100, Len: 5000}}
	n, err := s.Prefetch("stack-4", ranges)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(2<<20 + 8192); n != want { // the second range widened to two pages
		t.Fatalf("stored %d bytes, want %d", n, want)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before := s.Stats().Reads
	for _, r := range ranges {
		buf := make([]byte, r.Len)
		if _, err := f.ReadAt(buf, r.Off); err != nil || !bytes.Equal(buf, src[r.Off:r.Off+r.Len]) {
			t.Fatalf("prefetched range %+v reads wrong (%v)", r, err)
		}
	}
	if after := s.Stats().Reads; after != before {
		t.Fatalf("prefetched ranges took %d FUSE reads, want 0", after-before)
	}
	buf := make([]byte, 4096)
	if _, err := f.ReadAt(buf, 4<<20); err != nil || !bytes.Equal(buf, src[4<<20:4<<20+4096]) {
		t.Fatalf("range not prefetched reads wrong (%v)", err)
	}
	if s.Stats().Reads == before {
		t.Fatal("a range that was not prefetched took no FUSE read: the counter does not count")
	}
	if _, err := s.Prefetch("nope", ranges); err == nil {
		t.Error("prefetch of an unknown export succeeded")
	}
	if _, err := s.Prefetch("stack-4", []Range{{Off: -1, Len: 1}}); err == nil {
		t.Error("prefetch of a negative range succeeded")
	}
}

// failingReader fails every read that touches [badOff, badOff+badLen).
type failingReader struct {
	src            []byte
	badOff, badLen int64
}

func (r *failingReader) ReadAt(p []byte, off int64) (int, error) {
	if off < r.badOff+r.badLen && off+int64(len(p)) > r.badOff {
		return 0, errors.New("chunk failed its digest")
	}
	return bytes.NewReader(r.src).ReadAt(p, off)
}

func TestFailedReadIsEIO(t *testing.T) {
	s := mount(t, Options{})
	src := randomBytes(4<<20, 5)
	p, err := s.Add("stack-5", &failingReader{src: src, badOff: 2 << 20, badLen: 4096}, int64(len(src)))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for try := 0; try < 2; try++ { // nothing wrong is cached by the first failure
		if _, err := f.ReadAt(buf, 2<<20); !errors.Is(err, syscall.EIO) {
			t.Fatalf("read of a failing range: %v, want EIO", err)
		}
	}
	if s.Stats().ReadErrs == 0 {
		t.Error("no read error counted")
	}
	if _, err := f.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, src[:4096]) {
		t.Fatalf("a good range next to a failing one: %v", err)
	}
}

func TestConcurrentReaders(t *testing.T) {
	s := mount(t, Options{})
	src := randomBytes(8<<20, 6)
	p := add(t, s, "stack-6", src)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- readRandomly(p, src, uint64(g))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func readRandomly(path string, src []byte, seed uint64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r := rand.New(rand.NewPCG(seed, 7))
	buf := make([]byte, 64<<10)
	for range 200 {
		off := r.Int64N(int64(len(src)))
		n, err := f.ReadAt(buf, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if !bytes.Equal(buf[:n], src[off:off+int64(n)]) {
			return errors.New("concurrent read returned wrong bytes at " + filepath.Base(path))
		}
	}
	return nil
}

func TestExportsAreReferenceCounted(t *testing.T) {
	s := mount(t, Options{})
	a, b := randomBytes(1<<20, 7), randomBytes(1<<20, 8)
	pa := add(t, s, "a", a)
	if _, err := s.Add("a", bytes.NewReader(b), int64(len(b))); err == nil {
		t.Fatal("a second Add of one name succeeded")
	}
	for _, bad := range []string{"", ".", "..", "x/y", "nul\x00"} {
		if _, err := s.Add(bad, bytes.NewReader(b), 1); err == nil {
			t.Errorf("Add(%q) succeeded", bad)
		}
	}
	if err := s.Hold("a"); err != nil {
		t.Fatal(err)
	}
	open, err := os.Open(pa) // an open file outlives its name
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	pb := add(t, s, "b", b) // added while a is served
	if err := s.Release("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pa); err != nil {
		t.Fatalf("a held once more is gone: %v", err)
	}
	if err := s.Release("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pa); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a released by every holder: stat %v, want not exist", err)
	}
	if err := s.Release("a"); err == nil {
		t.Error("a release of a gone export succeeded")
	}
	got := make([]byte, len(a))
	if _, err := open.ReadAt(got, 0); err != nil || !bytes.Equal(got, a) {
		t.Fatalf("the file open before the removal: %v", err)
	}
	if got, err := os.ReadFile(pb); err != nil || !bytes.Equal(got, b) {
		t.Fatalf("b: %v", err)
	}
	names, err := os.ReadDir(s.Dir())
	if err != nil || len(names) != 1 || names[0].Name() != "b" {
		t.Fatalf("directory lists %v (%v), want [b]", names, err)
	}
}

func TestMountIsPrivateAndReadsAhead(t *testing.T) {
	s := mount(t, Options{})
	if kb, err := s.ReadAheadKB(); err != nil || kb != DefaultReadAheadKB {
		t.Errorf("read_ahead_kb %d (%v), want %d", kb, err, DefaultReadAheadKB)
	}
	p := add(t, s, "stack-9", randomBytes(4096, 9))
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o600 || st.Uid != 0 {
		t.Errorf("export mode %v uid %d, want 0600 root", fi.Mode(), st.Uid)
	}
	// Another uid: the kernel refuses it the whole mount.
	cmd := exec.Command("/bin/cat", p)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("uid 65534 read the export: %q", out)
	}
}

func TestMountOwnedByTheVMMUser(t *testing.T) {
	memfstest.Require(t)
	// The VMM's uid must reach the mount point: parents searchable.
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	s := mountOn(t, filepath.Join(base, "mem"), Options{UID: 65534, GID: 65534})
	src := randomBytes(4096, 10)
	p := add(t, s, "stack-10", src)
	as := func(uid uint32) ([]byte, error) {
		cmd := exec.Command("/bin/cat", p)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		return cmd.Output()
	}
	if out, err := as(65534); err != nil || !bytes.Equal(out, src) {
		t.Errorf("the VMM's uid cannot read its export: %v", err)
	}
	if _, err := as(65533); err == nil {
		t.Error("another uid read the export")
	}
}

func TestStaleMountIsDetached(t *testing.T) {
	memfstest.Require(t)
	dir := filepath.Join(t.TempDir(), "mem")
	s, err := Mount(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// A second server on the same directory replaces the first's mount.
	s2, err := Mount(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := add(t, s2, "x", []byte("hello"))
	if got, err := os.ReadFile(p); err != nil || string(got) != "hello" {
		t.Fatalf("read through the new mount: %q %v", got, err)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	if ok, _ := Mounted(dir); ok {
		t.Fatal("mount left behind")
	}
}

// gatedReader lets reads through once `want` of them are in flight at
// once, and fails a read that waited a while for that.
type gatedReader struct {
	src      []byte
	want     int32
	inFlight atomic.Int32
	open     chan struct{}
	once     sync.Once
}

func (r *gatedReader) ReadAt(p []byte, off int64) (int, error) {
	if r.inFlight.Add(1) >= r.want {
		r.once.Do(func() { close(r.open) })
	}
	defer r.inFlight.Add(-1)
	select {
	case <-r.open:
	case <-time.After(10 * time.Second):
		return 0, errors.New("reads of the prefetch did not overlap")
	}
	return bytes.NewReader(r.src).ReadAt(p, off)
}

// A prefetch over a source whose reads are slow fetches (layers this node
// lacks) reads several pieces at once.
func TestPrefetchReadsPiecesAtOnce(t *testing.T) {
	s := mount(t, Options{})
	src := randomBytes(8<<20, 6)
	g := &gatedReader{src: src, want: 2, open: make(chan struct{})}
	if _, err := s.Add("stack-6", g, int64(len(src))); err != nil {
		t.Fatal(err)
	}
	n, err := s.Prefetch("stack-6", []Range{{Off: 0, Len: 4 << 20}})
	if err != nil || n != 4<<20 {
		t.Fatalf("prefetch stored %d bytes (%v), want %d", n, err, 4<<20)
	}
	bad := &failingReader{src: src, badOff: 3 << 20, badLen: 4096}
	if _, err := s.Add("stack-7", bad, int64(len(src))); err != nil {
		t.Fatal(err)
	}
	n, err = s.Prefetch("stack-7", []Range{{Off: 0, Len: 8 << 20}})
	if err == nil || !strings.Contains(err.Error(), "chunk failed its digest") || n >= 8<<20 {
		t.Fatalf("prefetch over a failing piece: stored %d, err %v; want its error and not every byte", n, err)
	}
}

// TestStoreFromNeedsNoReads: bytes stored from another source (a
// working-set pack) are what the file reads at their offsets, with no FUSE
// read; copies off page boundaries or outside the file are refused.
func TestStoreFromNeedsNoReads(t *testing.T) {
	s := mount(t, Options{})
	src := randomBytes(8<<20, 9)
	p := add(t, s, "stack-9", src)
	// The pack: two ranges of the file, back to back after a header.
	pack := append([]byte("header--"), src[1<<20:3<<20]...)
	pack = append(pack, src[7<<20:8<<20]...)
	copies := []Copy{{Off: 1 << 20, Len: 2 << 20, From: 8}, {Off: 7 << 20, Len: 1 << 20, From: 8 + 2<<20}}
	n, err := s.StoreFrom("stack-9", bytes.NewReader(pack), copies)
	if err != nil || n != 3<<20 {
		t.Fatalf("StoreFrom: %d bytes, %v; want %d", n, err, 3<<20)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before := s.Stats().Reads
	for _, c := range copies {
		buf := make([]byte, c.Len)
		if _, err := f.ReadAt(buf, c.Off); err != nil || !bytes.Equal(buf, src[c.Off:c.Off+c.Len]) {
			t.Fatalf("stored range %+v reads wrong (%v)", c, err)
		}
	}
	if after := s.Stats().Reads; after != before {
		t.Fatalf("stored ranges took %d FUSE reads, want 0", after-before)
	}
	for _, bad := range []Copy{{Off: 100, Len: 4096}, {Off: 0, Len: 100}, {Off: 8 << 20, Len: 4096}, {Off: 0, Len: 4096, From: -1}, {Off: 0, Len: 0}} {
		if _, err := s.StoreFrom("stack-9", bytes.NewReader(pack), []Copy{bad}); err == nil {
			t.Errorf("copy %+v accepted", bad)
		}
	}
	if _, err := s.StoreFrom("stack-9", bytes.NewReader(pack[:100]), copies[:1]); err == nil {
		t.Error("a source shorter than its copy was stored")
	}
}
