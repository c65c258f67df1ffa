package client

import (
	"context"

	"github.com/agentenv/agentenv/api/wire"
)

// CreateCompose starts a Compose project in one sandbox (an aenvd
// extension); the node validates the file first.
func (c *Client) CreateCompose(ctx context.Context, req wire.NewComposeSandbox) (wire.Sandbox, error) {
	var s wire.Sandbox
	_, _, err := c.do(ctx, "start a compose project", "POST", "/sandboxes-compose", req, &s)
	return s, err
}
