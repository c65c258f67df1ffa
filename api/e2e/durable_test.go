package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/failpoint"
	_ "github.com/agentenv/agentenv/volume" // declares volume/... fault points
)

// TestVolumeCreateCrashMatrix kills aenvd at each fault point of a
// volume's create (volume/create/dir: its directory entry fsynced, before
// the base layer; volume/create/layer: the layer written, before the
// record), restarts it, and checks that the interrupted create left no
// volume and no directory, and that the name can be created again.
func TestVolumeCreateCrashMatrix(t *testing.T) {
	n := sharedNode(t)
	points := failpoint.Names("volume/create/")
	if len(points) < 2 {
		t.Fatalf("volume create fault points: %v", points)
	}
	for i, point := range points {
		t.Run(strings.TrimPrefix(point, "volume/"), func(t *testing.T) {
			name := fmt.Sprintf("crash-vcreate-%d", i)
			before := n.dataDirNames(t, "volumes")
			n.crashAt(t, point, func() { _, _, _, _ = n.Call("POST", "/volumes", n.key, `{"name":"`+name+`"}`) })
			n.expect(t, http.StatusNotFound, "GET", "/volumes/"+name, n.key, "")
			if after := n.dataDirNames(t, "volumes"); len(after) != len(before) {
				t.Fatalf("volume directories: %v before the crashed create at %s, %v after", before, point, after)
			}
			n.expect(t, http.StatusCreated, "POST", "/volumes", n.key, `{"name":"`+name+`","sizeMiB":64}`)
			n.expect(t, http.StatusNoContent, "DELETE", "/volumes/"+name, n.key, "")
		})
	}
}
