// Package image owns the stacked image: an image config (sealed lower layers,
// bottom to top, plus an optional writable upper) opened into one virtual disk
// with ReadAt/WriteAt/Trim/Flush and Commit (seal the upper into a new sealed
// layer). It is the API that block exports (NBD, ublk) and the storage daemon
// build on; the formats live in storage/lsmt and storage/zfile, the byte
// sources in storage/blob.
//
// An Image is safe for concurrent use. Reads and writes need not be aligned;
// unaligned writes are widened with read-modify-write (block devices send
// aligned I/O, so this is the rare path).
package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/storage/blob"
	"github.com/agentenv/agentenv/storage/lsmt"
	"github.com/agentenv/agentenv/storage/zfile"
)

// ErrReadOnly is returned by writes to an image without an upper layer.
var ErrReadOnly = lsmt.ErrReadOnly

// ErrClosed is returned after Close.
var ErrClosed = errors.New("image: closed")

// Options for Open.
type Options struct {
	// HTTP configures lowers given by URL (headers such as a registry token).
	HTTP blob.HTTPOptions
	// ReadOnly opens the upper (if any) without writing to it.
	ReadOnly bool
	// NoMmap reads local lower layers with pread instead of a memory mapping.
	NoMmap bool
	// AllowReparent opens lowers whose parent UUIDs do not chain (each
	// layer's parent is normally the UUID of the layer below), for tools
	// that re-parent layers on purpose.
	AllowReparent bool
}

// Image is an opened stacked image.
type Image struct {
	name     string
	st       *lsmt.Stack
	blobs    []blob.Blob
	remoteMu sync.Mutex
	remote   map[string][]*swapBlob // URL lowers by their URL (SwapLower)
	readOnly bool
	closed   atomic.Bool
}

// Open opens the image described by the config file at path.
func Open(ctx context.Context, path string, opt Options) (*Image, error) {
	cfg, err := LoadConfig(path)
	if err != nil {
		return nil, err
	}
	im, err := OpenConfig(ctx, cfg, filepath.Dir(path), opt)
	if err != nil {
		return nil, fmt.Errorf("open image %s: %w", path, err)
	}
	im.name = path
	return im, nil
}

// OpenConfig opens cfg; relative paths are resolved against dir.
func OpenConfig(ctx context.Context, cfg *Config, dir string, opt Options) (*Image, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	im, lowers, err := openLowers(ctx, cfg, dir, opt)
	if err != nil {
		return nil, err
	}
	var upper *lsmt.Upper
	if u := cfg.Upper; u != nil {
		upper, err = lsmt.OpenUpper(resolve(dir, u.Data), resolve(dir, u.Index), opt.ReadOnly)
		if err != nil {
			return nil, im.closeLowers(lowers, err)
		}
	}
	st, err := lsmt.NewStackWith(lowers, upper, lsmt.StackOptions{AllowReparent: opt.AllowReparent})
	if err != nil {
		if upper != nil {
			upper.Close()
		}
		return nil, im.closeLowers(lowers, err)
	}
	im.st = st
	return im, nil
}

// openLowers opens cfg's lower layers, bottom first, into a new image that
// has no stack yet.
func openLowers(ctx context.Context, cfg *Config, dir string, opt Options) (*Image, []*lsmt.Layer, error) {
	im := &Image{name: "image", readOnly: opt.ReadOnly || cfg.Upper == nil, remote: map[string][]*swapBlob{}}
	var lowers []*lsmt.Layer
	for i, ref := range cfg.Lowers {
		src := ref.File
		if src == "" {
			src = ref.URL
		}
		src = resolve(dir, src)
		b, err := im.openLower(ctx, src, opt)
		if err != nil {
			return nil, nil, im.closeLowers(lowers, fmt.Errorf("lowers[%d]: %w", i, err))
		}
		l, err := lsmt.OpenLayerAt(src, b, b.Size())
		if err != nil {
			return nil, nil, im.closeLowers(lowers, fmt.Errorf("lowers[%d]: %w", i, err))
		}
		lowers = append(lowers, l)
	}
	return im, lowers, nil
}

// closeLowers closes what openLowers opened and returns err.
func (im *Image) closeLowers(lowers []*lsmt.Layer, err error) error {
	for _, l := range lowers {
		l.Close()
	}
	for _, b := range im.blobs {
		b.Close()
	}
	return err
}

// openLower opens one lower's bytes; a URL lower's source can be swapped
// later (SwapLower).
func (im *Image) openLower(ctx context.Context, src string, opt Options) (blob.Blob, error) {
	if !blob.IsURL(src) {
		b, err := blob.OpenLocal(src, !opt.NoMmap)
		if err == nil {
			im.blobs = append(im.blobs, b)
		}
		return b, err
	}
	b, err := blob.Open(ctx, src, opt.HTTP)
	if err != nil {
		return nil, err
	}
	sb := &swapBlob{b: b}
	im.blobs = append(im.blobs, sb)
	im.remote[src] = append(im.remote[src], sb)
	return sb, nil
}

// OpenLayers opens sealed layer files (bottom first) as a read-only image.
func OpenLayers(ctx context.Context, paths []string, opt Options) (*Image, error) {
	cfg := &Config{}
	for _, p := range paths {
		if blob.IsURL(p) {
			cfg.Lowers = append(cfg.Lowers, LayerRef{URL: p})
		} else {
			cfg.Lowers = append(cfg.Lowers, LayerRef{File: p})
		}
	}
	return OpenConfig(ctx, cfg, ".", opt)
}

// Name is the config path (or "image").
func (im *Image) Name() string { return im.name }

// Size is the virtual disk size in bytes.
func (im *Image) Size() int64 { return im.st.Size() }

// ReadOnly reports whether writes are refused.
func (im *Image) ReadOnly() bool { return im.readOnly }

// Written says whether anything was ever written to the upper (false for
// an image without one): an unwritten image reads exactly as its lowers.
func (im *Image) Written() bool {
	u := im.st.Upper()
	return u != nil && u.Written()
}

// Stack exposes the underlying layers for tools (info, check).
func (im *Image) Stack() *lsmt.Stack { return im.st }

// ReadAt reads the virtual disk; ranges no layer maps read as zeros.
func (im *Image) ReadAt(p []byte, off int64) (int, error) {
	if im.closed.Load() {
		return 0, ErrClosed
	}
	return im.st.ReadAt(p, off)
}

// WriteAt writes to the upper layer.
func (im *Image) WriteAt(p []byte, off int64) (int, error) {
	if err := im.writable("write"); err != nil {
		return 0, err
	}
	n, err := im.st.WriteAt(p, off)
	if err != nil {
		return n, fmt.Errorf("write %s: %w", im.name, err)
	}
	return n, nil
}

// Trim makes [off, off+length) read as zeros (NBD TRIM and WRITE_ZEROES both
// map here). Whole sectors become zeroed mappings that take no data space.
func (im *Image) Trim(off, length int64) error {
	if err := im.writable("trim"); err != nil {
		return err
	}
	if err := im.st.Trim(off, length); err != nil {
		return fmt.Errorf("trim %s: %w", im.name, err)
	}
	return nil
}

// WriteZeroes is Trim under the name NBD uses.
func (im *Image) WriteZeroes(off, length int64) error { return im.Trim(off, length) }

func (im *Image) writable(op string) error {
	if im.closed.Load() {
		return ErrClosed
	}
	if im.readOnly {
		return fmt.Errorf("%s %s: %w", op, im.name, ErrReadOnly)
	}
	return nil
}

// Flush makes every completed write durable.
func (im *Image) Flush() error {
	if im.closed.Load() {
		return ErrClosed
	}
	if im.readOnly {
		return nil
	}
	if err := im.st.Flush(); err != nil {
		return fmt.Errorf("flush %s: %w", im.name, err)
	}
	return nil
}

// CommitOptions describe a commit.
type CommitOptions struct {
	Message string
	// Compress stores the new layer as a ZFile with these options.
	Compress *zfile.Options
}

// LayerInfo describes a written sealed layer.
type LayerInfo struct {
	Path       string
	UUID       lsmt.UUID
	ParentUUID lsmt.UUID
	Size       int64 // bytes of the file
	Segments   int
	DataSize   int64
}

// Commit seals the upper's contents into a new sealed layer file at path
// (written to a temporary name, synced, then renamed), whose parent is the top
// lower. Writes racing with Commit may or may not be included; quiesce first.
// The image keeps using its upper; a caller that wants to continue on top of
// the new layer creates a new config with Create.
func (im *Image) Commit(ctx context.Context, path string, opt CommitOptions) (LayerInfo, error) {
	if im.closed.Load() {
		return LayerInfo{}, ErrClosed
	}
	if im.st.Upper() == nil {
		return LayerInfo{}, fmt.Errorf("commit %s: the image has no upper layer", im.name)
	}
	res, err := writeAtomic(path, opt.Compress, func(w io.Writer) (lsmt.SealResult, error) {
		return im.st.Commit(ctx, w, opt.Message)
	})
	if err != nil {
		return LayerInfo{}, fmt.Errorf("commit %s to %s: %w", im.name, path, err)
	}
	return res, nil
}

// Merge writes one sealed layer equivalent to the given sealed layers
// (bottom first) to path, optionally compressed.
func Merge(ctx context.Context, layers []string, path string, opt CommitOptions) (LayerInfo, error) {
	im, err := OpenLayers(ctx, layers, Options{})
	if err != nil {
		return LayerInfo{}, fmt.Errorf("merge: %w", err)
	}
	defer im.Close()
	res, err := writeAtomic(path, opt.Compress, func(w io.Writer) (lsmt.SealResult, error) {
		return lsmt.Merge(ctx, im.st.Lowers(), w, opt.Message)
	})
	if err != nil {
		return LayerInfo{}, fmt.Errorf("merge into %s: %w", path, err)
	}
	return res, nil
}

// writeAtomic writes a layer at path through internal/atomicfile (a
// temporary file, fsynced, renamed, directory fsynced; through a plain
// temporary when compressing), so a config that names it never names a
// partial layer, even after a power loss.
func writeAtomic(path string, comp *zfile.Options, write func(io.Writer) (lsmt.SealResult, error)) (LayerInfo, error) {
	var res lsmt.SealResult
	err := atomicfile.Write(path, 0o600, func(f io.Writer) error {
		var err error
		if comp == nil {
			res, err = write(f)
			return err
		}
		raw, err := os.CreateTemp(filepath.Dir(path), ".seal-*")
		if err != nil {
			return err
		}
		defer os.Remove(raw.Name())
		defer raw.Close()
		if res, err = write(raw); err != nil {
			return err
		}
		if _, err := raw.Seek(0, io.SeekStart); err != nil {
			return err
		}
		_, err = zfile.Compress(context.Background(), f, raw, *comp) // f is the temporary *os.File: the header is rewritten in place
		return err
	})
	if err != nil {
		return LayerInfo{}, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return LayerInfo{}, err
	}
	return LayerInfo{Path: path, UUID: res.Trailer.UUID, ParentUUID: res.Trailer.ParentUUID,
		Size: st.Size(), Segments: res.Segments, DataSize: res.DataSize}, nil
}

// Close flushes and closes every layer.
func (im *Image) Close() error {
	if im.closed.Swap(true) {
		return nil
	}
	err := im.st.Close()
	for _, b := range im.blobs {
		if cerr := b.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// CreateSpec describes a new image for Create.
type CreateSpec struct {
	// Lowers are sealed layer files or URLs, bottom first (may be empty).
	Lowers []string
	// Size is the virtual size in bytes (a multiple of 512); 0 takes the top lower's.
	Size int64
	// Sparse makes a sparse upper (one file) instead of data + index files.
	Sparse bool
	// UpperData and UpperIndex name the upper's files; empty: derived from the
	// config path (CONFIG.upper.data / CONFIG.upper.index).
	UpperData, UpperIndex string
	// NoUpper creates a read-only image config.
	NoUpper bool
}

// topLower checks that cfg's lowers form a chain and returns the top one's
// header (closed: only its size and identity are read). Their indexes are
// not merged: a stack of a large template would spend most of a restack on
// that.
func topLower(ctx context.Context, cfg *Config, dir string) (*lsmt.Layer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	im, lowers, err := openLowers(ctx, cfg, dir, Options{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	err = lsmt.CheckParents(lowers)
	top := lowers[len(lowers)-1]
	return top, im.closeLowers(lowers, err)
}

// Create writes a new image config at path with a fresh upper layer on top of
// the given lowers, and returns the config. Paths inside it are kept as given.
func Create(ctx context.Context, path string, spec CreateSpec) (*Config, error) {
	cfg := &Config{}
	for _, l := range spec.Lowers {
		if blob.IsURL(l) {
			cfg.Lowers = append(cfg.Lowers, LayerRef{URL: l})
		} else {
			cfg.Lowers = append(cfg.Lowers, LayerRef{File: l})
		}
	}
	if spec.NoUpper {
		return cfg, cfg.Save(path)
	}
	dir := filepath.Dir(path)
	size, parent := spec.Size, lsmt.UUID{}
	if len(spec.Lowers) > 0 {
		top, err := topLower(ctx, cfg, dir)
		if err != nil {
			return nil, fmt.Errorf("create image %s: %w", path, err)
		}
		if size == 0 {
			size = top.VirtualSize()
		}
		parent = top.UUID()
	}
	if size <= 0 || size%lsmt.SectorSize != 0 {
		return nil, fmt.Errorf("create image %s: size %d must be a positive multiple of 512", path, size)
	}
	data, index := spec.UpperData, spec.UpperIndex
	if data == "" {
		data = filepath.Base(path) + ".upper.data"
	}
	if index == "" && !spec.Sparse {
		index = filepath.Base(path) + ".upper.index"
	}
	var err error
	var u *lsmt.Upper
	if spec.Sparse {
		u, err = lsmt.CreateSparseUpper(resolve(dir, data), uint64(size), parent)
		index = ""
	} else {
		u, err = lsmt.CreateUpper(resolve(dir, data), resolve(dir, index), uint64(size), parent)
	}
	if err != nil {
		return nil, fmt.Errorf("create image %s: %w", path, err)
	}
	if err := u.Close(); err != nil {
		return nil, err
	}
	cfg.Upper = &UpperRef{Data: data, Index: index, Sparse: spec.Sparse}
	if err := cfg.Save(path); err != nil {
		return nil, err
	}
	return cfg, nil
}
