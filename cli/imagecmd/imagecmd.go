// Package imagecmd is the `aenv image` command tree: creating, importing,
// committing, merging, compressing, inspecting, checking and exporting layered
// block images (overlaybd LSMT/ZFile layers and image configs).
package imagecmd

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/storage/zfile"
	"github.com/spf13/cobra"
)

// NewCommand returns `aenv image`.
func NewCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "image",
		Short: "Create, inspect and transform layered block images (overlaybd LSMT/ZFile)",
		Long: `Layered block images: sealed LSMT layers (optionally ZFile-compressed) stacked
bottom to top under an optional writable upper, described by an image config:

  {"lowers": [{"file": "base.lsmt"}, {"url": "http://host/blob"}],
   "upper": {"data": "upper.data", "index": "upper.index"}}`,
		SilenceUsage: true,
	}
	root.AddCommand(newCreate(), newImport(), newCommit(), newMerge(), newCompress(),
		newInfo(), newCheck(), newExport())
	return root
}

// ParseSize parses sizes such as 4096, 512K, 64M, 10G, 1T (binary units; an
// optional trailing "iB" or "B" is accepted).
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToUpper(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult > 1 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v < 0 || v > (1<<62)/mult {
		return 0, fmt.Errorf("bad size %q (examples: 4096, 64M, 10G)", s)
	}
	return v * mult, nil
}

type sizeFlag struct{ v *int64 }

func (f sizeFlag) String() string {
	if f.v == nil {
		return "0"
	}
	return strconv.FormatInt(*f.v, 10)
}
func (f sizeFlag) Set(s string) error {
	v, err := ParseSize(s)
	if err != nil {
		return err
	}
	*f.v = v
	return nil
}
func (f sizeFlag) Type() string { return "size" }

func newCreate() *cobra.Command {
	var spec image.CreateSpec
	cmd := &cobra.Command{
		Use:   "create CONFIG",
		Short: "Create an image config with a fresh writable upper (on optional lowers)",
		Example: `  aenv image create --size 10G disk.json
  aenv image create --lower base.lsmt --lower app.lsmt work.json
  aenv image create --size 1G --sparse scratch.json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(spec.Lowers) == 0 && spec.Size == 0 {
				return fmt.Errorf("create %s: give --size or at least one --lower", args[0])
			}
			if _, err := image.Create(cmd.Context(), args[0], spec); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "created %s\n", args[0])
			return nil
		},
	}
	f := cmd.Flags()
	f.Var(sizeFlag{&spec.Size}, "size", "virtual size (default: the top lower's)")
	f.StringArrayVar(&spec.Lowers, "lower", nil, "sealed layer file or URL, bottom first (repeatable)")
	f.BoolVar(&spec.Sparse, "sparse", false, "make a sparse upper (one file) instead of data + index files")
	f.StringVar(&spec.UpperData, "upper-data", "", "upper data file (default CONFIG.upper.data)")
	f.StringVar(&spec.UpperIndex, "upper-index", "", "upper index file (default CONFIG.upper.index)")
	return cmd
}

type sealFlags struct {
	message  string
	compress bool
	zopt     zfile.Options
	algo     string
}

func (s *sealFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVarP(&s.message, "message", "m", "", "commit message stored in the layer")
	f.BoolVar(&s.compress, "compress", false, "store the layer as a ZFile")
	s.addZ(cmd)
}

func (s *sealFlags) addZ(cmd *cobra.Command) {
	f := cmd.Flags()
	f.IntVar(&s.zopt.BlockSize, "block-size", zfile.DefaultBlockSize, "ZFile block size (4096..65536, power of two)")
	f.StringVar(&s.algo, "algo", "zstd", "ZFile compression: zstd or lz4")
	f.Uint8Var(&s.zopt.Level, "level", 3, "zstd level")
	f.BoolVar(&s.zopt.NoVerify, "no-verify", false, "omit per-block CRC32C")
}

func (s *sealFlags) zfileOptions() (*zfile.Options, error) {
	o := s.zopt
	switch s.algo {
	case "zstd", "":
		o.Algorithm = zfile.AlgoZstd
	case "lz4":
		o.Algorithm = zfile.AlgoLZ4
	default:
		return nil, fmt.Errorf("unknown --algo %q (zstd or lz4)", s.algo)
	}
	return &o, nil
}

func (s *sealFlags) commitOptions() (image.CommitOptions, error) {
	opt := image.CommitOptions{Message: s.message}
	if s.compress {
		z, err := s.zfileOptions()
		if err != nil {
			return opt, err
		}
		opt.Compress = z
	}
	return opt, nil
}

func printLayer(w io.Writer, verb string, info image.LayerInfo) {
	fmt.Fprintf(w, "%s %s: uuid %s parent %s, %d segments, %d data bytes, file %d bytes\n",
		verb, info.Path, info.UUID, info.ParentUUID, info.Segments, info.DataSize, info.Size)
}

func newCommit() *cobra.Command {
	var sf sealFlags
	cmd := &cobra.Command{
		Use:   "commit CONFIG OUT",
		Short: "Seal the image's upper into a new sealed layer OUT (parent: the top lower)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			opt, err := sf.commitOptions()
			if err != nil {
				return err
			}
			im, err := image.Open(cmd.Context(), args[0], image.Options{})
			if err != nil {
				return err
			}
			info, err := im.Commit(cmd.Context(), args[1], opt)
			if cerr := im.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			printLayer(cmd.OutOrStdout(), "committed", info)
			return nil
		},
	}
	sf.add(cmd)
	return cmd
}

func newMerge() *cobra.Command {
	var sf sealFlags
	cmd := &cobra.Command{
		Use:   "merge OUT LAYER...",
		Short: "Merge sealed layers (bottom first) into one sealed layer OUT",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			opt, err := sf.commitOptions()
			if err != nil {
				return err
			}
			info, err := image.Merge(cmd.Context(), args[1:], args[0], opt)
			if err != nil {
				return err
			}
			printLayer(cmd.OutOrStdout(), "merged", info)
			return nil
		},
	}
	sf.add(cmd)
	return cmd
}

func newCompress() *cobra.Command {
	var sf sealFlags
	cmd := &cobra.Command{
		Use:   "compress IN OUT",
		Short: "Compress a sealed layer (or any file) into a ZFile",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			opt, err := sf.zfileOptions()
			if err != nil {
				return err
			}
			in, err := os.Open(args[0])
			if err != nil {
				return fmt.Errorf("compress: %w", err)
			}
			defer in.Close()
			h, err := compressTo(cmd.Context(), args[1], in, *opt)
			if err != nil {
				return fmt.Errorf("compress %s: %w", args[0], err)
			}
			st, err := os.Stat(args[1])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "compressed %s -> %s: %d -> %d bytes (%d blocks of %d)\n",
				args[0], args[1], h.OriginalSize, st.Size(), h.IndexSize, h.BlockSize)
			return nil
		},
	}
	sf.addZ(cmd)
	return cmd
}

func compressTo(ctx context.Context, path string, r io.Reader, opt zfile.Options) (zfile.Header, error) {
	var h zfile.Header
	err := atomicfile.Write(path, 0o644, func(w io.Writer) error {
		var err error
		h, err = zfile.Compress(ctx, w, r, opt) // w is the temporary *os.File: the header is rewritten in place
		return err
	})
	return h, err
}

func newImport() *cobra.Command {
	var sf sealFlags
	var size int64
	cmd := &cobra.Command{
		Use:   "import SRC OUT",
		Short: "Import a raw disk file, or a directory (made into ext4 with mke2fs -d), as one sealed layer",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			opt, err := sf.commitOptions()
			if err != nil {
				return err
			}
			info, err := Import(cmd.Context(), args[0], args[1], size, opt)
			if err != nil {
				return err
			}
			printLayer(cmd.OutOrStdout(), "imported", info)
			return nil
		},
	}
	cmd.Flags().Var(sizeFlag{&size}, "size", "ext4 size for a directory (default: twice its content + 64 MiB)")
	sf.add(cmd)
	return cmd
}

// Import writes src (a raw disk file or a directory) as a sealed layer at out.
func Import(ctx context.Context, src, out string, size int64, opt image.CommitOptions) (image.LayerInfo, error) {
	st, err := os.Stat(src)
	if err != nil {
		return image.LayerInfo{}, fmt.Errorf("import: %w", err)
	}
	raw := src
	if st.IsDir() {
		tmp, err := os.CreateTemp(filepath.Dir(out), ".import-*.ext4")
		if err != nil {
			return image.LayerInfo{}, fmt.Errorf("import %s: %w", src, err)
		}
		tmp.Close()
		defer os.Remove(tmp.Name())
		if err := makeExt4(ctx, src, tmp.Name(), size); err != nil {
			return image.LayerInfo{}, fmt.Errorf("import %s: %w", src, err)
		}
		raw = tmp.Name()
	}
	info, err := image.ImportRaw(ctx, raw, out, opt)
	if err != nil {
		return info, fmt.Errorf("import %s: %w", src, err)
	}
	return info, nil
}

func dirSize(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if info, err := d.Info(); err == nil {
			total += (info.Size() + 4095) / 4096 * 4096
		}
		total += 256 // inode and directory entry
		return nil
	})
	return total, err
}

func makeExt4(ctx context.Context, dir, img string, size int64) error {
	if size == 0 {
		n, err := dirSize(dir)
		if err != nil {
			return err
		}
		size = 2*n + 64<<20
	}
	size = (size + 4095) / 4096 * 4096
	if err := os.Truncate(img, size); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "mke2fs", "-q", "-F", "-t", "ext4", "-d", dir, img,
		strconv.FormatInt(size/1024, 10)+"k").CombinedOutput()
	if err != nil {
		return fmt.Errorf("mke2fs -d %s: %w: %s", dir, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func newExport() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "export --out FILE SRC...",
		Short: "Write the flattened virtual disk of a layer, a stack (layers bottom first) or an image config to a raw file",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("export: --out is required")
			}
			im, err := openAny(cmd.Context(), args)
			if err != nil {
				return err
			}
			defer im.Close()
			if err := image.Export(cmd.Context(), im, out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "exported %d bytes to %s\n", im.Size(), out)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "raw output file (written sparse)")
	return cmd
}

// openAny opens one image config, or layer files as a read-only stack.
func openAny(ctx context.Context, args []string) (*image.Image, error) {
	if len(args) == 1 && isConfig(args[0]) {
		return image.Open(ctx, args[0], image.Options{ReadOnly: true})
	}
	return image.OpenLayers(ctx, args, image.Options{})
}

func isConfig(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, 64)
	n, _ := f.Read(b)
	return strings.HasPrefix(strings.TrimSpace(string(b[:n])), "{")
}
