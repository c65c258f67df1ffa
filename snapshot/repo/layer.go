package repo

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/storage/blob"
)

// PutLayerFile uploads a sealed layer file and its chunk table (chunkSize
// bytes a chunk; 0: blob.DefaultChunkSize) and returns the manifest entry
// naming both. The file is read twice: once for its digest and table, once
// for the upload, which checks the digest again, so a file that changed in
// between is refused rather than stored under a wrong name.
func PutLayerFile(ctx context.Context, r Repository, path string, chunkSize int64) (Layer, error) {
	if chunkSize == 0 {
		chunkSize = blob.DefaultChunkSize
	}
	f, err := os.Open(path)
	if err != nil {
		return Layer{}, fmt.Errorf("put layer %s: %w", path, err)
	}
	defer f.Close()
	tab, err := blob.BuildChunkTable(f, chunkSize)
	if err != nil {
		return Layer{}, fmt.Errorf("put layer %s: %w", path, err)
	}
	enc := tab.Encode()
	l := Layer{Blob: Blob{Digest: Digest(tab.LayerDigest()), Size: tab.Size}, Chunks: Blob{Digest: DigestOf(enc), Size: int64(len(enc))}}
	if err := r.PutBlob(ctx, l.Chunks.Digest, l.Chunks.Size, bytes.NewReader(enc)); err != nil {
		return Layer{}, fmt.Errorf("put layer %s: chunk table: %w", path, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Layer{}, fmt.Errorf("put layer %s: %w", path, err)
	}
	if err := r.PutBlob(ctx, l.Digest, l.Size, f); err != nil {
		return Layer{}, fmt.Errorf("put layer %s: %w", path, err)
	}
	return l, nil
}

// PutFile uploads a small file (VM state, config) as a blob.
func PutFile(ctx context.Context, r Repository, path string) (Blob, error) {
	f, err := os.Open(path)
	if err != nil {
		return Blob{}, fmt.Errorf("put file %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return Blob{}, fmt.Errorf("put file %s: %w", path, err)
	}
	b := Blob{Digest: FromHash(h.Sum(nil)), Size: n}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Blob{}, fmt.Errorf("put file %s: %w", path, err)
	}
	if err := r.PutBlob(ctx, b.Digest, b.Size, f); err != nil {
		return Blob{}, fmt.Errorf("put file %s: %w", path, err)
	}
	return b, nil
}

// ReadSmallBlob reads a whole blob of at most limit bytes and checks it
// against its digest (chunk tables, VM state and config come this way).
func ReadSmallBlob(ctx context.Context, r Repository, b Blob, limit int64) ([]byte, error) {
	if err := withinLimit(b, limit); err != nil {
		return nil, err
	}
	rc, err := r.ReadBlob(ctx, b.Digest, 0, -1)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, b.Size+1))
	if err != nil {
		return nil, fmt.Errorf("read blob %s: %w", b.Digest, err)
	}
	if int64(len(data)) != b.Size || DigestOf(data) != b.Digest {
		return nil, fmt.Errorf("read blob %s: the stored object (%d bytes) is not the blob: %w", b.Digest, len(data), ErrDigestMismatch)
	}
	return data, nil
}

// ReadChunkTable reads and checks a layer's chunk table: its own digest,
// then that it describes this layer.
func ReadChunkTable(ctx context.Context, r Repository, l Layer) (*blob.ChunkTable, error) {
	data, err := ReadSmallBlob(ctx, r, l.Chunks, blob.MaxChunkTableSize)
	if err != nil {
		return nil, fmt.Errorf("chunk table of layer %s: %w", l.Digest, err)
	}
	return checkTable(data, l)
}

func checkTable(data []byte, l Layer) (*blob.ChunkTable, error) {
	tab, err := blob.ParseChunkTable(data)
	if err != nil {
		return nil, fmt.Errorf("chunk table of layer %s: %w", l.Digest, err)
	}
	if Digest(tab.LayerDigest()) != l.Digest || tab.Size != l.Size {
		return nil, fmt.Errorf("chunk table %s describes layer %s (%d bytes), not %s (%d bytes): %w",
			l.Chunks.Digest, tab.LayerDigest(), tab.Size, l.Digest, l.Size, ErrDigestMismatch)
	}
	return tab, nil
}

// Source is a layer in the repository as a blob.Blob read with ranged
// requests. It is not verified by itself: it is one of the sources of a
// blob.Verified (OpenLayer).
type Source struct {
	ctx  context.Context
	r    Repository
	name string
	l    Blob
}

// NewSource returns the repository's copy of b; ctx bounds every read.
func NewSource(ctx context.Context, r Repository, b Blob) *Source {
	name := fmt.Sprint(r)
	return &Source{ctx: ctx, r: r, l: b, name: name + "/" + BlobKey(b.Digest)}
}

func (s *Source) Size() int64  { return s.l.Size }
func (s *Source) Name() string { return s.name }
func (s *Source) Close() error { return nil }

// ReadAt reads with one ranged request.
func (s *Source) ReadAt(p []byte, off int64) (int, error) {
	if off >= s.l.Size {
		return 0, io.EOF
	}
	want := min(int64(len(p)), s.l.Size-off)
	rc, err := s.r.ReadBlob(s.ctx, s.l.Digest, off, want)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	n, err := io.ReadFull(rc, p[:want])
	if err != nil {
		return n, fmt.Errorf("read blob %s [%d,+%d): %w", s.l.Digest, off, want, err)
	}
	// A longer answer than asked is another object than expected.
	var one [1]byte
	if k, _ := rc.Read(one[:]); k > 0 {
		return n, fmt.Errorf("read blob %s [%d,+%d): the store sent more bytes than asked", s.l.Digest, off, want)
	}
	if want < int64(len(p)) {
		return n, io.EOF
	}
	return n, nil
}

// LayerOptions tune OpenLayer.
type LayerOptions struct {
	// Before are sources tried before the repository (peers that hold the
	// layer, package peer); they are verified the same way.
	Before []blob.Blob
	// Cache sizes the block cache (its block size is the chunk size).
	Cache blob.CacheOptions
}

// OpenLayer opens layer l for lazy, verified reads: ranges are fetched on
// demand (from opt.Before, then the repository) through a block cache, and
// every chunk is checked against the layer's chunk table before it is
// cached or served. ctx bounds every later read.
func OpenLayer(ctx context.Context, r Repository, l Layer, opt LayerOptions) (*blob.Cache, error) {
	tab, err := ReadChunkTable(ctx, r, l)
	if err != nil && len(opt.Before) > 0 {
		// The store is down or its copy is damaged: a peer may have the table.
		if ptab, perr := tableFrom(opt.Before, l); perr == nil {
			tab, err = ptab, nil
		} else {
			err = errors.Join(err, perr)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open layer %s: %w", l.Digest, err)
	}
	sources := append(append([]blob.Blob{}, opt.Before...), NewSource(ctx, r, l.Blob))
	return blob.OpenVerified(tab, string(l.Digest), opt.Cache, sources...), nil
}

// TableSource is implemented by sources that can also give a layer's chunk
// table (a peer serving blobs by digest).
type TableSource interface {
	ChunkTable(l Layer) ([]byte, error)
}

func tableFrom(sources []blob.Blob, l Layer) (*blob.ChunkTable, error) {
	var errs []error
	for _, s := range sources {
		ts, ok := s.(TableSource)
		if !ok {
			continue
		}
		data, err := ts.ChunkTable(l)
		if err == nil && (int64(len(data)) != l.Chunks.Size || DigestOf(data) != l.Chunks.Digest) {
			err = fmt.Errorf("chunk table %s from %s: %w", l.Chunks.Digest, s.Name(), ErrDigestMismatch)
		}
		if err == nil {
			return checkTable(data, l)
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("chunk table of layer %s: no source has it: %w", l.Digest, errors.Join(errs...))
}

// CheckLayer reads all of layer l from the repository and checks every
// chunk against its table and the whole against its digest (a scrub: the
// error names the layer and the first bad chunk).
func CheckLayer(ctx context.Context, r Repository, l Layer) error {
	tab, err := ReadChunkTable(ctx, r, l)
	if err != nil {
		return fmt.Errorf("check layer %s: %w", l.Digest, err)
	}
	v := blob.NewVerified(tab, string(l.Digest), NewSource(ctx, r, l.Blob))
	h := sha256.New()
	buf := make([]byte, tab.ChunkSize*8)
	for off := int64(0); off < l.Size; off += int64(len(buf)) {
		n, err := v.ReadAt(buf[:min(int64(len(buf)), l.Size-off)], off)
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("check layer %s: %w", l.Digest, err)
		}
		h.Write(buf[:n])
	}
	if got := FromHash(h.Sum(nil)); got != l.Digest {
		return fmt.Errorf("check layer %s: its chunks verify but the whole is %s: %w", l.Digest, got, ErrDigestMismatch)
	}
	return nil
}

// FetchLayer copies layer l whole into path (atomically: the file appears
// complete or not at all), read through src (a layer opened with OpenLayer,
// so every chunk is verified), and checks the whole against its digest. A
// node keeps a hot layer local this way, and serves it to peers after.
func FetchLayer(ctx context.Context, src io.ReaderAt, l Layer, path string) error {
	f, err := atomicfile.Create(path, 0o600)
	if err != nil {
		return fmt.Errorf("fetch layer %s: %w", l.Digest, err)
	}
	defer f.Abort()
	h := sha256.New()
	buf := make([]byte, 4<<20)
	for off := int64(0); off < l.Size; off += int64(len(buf)) {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("fetch layer %s: %w", l.Digest, err)
		}
		n, err := src.ReadAt(buf[:min(int64(len(buf)), l.Size-off)], off)
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("fetch layer %s: %w", l.Digest, err)
		}
		h.Write(buf[:n])
		if _, err := f.Write(buf[:n]); err != nil {
			return fmt.Errorf("fetch layer %s: %w", l.Digest, err)
		}
	}
	if got := FromHash(h.Sum(nil)); got != l.Digest {
		return fmt.Errorf("fetch layer %s: the copy is %s: %w", l.Digest, got, ErrDigestMismatch)
	}
	if err := f.Commit(); err != nil {
		return fmt.Errorf("fetch layer %s: %w", l.Digest, err)
	}
	return nil
}

// withinLimit refuses a blob of more than limit bytes (or a negative size).
func withinLimit(b Blob, limit int64) error {
	if b.Size > limit || b.Size < 0 {
		return fmt.Errorf("read blob %s: %d bytes, more than the %d allowed: %w", b.Digest, b.Size, limit, ErrInvalid)
	}
	return nil
}

// ReadBlobParallel reads a whole blob of at most limit bytes as parts
// ranged reads at once (a large blob read before a VM may run: one stream
// of an object store is slower than a few) into one buffer allocated at
// its size, and checks it against its digest.
func ReadBlobParallel(ctx context.Context, r Repository, b Blob, limit int64, parts int) ([]byte, error) {
	if err := withinLimit(b, limit); err != nil {
		return nil, err
	}
	parts = max(parts, 1)
	data := make([]byte, b.Size)
	part := max((b.Size+int64(parts)-1)/int64(parts), 1)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, parts+1)
	for off := int64(0); off < b.Size; off += part {
		buf := data[off:min(off+part, b.Size)]
		wg.Go(func() {
			if err := readRange(ctx, r, b.Digest, off, buf); err != nil {
				errs <- err
				cancel() // the other parts stop
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, fmt.Errorf("read blob %s: %w", b.Digest, err)
	}
	if DigestOf(data) != b.Digest {
		return nil, fmt.Errorf("read blob %s: the stored object is not the blob: %w", b.Digest, ErrDigestMismatch)
	}
	return data, nil
}

// readRange fills buf with the bytes of blob d at off.
func readRange(ctx context.Context, r Repository, d Digest, off int64, buf []byte) error {
	rc, err := r.ReadBlob(ctx, d, off, int64(len(buf)))
	if err != nil {
		return err
	}
	defer rc.Close()
	if _, err := io.ReadFull(rc, buf); err != nil {
		return fmt.Errorf("range %d+%d: %w", off, len(buf), err)
	}
	return nil
}
