package lsmt

import (
	"errors"
	"fmt"
	"syscall"
)

// Seeker is what scanning a file for data needs (an *os.File).
type Seeker interface {
	Seek(offset int64, whence int) (int64, error)
}

const (
	seekData = 3 // SEEK_DATA
	seekHole = 4 // SEEK_HOLE
)

// DataRanges calls fn with each range [data, hole) of f that holds data
// within [start, end), found with SEEK_DATA and SEEK_HOLE. ENXIO from
// SEEK_DATA means there is no data past the offset; any other error (an I/O
// error, a file that cannot seek) is returned, not taken for the end of the
// data: a sparse layer would otherwise open with its data silently unmapped.
func DataRanges(f Seeker, start, end int64, fn func(a, b int64)) error {
	for pos := start; pos < end; {
		d, err := f.Seek(pos, seekData)
		if errors.Is(err, syscall.ENXIO) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("seek data at %d: %w", pos, err)
		}
		if d >= end {
			return nil
		}
		h, err := f.Seek(d, seekHole)
		if err != nil {
			return fmt.Errorf("seek hole at %d: %w", d, err)
		}
		h = min(h, end)
		if h <= d {
			return fmt.Errorf("seek hole at %d returned %d", d, h)
		}
		fn(d, h)
		pos = h
	}
	return nil
}
