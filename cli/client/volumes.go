package client

import (
	"context"
	"net/url"

	"github.com/agentenv/agentenv/api/wire"
)

// Volumes lists the node's volumes.
func (c *Client) Volumes(ctx context.Context) ([]wire.Volume, error) {
	out := []wire.Volume{}
	_, _, err := c.do(ctx, "list volumes", "GET", "/volumes", nil, &out)
	return out, err
}

// CreateVolume creates a blank volume.
func (c *Client) CreateVolume(ctx context.Context, req wire.NewVolume) (wire.VolumeAndToken, error) {
	var out wire.VolumeAndToken
	_, _, err := c.do(ctx, "create volume "+req.Name, "POST", "/volumes", req, &out)
	return out, err
}

// DeleteVolume deletes a volume (by id or name) with its data.
func (c *Client) DeleteVolume(ctx context.Context, ref string) error {
	_, _, err := c.do(ctx, "delete volume "+ref, "DELETE", "/volumes/"+url.PathEscape(ref), nil, nil)
	return err
}
