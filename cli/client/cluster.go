package client

import (
	"context"
	"net/url"

	"github.com/agentenv/agentenv/api/wire"
)

// NodeCluster is what aenv-gateway adds to each node of /nodes: the
// scheduler's view of it. A single node's /nodes has none.
type NodeCluster struct {
	Name          string `json:"name"`
	State         string `json:"state"` // up, down
	Draining      bool   `json:"draining"`
	APIURL        string `json:"apiURL"`
	VMM           string `json:"vmm"`
	Bound         int32  `json:"boundSandboxes"`
	LastHeartbeat int64  `json:"lastHeartbeatUnixMs"`
}

// ClusterNode is a node of /nodes with its cluster view when the endpoint
// is a gateway.
type ClusterNode struct {
	wire.Node
	Cluster *NodeCluster `json:"cluster,omitempty"`
}

// ClusterNodes lists the nodes with their cluster view (nil on a single
// node).
func (c *Client) ClusterNodes(ctx context.Context) ([]ClusterNode, error) {
	out := []ClusterNode{}
	_, _, err := c.do(ctx, "list nodes", "GET", "/nodes", nil, &out)
	return out, err
}

// Node reads one node with its cluster view (nil on a single node).
func (c *Client) Node(ctx context.Context, id string) (ClusterNode, error) {
	var out ClusterNode
	_, _, err := c.do(ctx, "get node "+id, "GET", "/nodes/"+url.PathEscape(id), nil, &out)
	return out, err
}

// SetNodeStatus drains a node ("draining") or makes it ready ("ready"). A
// single aenvd refuses creates while draining; a gateway stops placing
// sandboxes on the node. Either way its sandboxes keep running.
func (c *Client) SetNodeStatus(ctx context.Context, id, status string) error {
	_, _, err := c.do(ctx, "set status of node "+id, "POST", "/nodes/"+url.PathEscape(id),
		wire.NodeStatusChange{Status: wire.NodeStatusChangeStatus(status)}, nil)
	return err
}
