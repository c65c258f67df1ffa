package sandboxcmd

import (
	"fmt"
	"io"
	"os"
	"path"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// progressMin is the size from which transfers show a progress bar.
const progressMin = 1 << 20

// progress wraps a transfer of size bytes with a bar on stderr when stderr
// is a terminal (and the transfer is large or of unknown size).
func progress(cmd *cobra.Command, quiet bool, size int64, desc string) io.Writer {
	f, ok := cmd.ErrOrStderr().(*os.File)
	if quiet || !ok || !term.IsTerminal(int(f.Fd())) || (size >= 0 && size < progressMin) {
		return io.Discard
	}
	return progressbar.NewOptions64(size,
		progressbar.OptionSetWriter(f), progressbar.OptionSetDescription(desc),
		progressbar.OptionShowBytes(true), progressbar.OptionShowCount(), progressbar.OptionShowTotalBytes(true),
		progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionFullWidth(),
		progressbar.OptionSpinnerType(14), progressbar.OptionOnCompletion(func() { fmt.Fprintln(f) }))
}

func uploadCmd() *cobra.Command {
	var user string
	var quiet bool
	cmd := &cobra.Command{
		Use:     "upload SANDBOX_ID LOCAL_FILE [REMOTE_PATH]",
		Short:   "Copy a local file into a sandbox ('-' reads stdin)",
		Long:    "Copy LOCAL_FILE to REMOTE_PATH in the sandbox (default: its base name in the user's home; relative paths are under the home).",
		Example: "  aenv upload SANDBOX_ID ./data.csv /tmp/data.csv\n  tar c . | aenv upload SANDBOX_ID - src.tar",
		Args:    cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			local := args[1]
			remote := path.Base(local)
			if len(args) == 3 {
				remote = args[2]
			} else if local == "-" {
				return fmt.Errorf("upload from stdin needs REMOTE_PATH")
			}
			var r io.Reader = cmd.InOrStdin()
			size := int64(-1)
			if local != "-" {
				f, err := os.Open(local)
				if err != nil {
					return fmt.Errorf("open %s for upload: %w", local, err)
				}
				defer f.Close()
				st, err := f.Stat()
				if err != nil {
					return fmt.Errorf("stat %s: %w", local, err)
				}
				if st.IsDir() {
					return fmt.Errorf("%s is a directory: upload files one at a time (or a tar of the directory)", local)
				}
				r, size = f, st.Size()
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			sb, err := running(cmd.Context(), c, args[0], user)
			if err != nil {
				return err
			}
			bar := progress(cmd, quiet, size, "upload "+remote)
			if err := sb.Upload(cmd.Context(), remote, io.TeeReader(r, bar), size); err != nil {
				return err
			}
			if cl, ok := bar.(io.Closer); ok {
				cl.Close()
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&user, "user", "u", "", "owner of the file (default: the template's user)")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress bar")
	return cmd
}

func downloadCmd() *cobra.Command {
	var user string
	var quiet bool
	cmd := &cobra.Command{
		Use:     "download SANDBOX_ID REMOTE_PATH [LOCAL_FILE]",
		Short:   "Copy a file out of a sandbox ('-' writes stdout)",
		Example: "  aenv download SANDBOX_ID /tmp/out.log\n  aenv download SANDBOX_ID report.pdf - > report.pdf",
		Args:    cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			remote := args[1]
			local := path.Base(remote)
			if len(args) == 3 {
				local = args[2]
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			sb, err := running(cmd.Context(), c, args[0], user)
			if err != nil {
				return err
			}
			rc, size, err := sb.Download(cmd.Context(), remote)
			if err != nil {
				return err
			}
			defer rc.Close()
			var w io.Writer = cmd.OutOrStdout()
			var f *os.File
			if local != "-" {
				if f, err = os.Create(local); err != nil {
					return fmt.Errorf("create %s for the download: %w", local, err)
				}
				w = f
			}
			bar := progress(cmd, quiet, size, "download "+remote)
			n, err := io.Copy(io.MultiWriter(w, bar), rc)
			if cl, ok := bar.(io.Closer); ok {
				cl.Close()
			}
			if err == nil && size >= 0 && n != size {
				err = fmt.Errorf("got %d of %d bytes", n, size)
			}
			if f != nil {
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
			if err != nil {
				if f != nil {
					os.Remove(local)
				}
				return fmt.Errorf("download %s from sandbox %s: %w", remote, args[0], err)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&user, "user", "u", "", "read as this user (default: the template's)")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress bar")
	return cmd
}
