package client

import (
	"context"
	"net/url"

	"github.com/agentenv/agentenv/api/wire"
)

// Memory reads a sandbox's memory ceiling, target and, while it runs, what
// its guest has (an aenvd extension).
func (c *Client) Memory(ctx context.Context, id string) (wire.SandboxMemory, error) {
	var out wire.SandboxMemory
	_, _, err := c.do(ctx, "get the memory of sandbox "+id, "GET", "/sandboxes/"+url.PathEscape(id)+"/memory", nil, &out)
	return out, err
}

// ResizeMemory resizes a running sandbox's guest memory to mib MiB and
// answers with what the guest has once it settled.
func (c *Client) ResizeMemory(ctx context.Context, id string, mib int) (wire.SandboxMemory, error) {
	var out wire.SandboxMemory
	_, _, err := c.do(ctx, "resize the memory of sandbox "+id, "PATCH", "/sandboxes/"+url.PathEscape(id)+"/memory", wire.SandboxMemoryUpdate{MemoryMB: int32(mib)}, &out)
	return out, err
}
