package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
)

// TestFilesBackend runs a second aenvd with storage.backend = "files", the
// former name of "local": the storage daemon runs inside aenvd, its state
// under <data_dir>/storage. Create, write, pause, connect, read; then a
// SIGKILL of aenvd takes the daemon's exports with it, and the next aenvd
// serves them again on the same sockets: the running VM reconnects and its
// disk reads and writes as before. Then kill.
func TestFilesBackend(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("aenvd needs root")
	}
	guestassets.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	n := ownNode(ctx, t, aenvdtest.Options{Prefix: "adfiles", CIDRBase: 85, Env: []string{"AENVD_STORAGE_BACKEND=files"}})
	var nodes []struct {
		Disks struct {
			Backend string `json:"backend"`
		} `json:"disks"`
	}
	if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/nodes", n.key, ""), &nodes); err != nil || len(nodes) != 1 || nodes[0].Disks.Backend != "local" {
		t.Fatalf("/nodes: %+v %v, want the local disk backend", nodes, err)
	}
	if _, err := os.Stat(filepath.Join(n.DataDir, "storage", "state", "lock")); err != nil {
		t.Fatalf("in-process storage daemon: no state directory under the data dir: %v", err)
	}
	if _, err := os.Stat(filepath.Join(n.DataDir, "storaged")); !os.IsNotExist(err) {
		t.Fatalf("the local backend started aenv-storaged's directory: %v", err)
	}
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	n.writeFile(t, id, "/home/user/f.txt", "on a local daemon disk")
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":300}`)
	if got := n.readFile(t, id, "/home/user/f.txt"); got != "on a local daemon disk" {
		t.Fatalf("file after pause and resume: %q", got)
	}

	n.writeFile(t, id, "/home/user/g.txt", "before the crash")
	if _, err := n.Sh(ctx, id, "sync"); err != nil {
		t.Fatal(err)
	}
	n.restart(t, syscall.SIGKILL)
	n.waitState(t, id, "running", time.Minute)
	if got := n.readFile(t, id, "/home/user/g.txt"); got != "before the crash" {
		t.Fatalf("file after aenvd's crash: %q", got)
	}
	if out, err := n.Sh(ctx, id, "echo after > /home/user/h.txt && sync && cat /home/user/h.txt"); err != nil || out != "after\n" {
		t.Fatalf("write after aenvd's crash: %q %v", out, err)
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
	if _, err := os.Stat(n.DataDir + "/sandboxes/" + id); !os.IsNotExist(err) {
		t.Fatalf("sandbox dir after kill: %v", err)
	}
}
