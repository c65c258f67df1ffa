package e2e

import (
	"context"

	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRestartKill9 kills aenvd with SIGKILL while it has a paused and a
// running sandbox, and starts it again on the same data directory: both are
// listed (paused) and usable after connect.
func TestRestartKill9(t *testing.T) {
	n := sharedNode(t)
	paused := n.create(t, `{"templateID":"base","timeout":300}`)
	running := n.create(t, `{"templateID":"base","timeout":300}`)
	n.writeFile(t, paused, "/home/user/p.txt", "kept across the restart")
	n.writeFile(t, running, "/home/user/r.txt", "running before the restart")
	n.sh(t, running, `echo in-memory > /dev/shm/r`)
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+paused+"/pause", n.key, "")
	// A storage device no sandbox holds (as a crash between creating and
	// recording one leaves): the restart reclaims it.
	sd := n.storaged(t)
	orphan, err := sd.Create(t.Context(), rpc.CreateParams{Image: filepath.Join(n.DataDir, "templates", "base", "rootfs-1.json"), Owner: "orphan"})
	if err != nil {
		t.Fatalf("create an orphan storage device: %v", err)
	}
	if devs, err := sd.List(t.Context()); err != nil || !slices.ContainsFunc(devs, func(d rpc.Device) bool { return d.ID == orphan.ID }) {
		t.Fatalf("the storage daemon does not list the orphan device %d: %+v %v", orphan.ID, devs, err)
	}

	n.restart(t, syscall.SIGKILL)
	devs, err := sd.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if d.ID == orphan.ID || d.Owner == "orphan" {
			t.Fatalf("orphan storage device %d survived the restart: %+v", orphan.ID, d)
		}
	}

	// The paused sandbox survives: listed as paused, resumable, its files intact.
	n.waitState(t, paused, "paused", time.Second)
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+paused+"/connect", n.key, `{"timeout":60}`)
	if got := n.readFile(t, paused, "/home/user/p.txt"); got != "kept across the restart" {
		t.Fatalf("file of the paused sandbox after restart: %q", got)
	}
	// The running one was adopted, snapshotted and kept as paused: its old
	// VMM process is gone, and it resumes with its files.
	n.waitState(t, running, "paused", time.Second)
	if pids := processesMentioning(running); len(pids) > 0 {
		t.Fatalf("VMM processes of sandbox %s still run after recovery: %v", running, pids)
	}
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+running+"/connect", n.key, `{"timeout":60}`)
	if got := n.readFile(t, running, "/home/user/r.txt"); got != "running before the restart" {
		t.Fatalf("file of the running sandbox after restart: %q", got)
	}
	// Its memory came through too: recovery captured it as a memory layer.
	if got := n.sh(t, running, `cat /dev/shm/r`); got != "in-memory" {
		t.Fatalf("tmpfs of the running sandbox after restart: %q", got)
	}
	if mem, _ := n.layerFiles(t, running); mem != 1 {
		t.Fatalf("recovery left %d memory layers in the sandbox, want 1", mem)
	}
	for _, id := range []string{paused, running} {
		n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
	}
}

func (n *node) writeFile(t *testing.T, id, path, content string) {
	t.Helper()
	req, _ := http.NewRequest("POST", n.proxy+"/files?path="+path, strings.NewReader(content))
	req.Header.Set("Content-Type", "application/octet-stream")
	n.sandboxHeaders(req, id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("write %s in %s: %v", path, id, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("write %s in %s: %d %s", path, id, resp.StatusCode, b)
	}
}

func (n *node) readFile(t *testing.T, id, path string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", n.proxy+"/files?path="+path, nil)
	n.sandboxHeaders(req, id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("read %s in %s: %v", path, id, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("read %s in %s: %d %s", path, id, resp.StatusCode, b)
	}
	return string(b)
}

func (n *node) sandboxHeaders(req *http.Request, id string) {
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
}

// processesMentioning lists pids whose command line contains s.
func processesMentioning(s string) []string {
	var out []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err == nil && strings.Contains(string(b), s) {
			out = append(out, filepath.Base(d))
		}
	}
	return out
}

// restart stops aenvd with sig and starts it again on the same data directory.
func (n *node) restart(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := n.Stop(sig); err != nil {
		t.Fatalf("stop aenvd with %s: %v\n%s", sig, err, n.Logs())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := n.Restart(ctx, 3*time.Minute); err != nil {
		t.Fatalf("restart aenvd: %v", err)
	}
}

// TestRestartGraceful: SIGTERM pauses running sandboxes (the default), and
// they come back paused and resumable.
func TestRestartGraceful(t *testing.T) {
	n := sharedNode(t)
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	n.writeFile(t, id, "/home/user/g.txt", "graceful")
	pausedLine := `msg="sandbox paused" component=orchestrator sandbox=` + id
	before := strings.Count(n.Logs(), pausedLine)
	n.restart(t, syscall.SIGTERM)
	if strings.Count(n.Logs(), pausedLine) != before+1 || strings.Contains(n.Logs(), "re-adopted sandbox after restart and kept it paused\" sandbox="+id) {
		t.Fatalf("graceful shutdown did not pause sandbox %s itself", id)
	}
	n.waitState(t, id, "paused", time.Second)
	n.expect(t, http.StatusCreated, "POST", "/v2/sandboxes/"+id+"/connect", n.key, `{"timeout":60}`)
	if got := n.readFile(t, id, "/home/user/g.txt"); got != "graceful" {
		t.Fatalf("file after graceful restart: %q", got)
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
}

// storaged connects to the node's storage daemon.
func (n *node) storaged(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.Dial(t.Context(), filepath.Join(n.DataDir, "storaged", "storaged.sock"))
	if err != nil {
		t.Fatalf("dial the storage daemon: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
