package imagecmd

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/storage/lsmt"
	"github.com/agentenv/agentenv/storage/zfile"
	"github.com/spf13/cobra"
)

// LayerReport describes one layer file for `info` and `check`.
type LayerReport struct {
	File        string         `json:"file"`
	Kind        string         `json:"kind"` // sealed, writable, sparse-writable, index
	FileSize    int64          `json:"file_size"`
	ZFile       *ZFileReport   `json:"zfile,omitempty"`
	Flags       uint32         `json:"flags"`
	UUID        string         `json:"uuid"`
	ParentUUID  string         `json:"parent_uuid"`
	Message     string         `json:"message,omitempty"`
	Version     string         `json:"version"`
	VirtualSize int64          `json:"virtual_size"`
	IndexOffset uint64         `json:"index_offset,omitempty"`
	IndexSize   uint64         `json:"index_size,omitempty"`
	Segments    int            `json:"segments"`
	DataSectors uint64         `json:"data_sectors"`
	ZeroSectors uint64         `json:"zeroed_sectors"`
	Recovered   int64          `json:"torn_index_bytes,omitempty"`
	Mappings    []lsmt.Segment `json:"mappings,omitempty"`
}

// ZFileReport describes the ZFile container of a compressed layer.
type ZFileReport struct {
	Algorithm      string `json:"algorithm"`
	Level          uint8  `json:"level"`
	BlockSize      uint32 `json:"block_size"`
	Blocks         uint64 `json:"blocks"`
	Verify         bool   `json:"verify"`
	OriginalSize   uint64 `json:"original_size"`
	CompressedSize int64  `json:"compressed_size"`
	HeaderOverride bool   `json:"header_overwrite"`
	Digest         bool   `json:"digest"`
}

func algoName(a uint8) string {
	switch a {
	case zfile.AlgoZstd:
		return "zstd"
	case zfile.AlgoLZ4:
		return "lz4"
	case zfile.AlgoLZO:
		return "lzo"
	}
	return fmt.Sprintf("unknown(%d)", a)
}

func summarize(r *LayerReport, segs []lsmt.Segment, keep bool) {
	r.Segments = len(segs)
	for _, s := range segs {
		if s.Zeroed {
			r.ZeroSectors += uint64(s.Length)
		} else {
			r.DataSectors += uint64(s.Length)
		}
	}
	if keep {
		r.Mappings = segs
	}
}

func fillHeader(r *LayerReport, h lsmt.HeaderTrailer) {
	r.Flags = h.Flags
	r.UUID, r.ParentUUID = h.UUID.String(), h.ParentUUID.String()
	r.Message = h.Tag
	r.Version = fmt.Sprintf("%d.%d", h.Version, h.SubVersion)
	r.VirtualSize = int64(h.VirtualSize)
	r.IndexOffset, r.IndexSize = h.IndexOffset, h.IndexSize
}

// inspectLayer opens one layer file of any kind. With verify, every ZFile
// block is decompressed and checked, and every data sector of the layer read.
func inspectLayer(ctx context.Context, path, indexPath string, keep, verify bool) (*LayerReport, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	r := &LayerReport{File: path, FileSize: st.Size()}
	head := make([]byte, lsmt.HeaderSize)
	n, _ := f.ReadAt(head, 0)
	head = head[:n]
	if zfile.IsZFile(head) {
		return inspectZFile(ctx, r, f, keep, verify)
	}
	h, err := lsmt.ParseHeaderTrailer(head)
	if err != nil {
		return nil, fmt.Errorf("%s: not an LSMT layer or ZFile: %w", path, err)
	}
	switch {
	case !h.IsData():
		return inspectWritable(r, path, indexPath, keep, true)
	case !h.IsSealed():
		return inspectWritable(r, path, indexPath, keep, false)
	}
	l, err := lsmt.OpenSealed(path, f, st.Size())
	if err != nil {
		return nil, err
	}
	return sealedReport(ctx, r, l, keep, verify)
}

func sealedReport(ctx context.Context, r *LayerReport, l *lsmt.Layer, keep, verify bool) (*LayerReport, error) {
	r.Kind = "sealed"
	fillHeader(r, l.Trailer)
	summarize(r, l.Index().Segments(), keep)
	if verify {
		if err := readAllData(ctx, l); err != nil {
			return nil, fmt.Errorf("%s: %w", r.File, err)
		}
	}
	return r, nil
}

// readAllData reads every physical data sector the layer's mappings use,
// each once: what check costs is bounded by the data the file holds, not by
// the virtual size it claims or by how often its mappings reuse the data.
func readAllData(ctx context.Context, l *lsmt.Layer) error {
	var ext [][2]uint64 // physical sector ranges
	for _, s := range l.Index().Segments() {
		if !s.Zeroed {
			ext = append(ext, [2]uint64{s.MOffset, s.MOffset + uint64(s.Length)})
		}
	}
	slices.SortFunc(ext, func(a, b [2]uint64) int { return cmp.Compare(a[0], b[0]) })
	buf := make([]byte, 1<<20)
	r := l.DataReaderAt()
	var done uint64 // sectors below this were read
	for _, e := range ext {
		for s := max(e[0], done); s < e[1]; {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := min(e[1]-s, uint64(len(buf))/lsmt.SectorSize)
			if _, err := r.ReadAt(buf[:n*lsmt.SectorSize], int64(s*lsmt.SectorSize)); err != nil && err != io.EOF {
				return fmt.Errorf("read data sectors [%d,+%d): %w", s, n, err)
			}
			s += n
		}
		done = max(done, e[1])
	}
	return nil
}

func inspectZFile(ctx context.Context, r *LayerReport, f *os.File, keep, verify bool) (*LayerReport, error) {
	z, err := zfile.Open(r.File, f, r.FileSize)
	if err != nil {
		return nil, err
	}
	t := z.Trailer()
	r.ZFile = &ZFileReport{Algorithm: algoName(t.Algorithm), Level: t.Level, BlockSize: t.BlockSize,
		Blocks: uint64(z.Blocks()), Verify: t.Verify, OriginalSize: t.OriginalSize, CompressedSize: r.FileSize,
		HeaderOverride: z.StoredHeader().Flags&zfile.FlagHeaderOverwrite != 0, Digest: t.Flags&zfile.FlagDigest != 0}
	if verify {
		if err := z.Verify(ctx); err != nil {
			return nil, fmt.Errorf("%s: %w", r.File, err)
		}
	}
	l, err := lsmt.OpenSealed(r.File, z, z.Size())
	if err != nil {
		return nil, err
	}
	return sealedReport(ctx, r, l, keep, verify)
}

func inspectWritable(r *LayerReport, path, indexPath string, keep, isIndex bool) (*LayerReport, error) {
	if isIndex {
		return nil, fmt.Errorf("%s is the index file of a writable layer: pass the data file with --index %s", path, path)
	}
	u, err := lsmt.OpenUpper(path, indexPath, true)
	if err != nil {
		if indexPath == "" {
			return nil, fmt.Errorf("%w (a log-structured upper needs --index)", err)
		}
		return nil, err
	}
	defer u.Close()
	r.Kind = "writable"
	if u.Sparse() {
		r.Kind = "sparse-writable"
	}
	fillHeader(r, u.Header())
	r.Recovered = u.Recovered
	summarize(r, u.Segments(), keep)
	return r, nil
}

// ImageReport describes an image config.
type ImageReport struct {
	Config      string         `json:"config"`
	VirtualSize int64          `json:"virtual_size"`
	Lowers      []*LayerReport `json:"lowers"`
	Upper       *LayerReport   `json:"upper,omitempty"`
	Merged      int            `json:"merged_segments"`
}

func inspectConfig(ctx context.Context, path string, keep, verify bool) (*ImageReport, error) {
	cfg, err := image.LoadConfig(path)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	rep := &ImageReport{Config: path}
	for i, l := range cfg.Lowers {
		if l.URL != "" {
			rep.Lowers = append(rep.Lowers, &LayerReport{File: l.URL, Kind: "remote"})
			continue
		}
		lr, err := inspectLayer(ctx, abs(l.File), "", keep, verify)
		if err != nil {
			return nil, fmt.Errorf("%s: lowers[%d]: %w", path, i, err)
		}
		rep.Lowers = append(rep.Lowers, lr)
	}
	if u := cfg.Upper; u != nil {
		ur, err := inspectLayer(ctx, abs(u.Data), abs(u.Index), keep, verify)
		if err != nil {
			return nil, fmt.Errorf("%s: upper: %w", path, err)
		}
		rep.Upper = ur
	}
	im, err := image.Open(ctx, path, image.Options{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer im.Close()
	rep.VirtualSize = im.Size()
	rep.Merged = im.Stack().MergedIndex().Len()
	return rep, nil
}

func newInfo() *cobra.Command {
	var asJSON, segments bool
	var index string
	cmd := &cobra.Command{
		Use:   "info FILE",
		Short: "Show header fields, segments and sizes of a layer, a writable layer or an image config",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runInspect(cmd, args[0], index, asJSON, segments, false)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&segments, "segments", false, "list every mapping")
	cmd.Flags().StringVar(&index, "index", "", "index file of a log-structured writable layer")
	return cmd
}

func newCheck() *cobra.Command {
	var index string
	cmd := &cobra.Command{
		Use:   "check FILE",
		Short: "Verify structure and checksums of a layer, a writable layer or an image config",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runInspect(cmd, args[0], index, false, false, true)
		},
	}
	cmd.Flags().StringVar(&index, "index", "", "index file of a log-structured writable layer")
	return cmd
}

func runInspect(cmd *cobra.Command, path, index string, asJSON, segments, verify bool) error {
	ctx := cmd.Context()
	w := cmd.OutOrStdout()
	var v any
	if isConfig(path) {
		rep, err := inspectConfig(ctx, path, segments, verify)
		if err != nil {
			return err
		}
		v = rep
		if !asJSON && !verify {
			fmt.Fprintf(w, "image %s: virtual size %d, %d lowers, %d merged segments\n", path, rep.VirtualSize, len(rep.Lowers), rep.Merged)
			for i, l := range rep.Lowers {
				fmt.Fprintf(w, "lowers[%d]:\n", i)
				printReport(w, l)
			}
			if rep.Upper != nil {
				fmt.Fprintln(w, "upper:")
				printReport(w, rep.Upper)
			}
		}
	} else {
		rep, err := inspectLayer(ctx, path, index, segments, verify)
		if err != nil {
			return err
		}
		v = rep
		if !asJSON && !verify {
			printReport(w, rep)
		}
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	if verify {
		fmt.Fprintf(w, "%s: ok\n", path)
	}
	return nil
}

func printReport(w io.Writer, r *LayerReport) {
	fmt.Fprintf(w, "  file          %s (%d bytes)\n", r.File, r.FileSize)
	fmt.Fprintf(w, "  kind          %s\n", r.Kind)
	if r.Kind == "remote" {
		return
	}
	if z := r.ZFile; z != nil {
		fmt.Fprintf(w, "  zfile         %s level %d, %d blocks of %d, verify %v, %d -> %d bytes\n",
			z.Algorithm, z.Level, z.Blocks, z.BlockSize, z.Verify, z.OriginalSize, z.CompressedSize)
	}
	fmt.Fprintf(w, "  flags         %#x\n", r.Flags)
	fmt.Fprintf(w, "  uuid          %s\n", r.UUID)
	fmt.Fprintf(w, "  parent_uuid   %s\n", r.ParentUUID)
	fmt.Fprintf(w, "  version       %s\n", r.Version)
	fmt.Fprintf(w, "  virtual_size  %d\n", r.VirtualSize)
	if r.Kind == "sealed" {
		fmt.Fprintf(w, "  index         offset %d, %d entries\n", r.IndexOffset, r.IndexSize)
	}
	if r.Message != "" {
		fmt.Fprintf(w, "  message       %q\n", r.Message)
	}
	fmt.Fprintf(w, "  segments      %d (%d data sectors, %d zeroed sectors)\n", r.Segments, r.DataSectors, r.ZeroSectors)
	if r.Recovered > 0 {
		fmt.Fprintf(w, "  torn index    %d bytes past the last whole entry (dropped on next writable open)\n", r.Recovered)
	}
	for _, s := range r.Mappings {
		z := ""
		if s.Zeroed {
			z = " zeroed"
		}
		fmt.Fprintf(w, "    [%d, +%d) -> %d%s\n", s.Offset, s.Length, s.MOffset, z)
	}
}
