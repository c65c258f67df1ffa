package unpack

import (
	"archive/tar"
	"errors"
	"fmt"
)

// Defaults of the Root limits (a zero limit takes its default).
const (
	DefaultMaxBytes   = 64 << 30
	DefaultMaxEntries = 1 << 22
	DefaultMaxInodes  = 1 << 21
	DefaultMaxPathLen = 4096 // PATH_MAX
	// EntryCost is what every inode made costs against MaxBytes besides its
	// names and content: about an ext4 inode, so a layer of millions of empty
	// entries is bounded by bytes like a layer of big files.
	EntryCost = 256
)

// ErrLimit reports a layer that goes past a limit of its Root.
var ErrLimit = errors.New("image limit exceeded")

func orDefault[T int | int64](v, d T) T {
	if v <= 0 {
		return d
	}
	return v
}

// charge counts n bytes against MaxBytes.
func (r *Root) charge(n int64, what string) error {
	limit := orDefault(r.MaxBytes, DefaultMaxBytes)
	if n < 0 || r.written+n > limit {
		return fmt.Errorf("%w: %s of %d bytes exceeds the limit of %d bytes for the root (%d written)", ErrLimit, what, n, limit, r.written)
	}
	r.written += n
	return nil
}

// newInode counts one inode about to be made.
func (r *Root) newInode() error {
	if limit := orDefault(r.MaxInodes, DefaultMaxInodes); r.inodes >= limit {
		return fmt.Errorf("%w: more than %d inodes", ErrLimit, limit)
	}
	if err := r.charge(EntryCost, "an inode"); err != nil {
		return err
	}
	r.inodes++
	return nil
}

// count checks an entry's header against the limits before it is applied.
func (r *Root) count(hdr *tar.Header) error {
	if limit := orDefault(r.MaxEntries, DefaultMaxEntries); r.entries >= limit {
		return fmt.Errorf("%w: more than %d entries", ErrLimit, limit)
	}
	r.entries++
	limit := orDefault(r.MaxPathLen, DefaultMaxPathLen)
	if len(hdr.Name) > limit || len(hdr.Linkname) > limit {
		return fmt.Errorf("%w: path length %d (link target %d) over the limit of %d bytes", ErrLimit, len(hdr.Name), len(hdr.Linkname), limit)
	}
	n := int64(len(hdr.Name) + len(hdr.Linkname))
	for k, v := range hdr.PAXRecords {
		n += int64(len(k) + len(v))
	}
	return r.charge(n, "entry metadata")
}
