package sandboxcmd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/agentenv/agentenv/cli/client"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// buildResult is what the build commands print.
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
			if b.FromImage == "" && b.FromTemplate == "" {
				return errors.New("--from-image is required (e.g. ubuntu:24.04)")
			}
			b.Name = args[0]
			return ServerBuild(cmd, b, poll, o.format)
		},
	}
	cmd.Flags().StringVar(&b.FromImage, "from-image", "", "container image to build from")
	cmd.Flags().StringVar(&b.FromTemplate, "from-template", "", "existing template to build on")
	buildFlags(cmd, &b, &poll)
	cmd.Flags().StringVar(&b.StartCmd, "start-cmd", "", "command started in the template before the snapshot")
	o.register(cmd)
	return cmd
}

// buildFlags registers the flags every build command shares.
func buildFlags(cmd *cobra.Command, b *client.BuildRequest, poll *time.Duration) {
	cmd.Flags().Int32Var(&b.CPUCount, "cpu", 0, "vCPUs of the template's sandboxes (default: the server's)")
	cmd.Flags().Int32Var(&b.MemoryMB, "memory", 0, "memory in MiB of the template's sandboxes (default: the server's)")
	cmd.Flags().StringVar(&b.ReadyCmd, "ready-cmd", "", "command that succeeds once the start command is ready")
	cmd.Flags().DurationVar(poll, "poll", time.Second, "status poll interval")
}

// ServerBuild builds a template on aenvd from an image or template with no
// files to upload (`aenv pull`, `aenv template build`), follows its log on
// stderr and prints the result in format (table or json).
func ServerBuild(cmd *cobra.Command, b client.BuildRequest, poll time.Duration, format string) error {
	o := output{format: format}
	if err := o.validate(); err != nil {
		return err
	}
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
	fmt.Fprintf(cmd.ErrOrStderr(), "Building template %s (%s), build %s.\n", b.Name, ref.TemplateID, ref.BuildID)
	return finishBuild(cmd, c, ref, b.Name, poll, &o)
}

// finishBuild follows a started build and prints its result.
func finishBuild(cmd *cobra.Command, c *client.Client, ref client.BuildRef, name string, poll time.Duration, o *output) error {
	if err := followBuild(cmd, c, ref, name, poll); err != nil {
		return err
	}
	if o.json() {
		return printJSON(cmd.OutOrStdout(), buildResult{BuildRef: ref, Status: "ready"})
	}
	return table(cmd.OutOrStdout(), []string{"TEMPLATE ID", "BUILD ID", "STATUS"}, [][]string{{ref.TemplateID, ref.BuildID, "ready"}})
}

// terminal returns w as a terminal file, or nil when it is not one.
func terminal(w io.Writer) *os.File {
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return f
	}
	return nil
}

// followBuild streams a build's log to stderr until it is ready (nil) or
// failed (an error with the server's reason). On a terminal a spinner with
// the elapsed time shows while no log line arrives.
func followBuild(cmd *cobra.Command, c *client.Client, ref client.BuildRef, name string, poll time.Duration) error {
	if name == "" {
		name = ref.TemplateID
	}
	errw := cmd.ErrOrStderr()
	var bar *progressbar.ProgressBar
	if f := terminal(errw); f != nil {
		bar = progressbar.NewOptions(-1, progressbar.OptionSetWriter(f), progressbar.OptionSpinnerType(14),
			progressbar.OptionSetDescription("building "+name), progressbar.OptionSetElapsedTime(true),
			progressbar.OptionThrottle(100*time.Millisecond))
	}
	offset := 0
	for {
		st, err := c.BuildStatus(cmd.Context(), ref, offset)
		if err != nil {
			if bar != nil {
				_ = bar.Clear()
			}
			return err
		}
		if bar != nil && len(st.LogEntries) > 0 {
			_ = bar.Clear()
		}
		for _, l := range st.LogEntries {
			fmt.Fprintln(errw, logLine(l))
		}
		offset += len(st.LogEntries)
		final := st.Status == "ready" || st.Status == "error"
		if final && len(st.LogEntries) >= client.BuildLogPage {
			continue // the log comes in pages: drain it before the end
		}
		switch st.Status {
		case "ready":
			if bar != nil {
				_ = bar.Finish()
				fmt.Fprintln(errw)
			}
			return nil
		case "error":
			if bar != nil {
				_ = bar.Clear()
			}
			reason := "no reason given"
			if st.Reason != nil && st.Reason.Message != "" {
				reason = st.Reason.Message
				if st.Reason.Step != "" {
					reason = "step " + st.Reason.Step + ": " + reason
				}
			}
			return fmt.Errorf("build %s of template %s failed: %s (see the build log above)", ref.BuildID, name, reason)
		}
		if bar != nil {
			_ = bar.Add(1)
		}
		select {
		case <-cmd.Context().Done():
			if bar != nil {
				_ = bar.Clear()
			}
			return fmt.Errorf("follow build %s of template %s: %w (the build goes on on the server: `aenv template watch %s %s`)",
				ref.BuildID, name, cmd.Context().Err(), ref.TemplateID, ref.BuildID)
		case <-time.After(poll):
		}
	}
}

// logLine formats a build log entry: warnings and errors are marked.
func logLine(l client.BuildLog) string {
	msg := strings.TrimRight(l.Message, "\n")
	switch l.Level {
	case "warn", "error":
		return l.Level + ": " + msg
	}
	return msg
}
