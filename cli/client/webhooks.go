package client

import (
	"context"
	"net/url"

	"github.com/agentenv/agentenv/api/wire"
)

// Webhooks lists the node's lifecycle webhooks.
func (c *Client) Webhooks(ctx context.Context) ([]wire.WebhookConfig, error) {
	out := []wire.WebhookConfig{}
	_, _, err := c.do(ctx, "list webhooks", "GET", "/events/webhooks", nil, &out)
	return out, err
}

// CreateWebhook registers a lifecycle webhook.
func (c *Client) CreateWebhook(ctx context.Context, req wire.WebhookCreate) (wire.WebhookConfig, error) {
	var out wire.WebhookConfig
	_, _, err := c.do(ctx, "create webhook", "POST", "/events/webhooks", req, &out)
	return out, err
}

// DeleteWebhook unregisters a lifecycle webhook.
func (c *Client) DeleteWebhook(ctx context.Context, id string) error {
	_, _, err := c.do(ctx, "delete webhook "+id, "DELETE", "/events/webhooks/"+url.PathEscape(id), nil, nil)
	return err
}
