package sandboxcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/agentenv/agentenv/cli/client"
	"github.com/agentenv/agentenv/cli/dockerfile"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
)

// BuildCommand returns `aenv build`: a template from a Dockerfile.
func BuildCommand() *cobra.Command {
	var b client.BuildRequest
	var poll time.Duration
	var o output
	var file string
	var buildArgs []string
	var noCache bool
	cmd := &cobra.Command{
		Use:   "build [CONTEXT] --name NAME [-f Dockerfile]",
		Short: "Build a template from a Dockerfile, uploading the files it copies",
		Long: `Build a template on aenvd from a Dockerfile: FROM names the base image, or one of the
node's templates (FROM base: built on it, nothing pulled); RUN, ENV, ARG,
WORKDIR, USER, COPY and ADD (local files) become build steps run in a VM; CMD/ENTRYPOINT
becomes the start command. LABEL, EXPOSE, VOLUME, STOPSIGNAL, HEALTHCHECK, ONBUILD and
MAINTAINER are ignored with a warning; other instructions (SHELL, multi-stage builds,
COPY --from, ADD of URLs or archives) are errors naming the line.

The files each COPY names are packed from CONTEXT (default: the current directory,
honouring .dockerignore) into a tar archive, uploaded unless the node has it already,
and the build's log is followed until the template is ready. The exit code is non-zero
when the build fails, with the reason.`,
		Example: "  aenv build --name web\n  aenv build ./app -f ./app/Dockerfile.aenv --name api --build-arg VERSION=1.2 --memory 1024",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			if b.Name == "" {
				return errors.New("--name is required: the template's name, used by `aenv start NAME`")
			}
			dir := "."
			if len(args) == 1 {
				dir = args[0]
			}
			ba, err := buildArgMap(buildArgs)
			if err != nil {
				return err
			}
			startCmd := b.StartCmd
			b.Force = noCache
			return dockerfileBuild(cmd, b, dir, file, ba, startCmd, cmd.Flags().Changed("start-cmd"), poll, &o)
		},
	}
	cmd.Flags().StringVar(&b.Name, "name", "", "name of the template (required)")
	cmd.Flags().StringVarP(&file, "file", "f", "", "the Dockerfile (default: CONTEXT/Dockerfile; - reads stdin)")
	cmd.Flags().StringArrayVar(&buildArgs, "build-arg", nil, "set an ARG: KEY=VALUE, or KEY to take it from the environment (repeatable)")
	cmd.Flags().StringVar(&b.StartCmd, "start-cmd", "", "start command (default: from CMD/ENTRYPOINT)")
	cmd.Flags().BoolVar(&noCache, "no-cache", false, "ask the node not to reuse cached build results (E2B's force flag)")
	buildFlags(cmd, &b, &poll)
	o.register(cmd)
	return cmd
}

// buildArgMap parses --build-arg values; a bare KEY takes the environment's
// value, as docker build does (and is left out when unset).
func buildArgMap(vals []string) (map[string]string, error) {
	m := map[string]string{}
	for _, v := range vals {
		k, val, ok := strings.Cut(v, "=")
		if k == "" {
			return nil, fmt.Errorf("--build-arg %q: want KEY=VALUE or KEY", v)
		}
		if !ok {
			if val, ok = os.LookupEnv(k); !ok {
				continue
			}
		}
		m[k] = val
	}
	return m, nil
}

func readDockerfile(cmd *cobra.Command, dir, file string) (string, string, error) {
	if file == "-" {
		b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), 16<<20))
		if err != nil {
			return "", "", fmt.Errorf("read the Dockerfile from stdin: %w", err)
		}
		return string(b), "stdin", nil
	}
	if file == "" {
		file = filepath.Join(dir, "Dockerfile")
	}
	fi, err := os.Stat(file)
	if err != nil {
		return "", "", fmt.Errorf("read the Dockerfile: %w (give its path with -f)", err)
	}
	if fi.Size() > 16<<20 {
		return "", "", fmt.Errorf("read the Dockerfile %s: %d bytes is too large", file, fi.Size())
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", "", fmt.Errorf("read the Dockerfile: %w", err)
	}
	return string(b), file, nil
}

func dockerfileBuild(cmd *cobra.Command, b client.BuildRequest, dir, file string, buildArgs map[string]string,
	startCmd string, startSet bool, poll time.Duration, o *output) error {
	errw := cmd.ErrOrStderr()
	src, fname, err := readDockerfile(cmd, dir, file)
	if err != nil {
		return err
	}
	spec, err := dockerfile.Parse(src, dockerfile.Options{BuildArgs: buildArgs})
	if err != nil {
		return fmt.Errorf("%s: %w", fname, err)
	}
	for _, w := range spec.Warnings {
		fmt.Fprintf(errw, "warning: %s: %s\n", fname, w)
	}
	// Pack the COPY sources before anything is created on the server, so
	// that a bad context fails fast and leaves nothing behind.
	tmp, err := os.MkdirTemp("", "aenv-build-")
	if err != nil {
		return fmt.Errorf("build %s: %w", b.Name, err)
	}
	defer os.RemoveAll(tmp)
	archives, err := packSteps(spec, dir, tmp)
	if err != nil {
		return err
	}
	b.FromImage = spec.FromImage
	if !startSet {
		b.StartCmd = spec.StartCmd
	} else {
		b.StartCmd = startCmd
	}
	for _, st := range spec.Steps {
		b.Steps = append(b.Steps, client.BuildStep{Type: st.Type, Args: st.Args, FilesHash: st.FilesHash})
	}
	c, err := newClient()
	if err != nil {
		return err
	}
	// FROM naming one of the node's templates (FROM base) builds on it, as
	// E2B's fromTemplate: nothing is pulled, so it works offline.
	if nodeTemplate(cmd.Context(), c, spec.FromImage) {
		b.FromTemplate, b.FromImage = spec.FromImage, ""
	}
	ref, err := c.CreateTemplate(cmd.Context(), b.Name, b.CPUCount, b.MemoryMB)
	if errors.Is(err, client.ErrUnsupported) {
		return fmt.Errorf("%w: this aenvd cannot build templates yet", err)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(errw, "Building template %s (%s), build %s, from %s with %d steps.\n", b.Name, ref.TemplateID, ref.BuildID, spec.FromImage, len(b.Steps))
	if err := uploadArchives(cmd, c, ref, archives); err != nil {
		return fmt.Errorf("%w (template %s was created without a build: `aenv template rm %s` removes it)", err, ref.TemplateID, ref.TemplateID)
	}
	if err := c.StartTemplateBuild(cmd.Context(), ref, b); err != nil {
		return err
	}
	return finishBuild(cmd, c, ref, b.Name, poll, o)
}

// upload is one distinct COPY archive.
type upload struct {
	src string // the first COPY source that packs to it, for messages
	dockerfile.Archive
}

// packSteps packs every COPY step's sources, sets the steps' FilesHash and
// returns the distinct archives.
func packSteps(spec *dockerfile.Spec, dir, tmp string) ([]upload, error) {
	var out []upload
	seen := map[string]bool{}
	var ctx *dockerfile.Context
	for i := range spec.Steps {
		st := &spec.Steps[i]
		if st.Type != "COPY" {
			continue
		}
		if ctx == nil {
			var err error
			if ctx, err = dockerfile.OpenContext(dir); err != nil {
				return nil, err
			}
		}
		a, err := ctx.Pack(*st, tmp)
		if err != nil {
			return nil, fmt.Errorf("Dockerfile line %d: %w", st.Line, err)
		}
		st.FilesHash = a.Hash
		if seen[a.Hash] {
			os.Remove(a.Path)
			continue
		}
		seen[a.Hash] = true
		out = append(out, upload{src: st.Args[0], Archive: a})
	}
	return out, nil
}

// uploadArchives uploads the archives the node does not have yet, with a
// progress bar on a terminal.
func uploadArchives(cmd *cobra.Command, c *client.Client, ref client.BuildRef, ups []upload) error {
	errw := cmd.ErrOrStderr()
	for _, u := range ups {
		link, err := c.TemplateFiles(cmd.Context(), ref.TemplateID, u.Hash)
		if err != nil {
			return err
		}
		if link.Present {
			fmt.Fprintf(errw, "Files of COPY %s: already on the node (%s).\n", u.src, u.Hash[:12])
			continue
		}
		if err := uploadOne(cmd.Context(), errw, c, ref, u, link.URL); err != nil {
			return err
		}
	}
	return nil
}

func uploadOne(ctx context.Context, errw io.Writer, c *client.Client, ref client.BuildRef, u upload, link string) error {
	f, err := os.Open(u.Path)
	if err != nil {
		return fmt.Errorf("upload files of COPY %s: %w", u.src, err)
	}
	defer f.Close()
	var body io.Reader = f
	desc := fmt.Sprintf("uploading COPY %s", u.src)
	var bar *progressbar.ProgressBar
	if t := terminal(errw); t != nil {
		bar = progressbar.NewOptions64(u.Size, progressbar.OptionSetWriter(t), progressbar.OptionSetDescription(desc),
			progressbar.OptionShowBytes(true), progressbar.OptionSetElapsedTime(true), progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish())
		r := progressbar.NewReader(f, bar)
		body = &r
	}
	err = c.UploadTemplateFiles(ctx, ref.TemplateID, u.Hash, link, body, u.Size)
	if bar != nil {
		_ = bar.Clear()
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(errw, "Uploaded COPY %s: %d entries, %s (%s).\n", u.src, u.Files, humanBytes(u.Size), u.Hash[:12])
	return nil
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// nodeTemplate reports whether name is the id, a name or an alias of one
// of the node's templates; a node that cannot list them has none.
func nodeTemplate(ctx context.Context, c *client.Client, name string) bool {
	tpls, err := c.Templates(ctx)
	if err != nil {
		return false
	}
	for _, t := range tpls {
		if t.TemplateID == name || slices.Contains(t.Aliases, name) || t.Names != nil && slices.Contains(*t.Names, name) {
			return true
		}
	}
	return false
}
