package sandboxcmd

import (
	"errors"
	"fmt"
	"time"

	"github.com/agentenv/agentenv/cli/client"
	"github.com/spf13/cobra"
)

// The commands that change a running or paused sandbox's lifecycle: pause,
// resume, rm and timeout.

func pauseCmd() *cobra.Command {
	var noMemory bool
	cmd := &cobra.Command{
		Use:   "pause SANDBOX_ID...",
		Short: "Pause sandboxes (snapshot memory and disk, free the VM)",
		Args:  cobra.MinimumNArgs(1),
		RunE: withClient(nil, func(cmd *cobra.Command, args []string, c *client.Client) error {
			for _, id := range args {
				if err := c.Pause(cmd.Context(), id, !noMemory); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "Paused", id)
			}
			return nil
		}),
	}
	cmd.Flags().BoolVar(&noMemory, "no-memory", false,
		"keep only the filesystem: the resume cold-boots (no processes of before), and traffic does not auto-resume it")
	return cmd
}

func resumeCmd() *cobra.Command {
	var timeout string
	var noMemory bool
	var o output
	cmd := &cobra.Command{
		Use:   "resume SANDBOX_ID",
		Short: "Resume a paused sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			secs, err := seconds(timeout)
			if err != nil {
				return err
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			s, resumed, err := c.Connect(cmd.Context(), args[0], secs, !noMemory)
			if err != nil {
				return err
			}
			if !resumed && !o.json() {
				fmt.Fprintf(cmd.ErrOrStderr(), "Sandbox %s was already running.\n", args[0])
			}
			return printSandbox(cmd, &o, s)
		},
	}
	cmd.Flags().StringVar(&timeout, "timeout", "5m", "lifetime after resuming (seconds or duration)")
	cmd.Flags().BoolVar(&noMemory, "no-memory", false, "resume from the disk alone: cold-boot, leaving the memory image unused")
	o.register(cmd)
	return cmd
}

func rmCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "rm SANDBOX_ID...",
		Aliases: []string{"kill"},
		Short:   "Remove sandboxes",
		Args:    cobra.MinimumNArgs(1),
		RunE: withClient(nil, func(cmd *cobra.Command, args []string, c *client.Client) error {
			var errs []error
			for _, id := range args {
				if err := c.Kill(cmd.Context(), id); err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), "Removed", id)
			}
			return errors.Join(errs...)
		}),
	}
}

func timeoutCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "timeout SANDBOX_ID DURATION",
		Short:   "Set how long a sandbox still lives (seconds or a duration such as 10m)",
		Example: "  aenv timeout SANDBOX_ID 600\n  aenv timeout SANDBOX_ID 1h",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			secs, err := seconds(args[1])
			if err != nil {
				return err
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			if err := c.SetTimeout(cmd.Context(), args[0], secs); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Sandbox %s now ends in %s\n", args[0], time.Duration(secs)*time.Second)
			return nil
		},
	}
}
