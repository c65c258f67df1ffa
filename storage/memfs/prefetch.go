package memfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
)

// prefetchWorkers is how many pieces of a Prefetch are read at once: an
// export over layers this node lacks reads each piece from a peer or the
// store, and those reads overlap well; over local files they cost little
// more than one.
const prefetchWorkers = 4

// Prefetch pushes the given ranges of export name into the page cache
// (FUSE_NOTIFY_STORE), widened to whole pages and clipped to the file, and
// returns the bytes stored. Pages already cached are rewritten with the
// same bytes. The ranges are read in pieces of at most maxRead, several at
// once; the first error ends it.
func (s *Server) Prefetch(name string, ranges []Range) (int64, error) {
	e, err := s.fs.lookupExport(name)
	if err != nil {
		return 0, err
	}
	pieces, err := prefetchPieces(e.size, ranges)
	if err != nil {
		return 0, fmt.Errorf("memfs: prefetch %q: %w", name, err)
	}
	// The kernel stores pages only into an inode it knows: look it up.
	if _, err := os.Stat(s.Path(name)); err != nil {
		return 0, fmt.Errorf("memfs: prefetch %q: %w", name, err)
	}
	var (
		stored atomic.Int64
		next   atomic.Int64
		mu     sync.Mutex
		first  error // guarded by mu
		wg     sync.WaitGroup
	)
	for range min(prefetchWorkers, len(pieces)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, maxRead)
			for i := next.Add(1) - 1; i < int64(len(pieces)); i = next.Add(1) - 1 {
				n, err := s.storePiece(e, pieces[i], buf)
				stored.Add(n)
				if err != nil {
					mu.Lock()
					first = firstErr(first, fmt.Errorf("memfs: prefetch %q at %d: %w", name, pieces[i].Off, err))
					mu.Unlock()
					next.Store(int64(len(pieces))) // the others stop after their piece
					return
				}
			}
		}()
	}
	wg.Wait()
	return stored.Load(), first
}

// firstErr keeps the first error.
func firstErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// prefetchPieces cuts ranges, widened to whole pages and clipped to size,
// into pieces of at most maxRead.
func prefetchPieces(size int64, ranges []Range) ([]Range, error) {
	page := int64(os.Getpagesize())
	var out []Range
	for _, r := range ranges {
		if r.Off < 0 || r.Len < 0 {
			return nil, fmt.Errorf("bad range %d+%d", r.Off, r.Len)
		}
		off, end := r.Off/page*page, min(size, (r.Off+r.Len+page-1)/page*page)
		for ; off < end; off += maxRead {
			out = append(out, Range{Off: off, Len: min(end-off, maxRead)})
		}
	}
	return out, nil
}

// storePiece reads piece p of export e into buf and stores it in the page
// cache, returning the bytes stored.
func (s *Server) storePiece(e *export, p Range, buf []byte) (int64, error) {
	buf = buf[:p.Len]
	if _, err := e.src.ReadAt(buf, p.Off); err != nil && !(errors.Is(err, io.EOF) && p.Off+p.Len == e.size) {
		return 0, err
	}
	if err := s.storeCache(e.node, p.Off, buf); err != nil {
		return 0, fmt.Errorf("notify store: %w", err)
	}
	s.fs.stored.Add(p.Len)
	return p.Len, nil
}
