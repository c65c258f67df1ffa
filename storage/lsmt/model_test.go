package lsmt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/storage/blob"
	"github.com/agentenv/agentenv/storage/zfile"
	"pgregory.net/rapid"
)

// The property test drives stacks through random writes, trims, reads,
// flushes (after which trimmed space is reused), commits, merges,
// compressions, reopenings and arbitrary stack orders, and checks every
// read against a plain in-memory model, and the upper's space sets after
// every step.

const modelSize = 64 << 10 // 128 sectors: small enough for many steps, large enough for splits

type layerModel struct {
	path    string
	sectors map[uint64][]byte // sector -> 512 bytes this layer maps
}

type machine struct {
	t      *rapid.T
	dir    string
	n      int
	layers []layerModel // every sealed layer made so far
	stack  []int        // lowers of the live stack, bottom first (indices into layers)
	upper  *Upper
	sparse bool // the live upper is sparse (4 KiB write granularity)
	upMod  map[uint64][]byte
	st     *Stack
	flat   []byte // the expected virtual disk
	// reparented: a middle run was merged, so the lowers no longer chain.
	reparented bool
}

func (m *machine) file(ext string) string {
	m.n++
	return filepath.Join(m.dir, fmt.Sprintf("f%d.%s", m.n, ext))
}

func overlayModels(models ...map[uint64][]byte) []byte {
	out := make([]byte, modelSize)
	for _, mod := range models {
		for s, d := range mod {
			copy(out[s*SectorSize:], d)
		}
	}
	return out
}

func (m *machine) openLowers(idx []int) []*Layer {
	var ls []*Layer
	for _, i := range idx {
		l, err := m.openLayer(m.layers[i].path)
		if err != nil {
			m.t.Fatalf("open %s: %v", m.layers[i].path, err)
		}
		ls = append(ls, l)
	}
	return ls
}

// openLayer opens a layer file as a plain *os.File, or through storage/blob
// (pread with vectored reads, or a mapping), so every read path is covered.
func (m *machine) openLayer(path string) (*Layer, error) {
	switch rapid.IntRange(0, 2).Draw(m.t, "source") {
	case 1, 2:
		b, err := blob.OpenLocal(path, rapid.Bool().Draw(m.t, "mmap"))
		if err != nil {
			return nil, err
		}
		l, err := OpenLayerAt(path, b, b.Size())
		if err != nil {
			b.Close()
			return nil, err
		}
		l.SetCloser(b)
		return l, nil
	}
	return OpenLayerFile(path)
}

// rebuild reopens the live stack's lowers around the current upper.
func (m *machine) rebuild() {
	if m.st != nil {
		for _, l := range m.st.Lowers() {
			l.Close()
		}
	}
	st, err := NewStackWith(m.openLowers(m.stack), m.upper, StackOptions{AllowReparent: m.reparented})
	if err != nil {
		m.t.Fatal(err)
	}
	m.st = st
}

func (m *machine) newUpper() {
	m.sparse = rapid.Bool().Draw(m.t, "sparse")
	var u *Upper
	var err error
	if m.sparse {
		u, err = CreateSparseUpper(m.file("sparse"), modelSize, UUID{})
	} else {
		u, err = CreateUpper(m.file("data"), m.file("index"), modelSize, UUID{})
	}
	if err != nil {
		m.t.Fatal(err)
	}
	m.upper, m.upMod = u, map[uint64][]byte{}
	m.tuneUpper()
}

// tuneUpper lets a log-structured upper rewrite its index as soon as it
// holds four entries per live mapping, and reclaim freed space when its
// data passes the disk's size by little, so the model sees both.
func (m *machine) tuneUpper() {
	m.upper.rewriteMin = int64(rapid.IntRange(0, 64).Draw(m.t, "rewriteMin"))
	m.upper.slack = uint64(rapid.IntRange(0, 64).Draw(m.t, "slack"))
}

// record copies the touched sectors' final content into the upper's model;
// a sparse upper writes whole 4 KiB blocks.
func (m *machine) record(off, n int) {
	a := SectorSize
	if m.sparse {
		a = 4096
	}
	off, end := off/a*a, (off+n+a-1)/a*a
	for s := off / SectorSize; s < end/SectorSize; s++ {
		m.upMod[uint64(s)] = bytes.Clone(m.flat[s*SectorSize : (s+1)*SectorSize])
	}
}

func drawRange(t *rapid.T) (int, int) {
	off := rapid.IntRange(0, modelSize-1).Draw(t, "off")
	if rapid.Bool().Draw(t, "aligned") {
		off &^= SectorSize - 1
	}
	n := rapid.IntRange(1, min(modelSize-off, 9000)).Draw(t, "n")
	return off, n
}

func (m *machine) write(t *rapid.T) {
	off, n := drawRange(t)
	seed := rapid.Uint64().Draw(t, "seed")
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 0))
	for i := range b {
		b[i] = byte(r.Uint32() | 1) // never all zero
	}
	if _, err := m.st.WriteAt(b, int64(off)); err != nil {
		t.Fatalf("write [%d,+%d): %v", off, n, err)
	}
	copy(m.flat[off:], b)
	m.record(off, n)
}

func (m *machine) trim(t *rapid.T) {
	off, n := drawRange(t)
	if err := m.st.Trim(int64(off), int64(n)); err != nil {
		t.Fatalf("trim [%d,+%d): %v", off, n, err)
	}
	clear(m.flat[off : off+n])
	m.record(off, n)
}

func (m *machine) read(t *rapid.T) {
	off, n := drawRange(t)
	got := make([]byte, n)
	if _, err := m.st.ReadAt(got, int64(off)); err != nil {
		t.Fatalf("read [%d,+%d): %v", off, n, err)
	}
	if i := firstDiff(got, m.flat[off:off+n]); i < n {
		t.Fatalf("read [%d,+%d) differs from the model at byte %d", off, n, off+i)
	}
}

func (m *machine) commit(t *rapid.T) {
	if len(m.stack) >= 8 {
		t.Skip("stack deep enough")
	}
	path := m.file("lsmt")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.st.Commit(context.Background(), f, "c")
	f.Close()
	if err != nil {
		t.Fatalf("commit: %v", err)
	}
	if res.Trailer.UUID.IsNil() || res.Trailer.UUID == m.upper.UUID() {
		t.Fatalf("committed uuid %s (upper %s): want a fresh one", res.Trailer.UUID, m.upper.UUID())
	}
	if len(m.stack) > 0 && res.Trailer.ParentUUID != m.st.Lowers()[len(m.stack)-1].UUID() {
		t.Fatalf("committed parent %s is not the top lower", res.Trailer.ParentUUID)
	}
	m.layers = append(m.layers, layerModel{path: path, sectors: m.upMod})
	m.stack = append(m.stack, len(m.layers)-1)
	m.upper.Close()
	m.newUpper()
	m.rebuild()
}

func (m *machine) merge(t *rapid.T) {
	if len(m.stack) < 2 {
		t.Skip("nothing to merge")
	}
	i := rapid.IntRange(0, len(m.stack)-2).Draw(t, "i")
	j := rapid.IntRange(i+2, len(m.stack)).Draw(t, "j")
	ls := m.openLowers(m.stack[i:j])
	path := m.file("lsmt")
	f, _ := os.Create(path)
	_, err := MergeWith(context.Background(), ls, f, "m", StackOptions{AllowReparent: m.reparented})
	f.Close()
	for _, l := range ls {
		l.Close()
	}
	if err != nil {
		t.Fatalf("merge: %v", err)
	}
	mod := map[uint64][]byte{}
	for _, k := range m.stack[i:j] {
		maps.Copy(mod, m.layers[k].sectors)
	}
	m.layers = append(m.layers, layerModel{path: path, sectors: mod})
	above := j < len(m.stack)
	m.stack = append(append(append([]int{}, m.stack[:i]...), len(m.layers)-1), m.stack[j:]...)
	if above && !m.reparented {
		// The layer above the merged run names the run's old top as its
		// parent, not the merged layer (which has a fresh UUID): the
		// default stack refuses it, a re-parenting tool says so.
		ls := m.openLowers(m.stack)
		if _, err := NewStack(ls, nil); !errors.Is(err, ErrParentMismatch) {
			t.Fatalf("a stack over a merged middle run opened without a parent mismatch: %v", err)
		}
		for _, l := range ls {
			l.Close()
		}
		m.reparented = true
	}
	m.rebuild()
}

func (m *machine) compress(t *rapid.T) {
	if len(m.stack) == 0 {
		t.Skip("no lower")
	}
	k := rapid.IntRange(0, len(m.stack)-1).Draw(t, "k")
	src := m.layers[m.stack[k]]
	if filepath.Ext(src.path) == ".zfile" {
		t.Skip("already compressed")
	}
	in, err := os.Open(src.path)
	if err != nil {
		t.Fatal(err)
	}
	path := m.file("zfile")
	out, _ := os.Create(path)
	opt := zfile.Options{BlockSize: 4096 << rapid.IntRange(0, 4).Draw(t, "bs")}
	if rapid.Bool().Draw(t, "lz4") {
		opt.Algorithm = zfile.AlgoLZ4
	}
	_, err = zfile.Compress(context.Background(), out, in, opt)
	in.Close()
	out.Close()
	if err != nil {
		t.Fatal(err)
	}
	m.layers = append(m.layers, layerModel{path: path, sectors: src.sectors})
	m.stack[k] = len(m.layers) - 1
	m.rebuild()
}

func (m *machine) reopen(t *rapid.T) {
	if err := m.upper.Close(); err != nil {
		t.Fatal(err)
	}
	d, i := m.upper.Paths()
	u, err := OpenUpper(d, i, false)
	if err != nil {
		t.Fatalf("reopen upper: %v", err)
	}
	m.upper = u
	m.tuneUpper()
	m.rebuild()
}

// flush makes the upper durable; the space its trims freed becomes
// reusable, so later writes land where trimmed data was.
func (m *machine) flush(t *rapid.T) {
	if err := m.st.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
}

// order opens any sequence of sealed layers as a stack and compares it with
// the overlay of their models.
func (m *machine) order(t *rapid.T) {
	if len(m.layers) == 0 {
		t.Skip("no layers")
	}
	idx := rapid.SliceOfN(rapid.IntRange(0, len(m.layers)-1), 1, 5).Draw(t, "order")
	// Any order, chained or not: this checks the overlay, not the parents.
	st, err := NewStackWith(m.openLowers(idx), nil, StackOptions{AllowReparent: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var mods []map[uint64][]byte
	for _, k := range idx {
		mods = append(mods, m.layers[k].sectors)
	}
	want := overlayModels(mods...)
	got := make([]byte, modelSize)
	if _, err := st.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got, want); i < modelSize {
		t.Fatalf("stack %v differs from the model at byte %d", idx, i)
	}
}

func (m *machine) checkAll(t *rapid.T) {
	got := make([]byte, modelSize)
	if _, err := m.st.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got, m.flat); i < modelSize {
		t.Fatalf("virtual disk differs from the model at byte %d", i)
	}
	if !m.sparse {
		if err := m.upper.checkSpace(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestStackAgainstModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		dir, err := os.MkdirTemp(tmpBase(), "lsmt-model-")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(dir)
		m := &machine{t: rt, dir: dir, flat: make([]byte, modelSize)}
		m.newUpper()
		m.rebuild()
		defer func() { m.st.Close() }()
		rt.Repeat(map[string]func(*rapid.T){
			"write":    m.write,
			"trim":     m.trim,
			"read":     m.read,
			"commit":   m.commit,
			"merge":    m.merge,
			"compress": m.compress,
			"reopen":   m.reopen,
			"flush":    m.flush,
			"order":    m.order,
			"":         m.checkAll,
		})
	})
}

// tmpBase prefers tmpfs, where the many fsyncs of commits are free.
func tmpBase() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if f, err := os.CreateTemp("/dev/shm", "probe-"); err == nil {
			f.Close()
			os.Remove(f.Name())
			return "/dev/shm"
		}
	}
	return ""
}

// TestIndexLookupAgainstScan: the two-level search finds exactly what a
// linear scan finds, for indexes around the run size.
func TestIndexLookupAgainstScan(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 300).Draw(t, "n")
		var segs []Segment
		off := uint64(0)
		for range n {
			off += uint64(rapid.IntRange(0, 5).Draw(t, "gap"))
			l := uint32(rapid.IntRange(1, 6).Draw(t, "len"))
			segs = append(segs, Segment{Offset: off, Length: l, MOffset: off + 100})
			off += uint64(l)
		}
		x := NewIndex(segs)
		q := uint64(rapid.IntRange(0, int(off)+10).Draw(t, "q"))
		l := uint64(rapid.IntRange(1, 40).Draw(t, "ql"))
		var want []Segment
		for _, s := range segs {
			if s.Offset < q+l && s.End() > q {
				want = append(want, s.Clip(q, q+l))
			}
		}
		if got := x.Lookup(nil, q, l); !equalSegs(got, want) {
			t.Fatalf("lookup [%d,+%d): %+v, want %+v", q, l, got, want)
		}
	})
}
