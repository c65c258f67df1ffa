package gateway

import (
	"encoding/json"
	"net/http"
	"slices"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
)

// A volume lives on the node that made it: its layers are that node's
// files. The gateway lists every node's, routes a call on one to the node
// that holds it (the first that does not answer 404), places a new one as
// placement would a sandbox (unless the name is taken on any node), and
// sends a create that mounts volumes to the node holding them.

// volumeEntry is the part of a node's volume the gateway reads.
type volumeEntry struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
}

// volumeCreate is POST /volumes: refused when a node already has the
// name (names are unique cluster-wide, as on one node), else made on the
// node placement picks.
func (g *Gateway) volumeCreate(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var nv volumeEntry
	if err := json.Unmarshal(body, &nv); err != nil {
		writeError(w, http.StatusBadRequest, "volume body: "+err.Error())
		return
	}
	holders, ok := g.volumeHolders(w, r)
	if !ok {
		return
	}
	if _, taken := holders[nv.Name]; taken && nv.Name != "" {
		writeError(w, http.StatusConflict, "a volume named "+nv.Name+" exists")
		return
	}
	pl, err := g.place(r.Context(), &pb.Resources{}, nil, "")
	if err != nil {
		g.failPlace(w, err)
		return
	}
	g.unreserve(r.Context(), pl) // a volume is no sandbox: it takes none of the node's room
	resp, err := g.send(r, pl.url(), body)
	if err != nil {
		writeError(w, http.StatusBadGateway, "node unreachable: "+err.Error())
		return
	}
	relay(w, resp)
}

// volumeHolders maps every volume's name and id to the live node holding
// it.
func (g *Gateway) volumeHolders(w http.ResponseWriter, r *http.Request) (map[string]*pb.Node, bool) {
	list := r.Clone(r.Context())
	list.Method, list.URL.Path, list.Body = http.MethodGet, "/volumes", nil
	ans, ok := g.fanout(w, list, nil)
	if !ok {
		return nil, false
	}
	out := map[string]*pb.Node{}
	for _, a := range ans {
		for _, it := range g.items(a) {
			var v volumeEntry
			if json.Unmarshal(it, &v) == nil {
				out[v.Name], out[v.VolumeID] = a.node, a.node
			}
		}
	}
	return out, true
}

// volumeNodeExclusion is the Exclude list of a create that mounts volumes:
// every live node but the one holding them. A create mounting none has
// none; one whose volumes are on no node, or on different nodes, is
// answered here (ok false).
func (g *Gateway) volumeNodeExclusion(w http.ResponseWriter, r *http.Request, mounts []volumeEntry) (exclude []string, ok bool) {
	if len(mounts) == 0 {
		return nil, true
	}
	holders, ok := g.volumeHolders(w, r)
	if !ok {
		return nil, false
	}
	var at *pb.Node
	for _, m := range mounts {
		n := holders[m.Name]
		switch {
		case n == nil:
			writeError(w, http.StatusNotFound, "volume "+m.Name+" not found on any live node")
			return nil, false
		case at != nil && n.GetStatus().GetName() != at.GetStatus().GetName():
			writeError(w, http.StatusBadRequest, "the volumes of one sandbox must live on one node ("+m.Name+" does not)")
			return nil, false
		}
		at = n
	}
	nodes, err := g.liveNodes(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "scheduler unavailable: "+err.Error())
		return nil, false
	}
	for _, n := range nodes {
		if name := n.GetStatus().GetName(); name != at.GetStatus().GetName() && !slices.Contains(exclude, name) {
			exclude = append(exclude, name)
		}
	}
	return exclude, true
}
