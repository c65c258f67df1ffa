package sandboxcmd

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/cli/client"
	"github.com/spf13/cobra"
)

// pinCmd shows or sets the host CPUs a sandbox's vCPUs are pinned to.
func pinCmd() *cobra.Command {
	var cpus string
	var unpin bool
	var o output
	cmd := &cobra.Command{
		Use:   "pin SANDBOX_ID [--cpus LIST | --unpin]",
		Short: "Pin a sandbox's vCPUs to host CPUs, or show its pinning",
		Long: `Pin the sandbox's vCPU threads to the node's CPUs in LIST (cpulist syntax:
CPUs and inclusive ranges, comma separated, such as 0-1,3). The pinning is kept
in the sandbox's record and set again on each resume; a paused sandbox keeps it
for its resume; forks and snapshots' sandboxes start unpinned. Without --cpus or
--unpin the command shows the pinning and, while the sandbox runs, each vCPU's
host thread and the CPUs it may run on now. The node's VMM must be QEMU.`,
		Example: "  aenv pin SANDBOX_ID --cpus 0-1\n  aenv pin SANDBOX_ID --unpin\n  aenv pin SANDBOX_ID",
		Args:    cobra.ExactArgs(1),
		RunE: withClient(&o, func(cmd *cobra.Command, args []string, c *client.Client) error {
			set := cmd.Flags().Changed("cpus")
			if set && unpin {
				return errors.New("use either --cpus or --unpin")
			}
			if set && cpus == "" {
				return errors.New(`--cpus needs a list such as 0-1,3 (--unpin removes the pinning)`)
			}
			var p wire.SandboxCPUs
			var err error
			switch {
			case set:
				p, err = c.PinCPUs(cmd.Context(), args[0], cpus)
			case unpin:
				p, err = c.PinCPUs(cmd.Context(), args[0], "")
			default:
				p, err = c.CPUs(cmd.Context(), args[0])
			}
			if err != nil {
				return err
			}
			return printPinning(cmd, &o, p)
		}),
	}
	cmd.Flags().StringVar(&cpus, "cpus", "", "host CPUs to pin the vCPUs to (cpulist syntax, such as 0-1,3)")
	cmd.Flags().BoolVar(&unpin, "unpin", false, "remove the pinning: the vCPUs may run on every CPU of the node")
	o.register(cmd)
	return cmd
}

func printPinning(cmd *cobra.Command, o *output, p wire.SandboxCPUs) error {
	w := cmd.OutOrStdout()
	if o.json() {
		return printJSON(w, p)
	}
	pin := p.Pin
	if pin == "" {
		pin = "(not pinned)"
	}
	fmt.Fprintf(w, "vCPUs: %d\nPinned to: %s\n", p.Vcpus, pin)
	if p.Threads == nil {
		return nil
	}
	rows := make([][]string, 0, len(*p.Threads))
	for _, t := range *p.Threads {
		rows = append(rows, []string{strconv.Itoa(int(t.Vcpu)), strconv.Itoa(int(t.ThreadID)), t.Cpus})
	}
	return table(w, []string{"VCPU", "THREAD", "CPUS"}, rows)
}
