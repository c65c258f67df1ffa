package sandboxcmd

import (
	"time"

	"github.com/agentenv/agentenv/cli/client"
	"github.com/spf13/cobra"
)

func templateWatchCmd() *cobra.Command {
	var poll time.Duration
	var o output
	cmd := &cobra.Command{
		Use:   "watch TEMPLATE_ID BUILD_ID",
		Short: "Follow a template build's log until it is ready or fails",
		Args:  cobra.ExactArgs(2),
		RunE: withClient(&o, func(cmd *cobra.Command, args []string, c *client.Client) error {
			return finishBuild(cmd, c, client.BuildRef{TemplateID: args[0], BuildID: args[1]}, "", poll, &o)
		}),
	}
	cmd.Flags().DurationVar(&poll, "poll", time.Second, "status poll interval")
	o.register(cmd)
	return cmd
}
