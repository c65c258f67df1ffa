package sandboxcmd

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/agentenv/agentenv/cli/client"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// buildResult is what `aenv template build` prints.
type buildResult struct {
	client.BuildRef
	Status string `json:"status"`
}

func templateBuildCmd() *cobra.Command {
	var b client.BuildRequest
	var poll time.Duration
	var o output
	cmd := &cobra.Command{
		Use:     "build NAME --from-image IMAGE",
		Short:   "Build a template from a container image, following its log",
		Example: "  aenv template build python --from-image python:3.13-slim --memory 1024",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			if b.FromImage == "" {
				return errors.New("--from-image is required (e.g. ubuntu:24.04)")
			}
			b.Name = args[0]
			c, err := newClient()
			if err != nil {
				return err
			}
			ref, err := c.StartBuild(cmd.Context(), b)
			if errors.Is(err, client.ErrUnsupported) {
				return fmt.Errorf("%w: this aenvd cannot build templates yet", err)
			}
			if err != nil {
				return err
			}
			errw := cmd.ErrOrStderr()
			var bar *progressbar.ProgressBar
			if f, ok := errw.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
				bar = progressbar.NewOptions(-1, progressbar.OptionSetWriter(f), progressbar.OptionSpinnerType(14),
					progressbar.OptionSetDescription("building "+b.Name), progressbar.OptionSetElapsedTime(true))
			}
			offset := 0
			for {
				st, err := c.BuildStatus(cmd.Context(), ref, offset)
				if err != nil {
					return err
				}
				if bar != nil && len(st.LogEntries) > 0 {
					_ = bar.Clear()
				}
				for _, l := range st.LogEntries {
					fmt.Fprintln(errw, strings.TrimRight(l.Message, "\n"))
				}
				offset += len(st.LogEntries)
				switch st.Status {
				case "ready":
					if bar != nil {
						_ = bar.Finish()
						fmt.Fprintln(errw)
					}
					res := buildResult{BuildRef: ref, Status: st.Status}
					if o.json() {
						return printJSON(cmd.OutOrStdout(), res)
					}
					return table(cmd.OutOrStdout(), []string{"TEMPLATE ID", "BUILD ID", "STATUS"}, [][]string{{ref.TemplateID, ref.BuildID, st.Status}})
				case "error":
					if bar != nil {
						_ = bar.Clear()
					}
					reason := "no reason given"
					if st.Reason != nil && st.Reason.Message != "" {
						reason = st.Reason.Message
					}
					return fmt.Errorf("build %s of template %s failed: %s (see the build log above)", ref.BuildID, b.Name, reason)
				}
				if bar != nil {
					_ = bar.Add(1)
				}
				select {
				case <-cmd.Context().Done():
					return fmt.Errorf("follow build %s of template %s: %w (the build goes on on the server)", ref.BuildID, b.Name, cmd.Context().Err())
				case <-time.After(poll):
				}
			}
		},
	}
	cmd.Flags().StringVar(&b.FromImage, "from-image", "", "container image to build from")
	cmd.Flags().Int32Var(&b.CPUCount, "cpu", 0, "vCPUs of the template's sandboxes (default: the server's)")
	cmd.Flags().Int32Var(&b.MemoryMB, "memory", 0, "memory in MiB of the template's sandboxes (default: the server's)")
	cmd.Flags().StringVar(&b.StartCmd, "start-cmd", "", "command started in the template before the snapshot")
	cmd.Flags().StringVar(&b.ReadyCmd, "ready-cmd", "", "command that succeeds once the start command is ready")
	cmd.Flags().DurationVar(&poll, "poll", time.Second, "status poll interval")
	o.register(cmd)
	return cmd
}
