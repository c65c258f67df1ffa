package client

import (
	"context"
	"net/url"

	"github.com/agentenv/agentenv/api/wire"
)

// CPUs reads a sandbox's vCPU count and pinning (an aenvd extension).
func (c *Client) CPUs(ctx context.Context, id string) (wire.SandboxCPUs, error) {
	var out wire.SandboxCPUs
	_, _, err := c.do(ctx, "get the cpus of sandbox "+id, "GET", "/sandboxes/"+url.PathEscape(id)+"/cpus", nil, &out)
	return out, err
}

// PinCPUs pins a sandbox's vCPUs to the host CPUs of list (cpulist syntax;
// "" removes the pinning).
func (c *Client) PinCPUs(ctx context.Context, id, list string) (wire.SandboxCPUs, error) {
	var out wire.SandboxCPUs
	_, _, err := c.do(ctx, "pin the cpus of sandbox "+id, "PUT", "/sandboxes/"+url.PathEscape(id)+"/cpus", wire.SandboxCPUPin{Pin: list}, &out)
	return out, err
}
