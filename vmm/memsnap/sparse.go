package memsnap

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/agentenv/agentenv/storage/lsmt"
)

// ImportSparseDiff writes a VMM's own diff snapshot memory file as a sealed
// layer at out whose parent is parentUUID. Firecracker's Diff snapshots are
// such files: the size of guest RAM, with data extents exactly where the
// guest dirtied pages and holes elsewhere. Every page of a data extent is a
// written page, so an all-zero one becomes a zeroed extent (it must hide the
// parent's data); holes stay unmapped (the parent shows through). A file
// system that reports no holes makes every page a written one: correct, only
// larger. The layer is written atomically (internal/atomicfile).
func ImportSparseDiff(ctx context.Context, diffFile, out string, parentUUID lsmt.UUID, message string) (Stats, error) {
	start := time.Now()
	st, err := importSparseDiff(ctx, diffFile, out, parentUUID, message)
	if err != nil {
		return st, fmt.Errorf("import diff snapshot %s into %s: %w", diffFile, out, err)
	}
	st.Took = time.Since(start)
	slog.Debug("memsnap: imported diff snapshot", "file", diffFile, "out", out, "pages", st.Pages,
		"zero_pages", st.ZeroPages, "took", st.Took)
	return st, nil
}

func importSparseDiff(ctx context.Context, diffFile, out string, parent lsmt.UUID, message string) (Stats, error) {
	return importFile(ctx, diffFile, out, lsmt.SealOptions{Parent: parent, Message: message}, writeWrittenPages)
}

// writeWrittenPages writes every page of b, zero ones as zeroed extents
// (emit); a short last page (a file size not a page multiple) on its own.
func writeWrittenPages(xw *lsmt.ExtentWriter, b []byte, off int64, st *Stats) error {
	whole := len(b) / pageSize * pageSize
	if err := emit(xw, st, off, b[:whole]); err != nil || whole == len(b) {
		return err
	}
	tail := b[whole:]
	if isZero(tail) {
		st.ZeroPages++
		return xw.WriteZeroed(off+int64(whole), int64(len(tail)))
	}
	st.Pages++
	return xw.WriteData(off+int64(whole), tail)
}
