package e2e

import (
	"context"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
)

// TestFilesBackend runs a second aenvd with storage.backend = "files" (a
// sparse copy of the template's rootfs per sandbox): create, write, pause,
// connect, read, kill.
func TestFilesBackend(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("aenvd needs root")
	}
	guestassets.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	an, err := aenvdtest.Start(ctx, aenvdtest.Options{Prefix: "adfiles", CIDRBase: 85, Env: []string{"AENVD_STORAGE_BACKEND=files"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after the sandboxes' own cleanups
		if err := an.Close(); err != nil {
			t.Errorf("graceful shutdown: %v", err)
		}
	})
	n := &node{Node: an, api: an.API, proxy: an.Proxy, key: an.Key}
	id := n.create(t, `{"templateID":"base","timeout":120}`)
	if _, err := os.Stat(an.DataDir + "/sandboxes/" + id + "/rootfs.ext4"); err != nil {
		t.Fatalf("files backend: no per-sandbox rootfs file: %v", err)
	}
	n.writeFile(t, id, "/home/user/f.txt", "on a copied disk")
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":60}`)
	if got := n.readFile(t, id, "/home/user/f.txt"); got != "on a copied disk" {
		t.Fatalf("file after pause and resume: %q", got)
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
	if _, err := os.Stat(an.DataDir + "/sandboxes/" + id); !os.IsNotExist(err) {
		t.Fatalf("sandbox dir after kill: %v", err)
	}
}
