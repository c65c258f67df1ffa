package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ClusterInfo is what the gateway adds to each node of /nodes (a
// "cluster" member beside the node's own fields).
type ClusterInfo struct {
	Name          string `json:"name"`
	State         string `json:"state"` // up, down
	Draining      bool   `json:"draining"`
	APIURL        string `json:"apiURL"`
	VMM           string `json:"vmm"`
	Bound         int32  `json:"boundSandboxes"`
	LastHeartbeat int64  `json:"lastHeartbeatUnixMs"`
}

func clusterInfo(n *pb.Node) ClusterInfo {
	st := "up"
	if n.GetState() != pb.NodeState_NODE_STATE_UP {
		st = "down"
	}
	return ClusterInfo{Name: n.GetStatus().GetName(), State: st, Draining: n.GetDraining(), APIURL: n.GetStatus().GetApiUrl(),
		VMM: n.GetStatus().GetVmm(), Bound: n.GetSandboxes(), LastHeartbeat: n.GetLastHeartbeatUnixMs()}
}

// nodes is GET /nodes: every node the scheduler knows; live ones with
// their own report (status "draining" when drained), down ones with what
// the scheduler last heard.
func (g *Gateway) nodes(w http.ResponseWriter, r *http.Request) {
	all, err := g.sched.ListNodes(r.Context(), &pb.ListNodesRequest{})
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "scheduler unavailable: "+status.Convert(err).Message())
		return
	}
	ans, ok := g.fanout(w, r, r.URL.Query())
	if !ok {
		return
	}
	reports := map[string]map[string]any{}
	for _, a := range ans {
		for _, it := range g.items(a) {
			var m map[string]any
			if json.Unmarshal(it, &m) == nil {
				reports[a.node.GetStatus().GetName()] = m
			}
		}
	}
	out := []map[string]any{}
	for _, n := range all.GetNodes() {
		name := n.GetStatus().GetName()
		m := reports[name]
		if m == nil {
			m = map[string]any{"nodeID": name, "status": "down", "version": n.GetStatus().GetVersion(),
				"vmm": map[string]any{"driver": n.GetStatus().GetVmm()}}
		}
		m["nodeID"] = name
		if n.GetDraining() && m["status"] == "ready" {
			m["status"] = "draining"
		}
		m["cluster"] = clusterInfo(n)
		out = append(out, m)
	}
	writeJSON(w, http.StatusOK, out)
}

// node is GET /nodes/{name} and POST /nodes/{name} {"status": "draining"
// or "ready"}: the request aenvd answers for itself, here setting or
// clearing the scheduler's drain flag so that placement sends the node no
// new sandbox. Drain is authorized by the nodes: the caller's credentials
// must be accepted by a live node's GET /nodes.
func (g *Gateway) node(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(r.URL.Path, "/nodes/")
	switch {
	case strings.Contains(name, "/"):
		writeError(w, http.StatusNotFound, "no route for "+r.Method+" "+r.URL.Path)
	case r.Method == http.MethodGet:
		g.getNode(w, r, name)
	case r.Method == http.MethodPost:
		g.setNodeStatus(w, r, name)
	default:
		writeError(w, http.StatusNotFound, "no route for "+r.Method+" "+r.URL.Path)
	}
}

func (g *Gateway) getNode(w http.ResponseWriter, r *http.Request, name string) {
	r.URL.Path = "/nodes"
	rw := &captureWriter{header: http.Header{}}
	g.nodes(rw, r)
	if rw.status != http.StatusOK {
		w.WriteHeader(rw.status)
		_, _ = w.Write(rw.body)
		return
	}
	var list []map[string]any
	_ = json.Unmarshal(rw.body, &list)
	for _, m := range list {
		if m["nodeID"] == name {
			writeJSON(w, http.StatusOK, m)
			return
		}
	}
	writeError(w, http.StatusNotFound, "node "+name+" not found")
}

// nodeStatusChange is the body of POST /nodes/{name}, as aenvd reads it.
type nodeStatusChange struct {
	Status string `json:"status"`
}

func (g *Gateway) setNodeStatus(w http.ResponseWriter, r *http.Request, name string) {
	if !g.authorized(w, r) {
		return
	}
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req nodeStatusChange
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "node status change: "+err.Error())
		return
	}
	if req.Status != "draining" && req.Status != "ready" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("status %q is not ready or draining", req.Status))
		return
	}
	_, err := g.sched.Drain(r.Context(), &pb.DrainRequest{Name: name, Draining: req.Status == "draining"})
	if status.Code(err) == codes.NotFound {
		writeError(w, http.StatusNotFound, "node "+name+" not found")
		return
	}
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "scheduler: "+status.Convert(err).Message())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// authorized checks the caller's credentials against a live node.
func (g *Gateway) authorized(w http.ResponseWriter, r *http.Request) bool {
	nodes, err := g.liveNodes(r.Context())
	if err != nil || len(nodes) == 0 {
		writeError(w, http.StatusServiceUnavailable, "no live node to check credentials with")
		return false
	}
	check := r.Clone(r.Context())
	check.URL.Path = "/nodes"
	a := g.get(check, nodes[0], nil)
	if a.err != nil {
		writeError(w, http.StatusServiceUnavailable, "credential check: "+a.err.Error())
		return false
	}
	if a.status != http.StatusOK {
		writeRaw(w, a)
		return false
	}
	return true
}

// captureWriter keeps a handler's answer in memory.
type captureWriter struct {
	header http.Header
	status int
	body   []byte
}

func (c *captureWriter) Header() http.Header { return c.header }
func (c *captureWriter) WriteHeader(s int)   { c.status = s }
func (c *captureWriter) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.body = append(c.body, b...)
	return len(b), nil
}
