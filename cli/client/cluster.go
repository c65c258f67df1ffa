package client

import (
	"context"
	"net/url"

	"github.com/agentenv/agentenv/api"
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
	api.Node
	Cluster *NodeCluster `json:"cluster,omitempty"`
}

// ClusterNodes lists the nodes with their cluster view (nil on a single
// node).
func (c *Client) ClusterNodes(ctx context.Context) ([]ClusterNode, error) {
	out := []ClusterNode{}
	_, _, err := c.do(ctx, "list nodes", "GET", "/nodes", nil, &out)
	return out, err
}

// Drain sets (or with drain false clears) a cluster node's drain flag
// through the gateway: placement sends it no new sandbox.
func (c *Client) Drain(ctx context.Context, name string, drain bool) (NodeCluster, error) {
	method := "POST"
	if !drain {
		method = "DELETE"
	}
	var out NodeCluster
	_, _, err := c.do(ctx, "drain node "+name, method, "/nodes/"+url.PathEscape(name)+"/drain", nil, &out)
	return out, err
}
