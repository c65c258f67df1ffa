package sandboxcmd

import (
	"errors"
	"fmt"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/cli/client"
	"github.com/spf13/cobra"
)

// resizeCmd resizes a running sandbox's guest memory, or shows it.
func resizeCmd() *cobra.Command {
	var mib int
	var o output
	cmd := &cobra.Command{
		Use:   "resize SANDBOX_ID [--memory MiB]",
		Short: "Resize a running sandbox's memory, or show it",
		Long: `Resize the running sandbox's guest memory to MiB, from 128 up to its ceiling (the
RAM its VM started with, its template's memory). The guest gives memory back to
the node or takes it again; the command waits until it has the new size or its
memory stopped moving, and prints what it has then: a partial resize (the guest
holds memory it cannot free) stops where the guest keeps 32 MiB available. The size is kept
across pause, resume, snapshot and fork, and the node counts the sandbox at it.
Without --memory the command shows the ceiling, the target and, while the sandbox
runs, the guest's memory now. The node's VMM must be QEMU.`,
		Example: "  aenv resize SANDBOX_ID --memory 256\n  aenv resize SANDBOX_ID",
		Args:    cobra.ExactArgs(1),
		RunE: withClient(&o, func(cmd *cobra.Command, args []string, c *client.Client) error {
			var m wire.SandboxMemory
			var err error
			if cmd.Flags().Changed("memory") {
				if mib <= 0 {
					return errors.New("--memory needs a size in MiB, such as 256")
				}
				m, err = c.ResizeMemory(cmd.Context(), args[0], mib)
			} else {
				m, err = c.Memory(cmd.Context(), args[0])
			}
			if err != nil {
				return err
			}
			return printMemory(cmd, &o, m)
		}),
	}
	cmd.Flags().IntVar(&mib, "memory", 0, "the guest memory to run on, MiB (128 up to the sandbox's ceiling)")
	o.register(cmd)
	return cmd
}

func printMemory(cmd *cobra.Command, o *output, m wire.SandboxMemory) error {
	w := cmd.OutOrStdout()
	if o.json() {
		return printJSON(w, m)
	}
	fmt.Fprintf(w, "Ceiling: %d MiB\n", m.CeilingMB)
	if m.RequestedMB != nil {
		fmt.Fprintf(w, "Requested: %d MiB\n", *m.RequestedMB)
	}
	fmt.Fprintf(w, "Target: %d MiB\n", m.TargetMB)
	if m.ActualMB == nil {
		fmt.Fprintln(w, "Guest memory: (not running)")
		return nil
	}
	state := "reached"
	if m.Complete != nil && !*m.Complete {
		state = "partial: the guest holds memory it cannot free"
	}
	fmt.Fprintf(w, "Guest memory: %d MiB (%s)\n", *m.ActualMB, state)
	return nil
}
