package memsnap

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// Working-set packs: the bytes of a memory stack's working set, stored
// one after another in file order behind the working set itself, so that
// a node restoring the stack from layers it lacks has the pages its guest
// needs first with one sequential read, not with fetches of every layer
// chunk a scattered page falls in (a few pages of each chunk, from each
// layer of the stack). A pack is committed with the stack (its digest is
// in the repository manifest that names the layers), so its bytes are
// vouched for like theirs.
//
// Layout: the 8-byte magic, the working set's length (big-endian uint64),
// the working set (WriteWorkingSetTo's format), then the bytes of each of
// its extents in order.

// packMagic starts a pack.
var packMagic = [8]byte{'A', 'E', 'N', 'V', 'W', 'S', 'P', '1'}

// packHeader is the size of a pack's fixed header.
const packHeader = 16

// MaxPackData bounds the bytes a pack carries: a pack is read whole before
// the guest runs, so a larger working set is cut (Cap) to this.
const MaxPackData = 64 << 20

// MaxPackBytes bounds a whole pack.
const MaxPackBytes = packHeader + MaxWorkingSetBytes + MaxPackData

// Pack is a parsed pack: the memory file's size, its extents and where
// their bytes start.
type Pack struct {
	Size    int64
	Extents []Extent
	DataOff int64
}

// WorkingSet is the pack's working set, stored form (what ReadWorkingSet
// reads).
func (p Pack) WorkingSet() ([]byte, error) { return encodeWorkingSet(p.Size, p.Extents) }

// WritePack writes to w the pack of the stack of sealed memory layers at
// layers (bottom to top) for the working set ws (a stored working set of
// the stack's memory file), cut to MaxPackData, and returns the bytes of
// memory it carries.
func WritePack(ctx context.Context, w io.Writer, layers []string, ws []byte) (int64, error) {
	size, extents, err := ParseWorkingSet(ws)
	if err != nil {
		return 0, fmt.Errorf("write pack: %w", err)
	}
	st, err := openStack(layers)
	if err != nil {
		return 0, fmt.Errorf("write pack: %w", err)
	}
	defer st.Close()
	if st.Size() != size {
		return 0, fmt.Errorf("write pack: the working set describes a %d-byte file, the stack is %d bytes", size, st.Size())
	}
	extents = Cap(extents, MaxPackData)
	head, err := encodeWorkingSet(size, extents)
	if err != nil {
		return 0, fmt.Errorf("write pack: %w", err)
	}
	if err := writePackHeader(w, head); err != nil {
		return 0, fmt.Errorf("write pack: %w", err)
	}
	buf := make([]byte, 1<<20)
	var n int64
	for _, e := range extents {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if err := copyExtent(w, st, e, buf); err != nil {
			return n, fmt.Errorf("write pack: extent %d+%d: %w", e.Off, e.Len, err)
		}
		n += e.Len
	}
	return n, nil
}

// writePackHeader writes the magic, the working set's length and itself.
func writePackHeader(w io.Writer, ws []byte) error {
	var h [packHeader]byte
	copy(h[:], packMagic[:])
	binary.BigEndian.PutUint64(h[8:], uint64(len(ws)))
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	_, err := w.Write(ws)
	return err
}

// copyExtent copies extent e of r to w through buf.
func copyExtent(w io.Writer, r io.ReaderAt, e Extent, buf []byte) error {
	for off := e.Off; off < e.Off+e.Len; {
		b := buf[:min(int64(len(buf)), e.Off+e.Len-off)]
		if _, err := r.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
		off += int64(len(b))
	}
	return nil
}

// ReadPack parses the header of a pack of total bytes read through r
// (untrusted until its digest was checked, and bounded either way): the
// magic, a working set that parses, and exactly as many bytes behind it as
// its extents cover.
func ReadPack(r io.ReaderAt, total int64) (Pack, error) {
	if total < packHeader || total > MaxPackBytes {
		return Pack{}, fmt.Errorf("read pack: %d bytes (at least %d, at most %d)", total, packHeader, int64(MaxPackBytes))
	}
	var h [packHeader]byte
	if _, err := r.ReadAt(h[:], 0); err != nil {
		return Pack{}, fmt.Errorf("read pack: %w", err)
	}
	if !bytes.Equal(h[:8], packMagic[:]) {
		return Pack{}, errors.New("read pack: not a working-set pack (bad magic)")
	}
	n := binary.BigEndian.Uint64(h[8:])
	if n > MaxWorkingSetBytes || int64(n) > total-packHeader {
		return Pack{}, fmt.Errorf("read pack: a working set of %d bytes in a %d-byte pack", n, total)
	}
	ws := make([]byte, n)
	if _, err := r.ReadAt(ws, packHeader); err != nil {
		return Pack{}, fmt.Errorf("read pack: %w", err)
	}
	size, extents, err := ParseWorkingSet(ws)
	if err != nil {
		return Pack{}, fmt.Errorf("read pack: %w", err)
	}
	p := Pack{Size: size, Extents: extents, DataOff: packHeader + int64(n)}
	var data int64
	for _, e := range extents { // bounded at each step: no overflow
		if data += e.Len; data > MaxPackData {
			return Pack{}, fmt.Errorf("read pack: extents of more than %d bytes", int64(MaxPackData))
		}
	}
	if p.DataOff+data != total {
		return Pack{}, fmt.Errorf("read pack: extents of %d bytes behind a %d-byte header in a %d-byte pack", data, p.DataOff, total)
	}
	return p, nil
}

// ReadPackFile opens and parses the pack at path; the caller closes the
// file (ErrNoWorkingSet when there is none).
func ReadPackFile(path string) (*os.File, Pack, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, Pack{}, ErrNoWorkingSet
	}
	if err != nil {
		return nil, Pack{}, fmt.Errorf("read pack: %w", err)
	}
	st, err := f.Stat()
	if err == nil {
		var p Pack
		if p, err = ReadPack(f, st.Size()); err == nil {
			return f, p, nil
		}
	}
	f.Close()
	return nil, Pack{}, fmt.Errorf("%s: %w", path, err)
}
