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

// Copy is a range of an export (Off, Len) whose bytes are at From in some
// source.
type Copy struct{ Off, Len, From int64 }

// Prefetch pushes the given ranges of export name into the page cache
// (FUSE_NOTIFY_STORE), widened to whole pages and clipped to the file, and
// returns the bytes stored. Pages already cached are rewritten with the
// same bytes. The ranges are read from the export in pieces of at most
// maxRead, several at once; the first error ends it.
func (s *Server) Prefetch(name string, ranges []Range) (int64, error) {
	e, err := s.fs.lookupExport(name)
	if err != nil {
		return 0, err
	}
	pieces, err := prefetchPieces(e.size, ranges)
	if err != nil {
		return 0, fmt.Errorf("memfs: prefetch %q: %w", name, err)
	}
	return s.store(name, e, e.src, pieces)
}

// StoreFrom pushes bytes of src into the page cache of export name: for
// each copy, Len bytes of src at From as the export's bytes at Off. The
// caller vouches that they are the export's bytes (a working-set pack
// committed with the export's layers): they are not checked against it.
// Each copy starts on a page and ends on one or at the end of the file.
func (s *Server) StoreFrom(name string, src io.ReaderAt, copies []Copy) (int64, error) {
	e, err := s.fs.lookupExport(name)
	if err != nil {
		return 0, err
	}
	pieces, err := copyPieces(e.size, copies)
	if err != nil {
		return 0, fmt.Errorf("memfs: store into %q: %w", name, err)
	}
	return s.store(name, e, src, pieces)
}

// store pushes pieces read from src into e's page cache, several at once.
func (s *Server) store(name string, e *export, src io.ReaderAt, pieces []Copy) (int64, error) {
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
				n, err := s.storePiece(e, src, pieces[i], buf)
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
// into pieces of at most maxRead read from the export itself.
func prefetchPieces(size int64, ranges []Range) ([]Copy, error) {
	page := int64(os.Getpagesize())
	var out []Copy
	for _, r := range ranges {
		if r.Off < 0 || r.Len < 0 {
			return nil, fmt.Errorf("bad range %d+%d", r.Off, r.Len)
		}
		off, end := r.Off/page*page, min(size, (r.Off+r.Len+page-1)/page*page)
		for ; off < end; off += maxRead {
			out = append(out, Copy{Off: off, Len: min(end-off, maxRead), From: off})
		}
	}
	return out, nil
}

// copyPieces checks copies against an export of size bytes and cuts them
// into pieces of at most maxRead.
func copyPieces(size int64, copies []Copy) ([]Copy, error) {
	page := int64(os.Getpagesize())
	var out []Copy
	for _, c := range copies {
		if c.Off < 0 || c.Len <= 0 || c.From < 0 || c.Off > size-c.Len || c.From > 1<<62-c.Len ||
			c.Off%page != 0 || c.Len%page != 0 && c.Off+c.Len != size {
			return nil, fmt.Errorf("bad copy of %d bytes from %d to %d (a %d-byte file of %d-byte pages)", c.Len, c.From, c.Off, size, page)
		}
		for d := int64(0); d < c.Len; d += maxRead {
			out = append(out, Copy{Off: c.Off + d, Len: min(c.Len-d, maxRead), From: c.From + d})
		}
	}
	return out, nil
}

// storePiece reads piece p from src into buf and stores it in e's page
// cache, returning the bytes stored.
func (s *Server) storePiece(e *export, src io.ReaderAt, p Copy, buf []byte) (int64, error) {
	buf = buf[:p.Len]
	n, err := src.ReadAt(buf, p.From)
	if err != nil && !(errors.Is(err, io.EOF) && n == len(buf)) {
		return 0, err
	}
	if err := s.storeCache(e.node, p.Off, buf); err != nil {
		return 0, fmt.Errorf("notify store: %w", err)
	}
	s.fs.stored.Add(p.Len)
	return p.Len, nil
}
