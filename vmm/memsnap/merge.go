package memsnap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/agentenv/agentenv/storage/lsmt"
)

// Merge writes one sealed memory layer at out equivalent to the stack of
// sealed layers (bottom to top), for compacting a long chain: stacking it
// where the merged layers were gives the same memory. Its parent is the
// bottom layer's parent and it gets a fresh UUID (a later diff captured on
// top of the old top layer names that layer as its parent; Materialize does
// not check parents). Pages are classified like a capture's: non-zero pages
// are data, zero pages and zeroed extents are zeroed extents (always kept:
// a layer cannot tell whether anything will lie below it). The layer is
// written atomically (internal/atomicfile). The merged layer's size is the top
// merged layer's: a chain's layers all have the guest RAM's size, and a
// lower layer's mappings past a smaller top are cut.
func Merge(ctx context.Context, layers []string, out, message string) (Stats, error) {
	start := time.Now()
	st, err := merge(ctx, layers, out, message)
	if err != nil {
		return st, fmt.Errorf("merge %d memory layers into %s: %w", len(layers), out, err)
	}
	st.Took = time.Since(start)
	slog.Debug("memsnap: merged memory layers", "layers", len(layers), "out", out, "pages", st.Pages,
		"zero_pages", st.ZeroPages, "bytes", st.Bytes, "took", st.Took)
	return st, nil
}

func merge(ctx context.Context, paths []string, out, message string) (Stats, error) {
	var st Stats
	stack, err := openStack(paths)
	if err != nil {
		return st, err
	}
	defer stack.Close()
	lowers := stack.Lowers()
	parent := lowers[0].ParentUUID()
	opt := lsmt.SealOptions{VirtualSize: uint64(stack.Size()), Parent: parent, Message: message}
	err = writeLayer(out, opt, &st, func(xw *lsmt.ExtentWriter) error {
		m := &merger{xw: xw, st: &st, buf: make([]byte, readBatch)}
		return m.run(ctx, stack)
	})
	return st, err
}

// openStack opens sealed layer files (bottom first) as a stack that owns them.
func openStack(paths []string) (*lsmt.Stack, error) {
	if len(paths) == 0 {
		return nil, errors.New("no layers")
	}
	if len(paths) > lsmt.MaxLayers {
		return nil, fmt.Errorf("%d layers exceed the stack limit of %d", len(paths), lsmt.MaxLayers)
	}
	layers := make([]*lsmt.Layer, 0, len(paths))
	closeAll := func() {
		for _, l := range layers {
			l.Close()
		}
	}
	for _, p := range paths {
		l, err := lsmt.OpenLayerFile(p)
		if err != nil {
			closeAll()
			return nil, err
		}
		layers = append(layers, l)
	}
	// Memory stacks are re-parented on purpose: Merge compacts runs in the
	// middle of a chain, whose layers above keep their old parent UUID.
	st, err := lsmt.NewStackWith(layers, nil, lsmt.StackOptions{AllowReparent: true})
	if err != nil {
		closeAll()
		return nil, err
	}
	return st, nil
}

// merger copies a stack's merged index into an ExtentWriter.
type merger struct {
	xw  *lsmt.ExtentWriter
	st  *Stats
	buf []byte
}

func (m *merger) run(ctx context.Context, stack *lsmt.Stack) error {
	return eachWindow(ctx, stack, m.buf, func(w *window, segs []lsmt.Segment, w0, w1 int64) error {
		for _, s := range segs {
			a, b := pieceSpan(s, w1)
			if a >= b {
				continue
			}
			var err error
			if s.Zeroed {
				err = m.zero(a, b-a)
			} else {
				err = m.data(w.buf[a-w0:b-w0], a)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// zero records n zero bytes at off as a zeroed extent.
func (m *merger) zero(off, n int64) error {
	m.st.ZeroPages += (n + psz() - 1) / psz()
	return m.xw.WriteZeroed(off, n)
}

// data writes b (at logical offset off, both sector-aligned) split at page
// boundaries into runs of non-zero pieces (data) and zero pieces (zero).
func (m *merger) data(b []byte, off int64) error {
	pieceEnd := func(p int64) int64 { return min((off+p)/psz()*psz()+psz()-off, int64(len(b))) }
	for p := int64(0); p < int64(len(b)); {
		q := pieceEnd(p)
		zero := isZero(b[p:q])
		for q < int64(len(b)) && isZero(b[q:pieceEnd(q)]) == zero {
			q = pieceEnd(q)
		}
		if zero {
			if err := m.zero(off+p, q-p); err != nil {
				return err
			}
		} else {
			if err := m.xw.WriteData(off+p, b[p:q]); err != nil {
				return err
			}
			m.st.Pages += (q - p + psz() - 1) / psz()
		}
		p = q
	}
	return nil
}

func psz() int64 { return int64(pageSize) }
