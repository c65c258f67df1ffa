package lsmt

import (
	"fmt"
	"io"
	"os"

	"github.com/agentenv/agentenv/storage/zfile"
)

// OpenLayerAt opens a sealed layer from r (size bytes), transparently reading
// through a ZFile when r holds one. name is used in errors.
func OpenLayerAt(name string, r io.ReaderAt, size int64) (*Layer, error) {
	head := make([]byte, 24)
	if size >= int64(len(head)) {
		if err := readFull(r, head, 0); err != nil {
			return nil, fmt.Errorf("open layer %s: %w", name, err)
		}
	}
	if !zfile.IsZFile(head) {
		return OpenSealed(name, r, size)
	}
	z, err := zfile.Open(name, r, size)
	if err != nil {
		return nil, fmt.Errorf("open layer %s: %w", name, err)
	}
	l, err := OpenSealed(name, z, z.Size())
	if err != nil {
		return nil, err
	}
	l.Compressed = true
	return l, nil
}

// OpenLayerFile opens a sealed layer file (plain or ZFile); Close closes it.
func OpenLayerFile(path string) (*Layer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open layer: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open layer %s: %w", path, err)
	}
	l, err := OpenLayerAt(path, f, st.Size())
	if err != nil {
		f.Close()
		return nil, err
	}
	l.SetCloser(f)
	return l, nil
}
