package sandboxcmd

import (
	"strings"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/cli/client"
	"github.com/spf13/cobra"
)

// webhookCmd is `aenv webhook create|list|rm`: the node's lifecycle
// webhooks (E2B's /events/webhooks).
func webhookCmd() *cobra.Command {
	root := &cobra.Command{Use: "webhook", Short: "Register, list and remove sandbox lifecycle webhooks"}
	var name, secret string
	var events []string
	var co, lo output
	create := &cobra.Command{
		Use:   "create URL",
		Short: "Register a webhook for sandbox lifecycle events",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(&co, func(cmd *cobra.Command, args []string, c *client.Client) error {
			req := wire.WebhookCreate{Url: args[0], Events: events}
			if name != "" {
				req.Name = &name
			}
			if secret != "" {
				req.SignatureSecret = &secret
			}
			h, err := c.CreateWebhook(cmd.Context(), req)
			if err != nil {
				return err
			}
			if co.json() {
				return printJSON(cmd.OutOrStdout(), h)
			}
			return table(cmd.OutOrStdout(), webhookHeader, [][]string{webhookRow(h)})
		}),
	}
	create.Flags().StringVar(&name, "name", "", "name of the webhook")
	create.Flags().StringVar(&secret, "secret", "", "signature secret (deliveries carry e2b-signature)")
	create.Flags().StringSliceVar(&events, "event", []string{"sandbox.lifecycle.created", "sandbox.lifecycle.killed",
		"sandbox.lifecycle.paused", "sandbox.lifecycle.resumed", "sandbox.lifecycle.forked"}, "event types to deliver (repeatable)")
	co.register(create)
	list := &cobra.Command{
		Use:   "list",
		Short: "List the webhooks",
		Args:  cobra.NoArgs,
		RunE: withClient(&lo, func(cmd *cobra.Command, _ []string, c *client.Client) error {
			hs, err := c.Webhooks(cmd.Context())
			if err != nil {
				return err
			}
			return printList(cmd.OutOrStdout(), &lo, hs, webhookHeader, webhookRow)
		}),
	}
	lo.register(list)
	rm := &cobra.Command{
		Use:   "rm WEBHOOK_ID...",
		Short: "Remove webhooks (their pending deliveries are dropped)",
		Args:  cobra.MinimumNArgs(1),
		RunE: withClient(nil, func(cmd *cobra.Command, args []string, c *client.Client) error {
			for _, id := range args {
				if err := c.DeleteWebhook(cmd.Context(), id); err != nil {
					return err
				}
			}
			return nil
		}),
	}
	root.AddCommand(create, list, rm)
	return root
}

var webhookHeader = []string{"WEBHOOK ID", "NAME", "URL", "ENABLED", "EVENTS"}

func webhookRow(h wire.WebhookConfig) []string {
	enabled := "yes"
	if !h.Enabled {
		enabled = "no"
	}
	return []string{h.Id, orDash(h.Name), h.Url, enabled, strings.Join(h.Events, ",")}
}
