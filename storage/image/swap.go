package image

import (
	"fmt"
	"sync"

	"github.com/agentenv/agentenv/storage/blob"
)

// swapBlob is the source of a URL lower: the layer opened on it keeps its
// index while the bytes move to a local copy (SwapLower), so an export
// stops depending on the remote end without closing its image.
type swapBlob struct {
	mu sync.RWMutex
	b  blob.Blob
}

func (s *swapBlob) ReadAt(p []byte, off int64) (int, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.b.ReadAt(p, off)
}

func (s *swapBlob) Size() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.b.Size()
}

func (s *swapBlob) Name() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.b.Name()
}

func (s *swapBlob) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Close()
}

// swap makes b the source; reads in flight finish on the old one, which is
// then closed (a remote source's close releases only memory: its error
// changes nothing).
func (s *swapBlob) swap(b blob.Blob) {
	s.mu.Lock()
	old := s.b
	s.b = b
	s.mu.Unlock()
	_ = old.Close()
}

// RemoteLowers lists the URLs of the image's URL lowers that still read
// from their URL.
func (im *Image) RemoteLowers() []string {
	im.remoteMu.Lock()
	defer im.remoteMu.Unlock()
	var out []string
	for u := range im.remote {
		out = append(out, u)
	}
	return out
}

// SwapLower moves every lower read from url onto local, a file that holds
// the same bytes (the caller checked its digest: this only checks the
// size). Reads in flight finish on the URL; later ones read the file. The
// image takes local over (Close closes it) and it returns how many lowers
// moved; 0 leaves local to the caller.
func (im *Image) SwapLower(url string, local blob.Blob) (int, error) {
	if im.closed.Load() {
		return 0, ErrClosed
	}
	im.remoteMu.Lock()
	defer im.remoteMu.Unlock()
	sbs := im.remote[url]
	if len(sbs) == 0 {
		return 0, nil
	}
	if sbs[0].Size() != local.Size() {
		return 0, fmt.Errorf("swap lower %s of %s: the local copy %s is %d bytes, the layer %d", url, im.name, local.Name(), local.Size(), sbs[0].Size())
	}
	for i, sb := range sbs {
		b := local
		if i > 0 {
			// One source per lower: each closes its own.
			nb, err := blob.OpenLocal(local.Name(), true)
			if err != nil {
				return i, fmt.Errorf("swap lower %s of %s: %w", url, im.name, err)
			}
			b = nb
		}
		sb.swap(b)
	}
	delete(im.remote, url)
	return len(sbs), nil
}
