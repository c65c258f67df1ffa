package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// volume serves the fake node's volumes: list, create, get and delete.
func (f *fakeNode) volume(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.volumes == nil {
		f.volumes = map[string]string{}
	}
	id := strings.TrimPrefix(r.URL.Path, "/volumes/")
	switch {
	case r.URL.Path == "/volumes" && r.Method == http.MethodPost:
		var v volumeEntry
		_ = json.NewDecoder(r.Body).Decode(&v)
		f.volumes[v.Name] = f.name + "-" + v.Name
		writeJSON(w, http.StatusCreated, volumeEntry{VolumeID: f.volumes[v.Name], Name: v.Name})
	case r.URL.Path == "/volumes":
		out := []volumeEntry{}
		for name, id := range f.volumes {
			out = append(out, volumeEntry{VolumeID: id, Name: name})
		}
		writeJSON(w, http.StatusOK, out)
	default:
		for name, vid := range f.volumes {
			if vid == id {
				if r.Method == http.MethodDelete {
					delete(f.volumes, name)
					w.WriteHeader(http.StatusNoContent)
					return
				}
				writeJSON(w, http.StatusOK, volumeEntry{VolumeID: vid, Name: name})
				return
			}
		}
		writeError(w, http.StatusNotFound, "volume "+id+" not found")
	}
}

// TestVolumesAcrossNodes: volumes made through the gateway land on a node,
// are listed together, reached by id on their node, named once in the
// cluster; a create mounting one goes to its node, one mounting volumes of
// two nodes or an unknown volume is refused.
func TestVolumesAcrossNodes(t *testing.T) {
	fx := newFixture(t, "a", "b")
	fx.nodes[0].volumes = map[string]string{"logs": "a-logs"}
	fx.nodes[1].volumes = map[string]string{"data": "b-data"}
	code, b, _ := fx.do(t, "POST", "/volumes", "", `{"name":"scratch"}`)
	var made volumeEntry
	if err := json.Unmarshal(b, &made); code != http.StatusCreated || err != nil || made.VolumeID == "" {
		t.Fatalf("create volume: %d %s", code, b)
	}
	if code, b, _ := fx.do(t, "POST", "/volumes", "", `{"name":"data"}`); code != http.StatusConflict {
		t.Fatalf("create of a name another node holds: %d %s, want 409", code, b)
	}
	code, b, _ = fx.do(t, "GET", "/volumes", "", "")
	var all []volumeEntry
	if err := json.Unmarshal(b, &all); code != http.StatusOK || err != nil || len(all) != 3 {
		t.Fatalf("list: %d %s, want both nodes' volumes", code, b)
	}
	if code, b, _ := fx.do(t, "GET", "/volumes/b-data", "", ""); code != http.StatusOK || !strings.Contains(string(b), `"data"`) {
		t.Fatalf("get b-data: %d %s", code, b)
	}
	scratchNode := strings.SplitN(made.VolumeID, "-", 2)[0]
	for _, tc := range []struct{ mounts, node string }{{"data", "b"}, {"scratch", scratchNode}} {
		body := fmt.Sprintf(`{"templateID":"base","volumeMounts":[{"name":%q,"path":"/mnt/v"}]}`, tc.mounts)
		code, b, _ := fx.do(t, "POST", "/sandboxes", "", body)
		var c created
		if err := json.Unmarshal(b, &c); code != http.StatusCreated || err != nil || !strings.HasPrefix(c.SandboxID, tc.node) {
			t.Fatalf("create mounting %s: %d %s, want it made on node %s", tc.mounts, code, b, tc.node)
		}
	}
	body := `{"templateID":"base","volumeMounts":[{"name":"data","path":"/a"},{"name":"logs","path":"/b"}]}`
	if code, b, _ := fx.do(t, "POST", "/sandboxes", "", body); code != http.StatusBadRequest {
		t.Fatalf("create mounting volumes of two nodes: %d %s, want 400", code, b)
	}
	if code, b, _ := fx.do(t, "POST", "/sandboxes", "", `{"templateID":"base","volumeMounts":[{"name":"nope","path":"/a"}]}`); code != http.StatusNotFound {
		t.Fatalf("create mounting an unknown volume: %d %s, want 404", code, b)
	}
	if code, _, _ := fx.do(t, "DELETE", "/volumes/b-data", "", ""); code != http.StatusNoContent || len(fx.nodes[1].volumes) != 0 {
		t.Fatalf("delete b-data: %d, node b keeps %v", code, fx.nodes[1].volumes)
	}
}
