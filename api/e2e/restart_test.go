package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/vmmproc"
	"github.com/agentenv/agentenv/sandbox"

	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/store"
)

// TestRestartKill9 kills aenvd with SIGKILL while it has a paused and a
// running sandbox, and starts it again on the same data directory: the
// paused one is listed as paused and resumes; the running one keeps running
// in the same VMM process (its processes never stop), with its network slot,
// access token and egress policy.
func TestRestartKill9(t *testing.T) {
	n := sharedNode(t)
	paused := n.create(t, `{"templateID":"base","timeout":300}`)
	running, token := n.createToken(t, `{"templateID":"base","timeout":300,"secure":true,"allow_internet_access":false}`)
	n.writeFile(t, paused, "/home/user/p.txt", "kept across the restart")
	if _, err := n.run(running, token, counterScript+`; echo in-memory > /dev/shm/r`); err != nil {
		t.Fatalf("start the counter: %v", err)
	}
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+paused+"/pause", n.key, "")
	vmmBefore := processesMentioning(running)
	if len(vmmBefore) == 0 {
		t.Fatalf("no VMM process of the running sandbox %s", running)
	}
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
	readCounter := func() int {
		t.Helper()
		out, err := n.run(running, token, `for i in $(seq 50); do [ -s /dev/shm/counter ] && break; sleep 0.1; done; cat /dev/shm/counter`)
		v, cerr := strconv.Atoi(out)
		if err != nil || cerr != nil {
			t.Fatalf("read the counter: %q %v", out, err)
		}
		return v
	}
	counterBefore := readCounter()

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
	// The running one runs on in the same VMM process: no pause, no new
	// memory layer, its counter moved on while aenvd was down.
	n.waitState(t, running, "running", time.Second)
	if after := processesMentioning(running); !slices.Equal(after, vmmBefore) {
		t.Fatalf("VMM processes of %s before the restart %v, after %v", running, vmmBefore, after)
	}
	if got, err := n.run(running, token, `cat /dev/shm/r`); err != nil || got != "in-memory" {
		t.Fatalf("tmpfs of the running sandbox after restart: %q %v\n%s", got, err, n.diagnose(running))
	}
	if after := readCounter(); after <= counterBefore {
		t.Fatalf("counter %d before the restart, %d after", counterBefore, after)
	}
	if mem, _, _, _ := n.layerFiles(t, running); mem != 0 {
		t.Fatalf("the running sandbox got %d memory layers across the restart, want none (it was never paused)", mem)
	}
	if _, err := n.run(running, "", `true`); err == nil {
		t.Fatal("the re-adopted secure sandbox's agent answers without its token")
	}
	// (Its egress policy, no internet, was set again on the adopted slot:
	// a failure there would have paused it. network's TestAdoptAfterCrash
	// checks that a policy set on an adopted slot holds.)
	// And it pauses and resumes as any other.
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+running+"/pause", n.key, "")
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+running+"/connect", n.key, `{"timeout":60}`)
	if got, err := n.run(running, token, `cat /dev/shm/r`); err != nil || got != "in-memory" {
		t.Fatalf("tmpfs of the re-adopted sandbox after pause and resume: %q %v", got, err)
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

// processesMentioning lists pids whose command line contains s, and VMM
// processes whose open files' paths do (vmmproc).
func processesMentioning(s string) []string {
	var out []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		if mentions(d, s) {
			out = append(out, filepath.Base(d))
		}
	}
	return out
}

// mentions reports whether the process at /proc/PID dir names s in its
// command line or, for a VMM, in the path of a file it holds open.
func mentions(dir, s string) bool {
	if vmmproc.IsVMM(dir) {
		return vmmproc.Mentions(dir, s)
	}
	b, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	return err == nil && strings.Contains(string(b), s)
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

// TestStorageWarmPool: after a create from a template, the storage daemon
// keeps ready root disks of that template (the warm pool), and the next
// create takes one of them as its device.
func TestStorageWarmPool(t *testing.T) {
	n := sharedNode(t)
	n.create(t, `{"templateID":"base","timeout":120}`)
	sd := n.storaged(t)
	pooled := func() []rpc.Device {
		devs, err := sd.List(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var out []rpc.Device
		for _, d := range devs {
			if d.Kind == rpc.KindPool && strings.Contains(d.Image, filepath.Join("templates", "base")) {
				out = append(out, d)
			}
		}
		return out
	}
	deadline := time.Now().Add(time.Minute)
	for len(pooled()) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the base template's warm pool has %d devices a minute after the first create, want at least 2", len(pooled()))
		}
		time.Sleep(100 * time.Millisecond)
	}
	ready := map[uint32]bool{}
	for _, d := range pooled() {
		ready[d.ID] = true
	}
	id := n.create(t, `{"templateID":"base","timeout":120}`)
	devs, err := sd.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if d.Owner == id {
			if !ready[d.ID] {
				t.Fatalf("sandbox %s got device %d, not one of the pool's %v", id, d.ID, ready)
			}
			return
		}
	}
	t.Fatalf("no storage device owned by sandbox %s", id)
}

// TestRestartKill9SlotLost: when a running sandbox's network slot did not
// survive aenvd's crash (its namespace was deleted meanwhile), the restarted
// node cannot keep the sandbox running; it pauses it instead (memory and
// disk captured from the still running VM), and it resumes with its state.
func TestRestartKill9SlotLost(t *testing.T) {
	n := sharedNode(t)
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	n.sh(t, id, counterScript+`; echo lost-slot > /dev/shm/s; echo disk > /home/user/s.txt`)
	if err := n.Stop(syscall.SIGKILL); err != nil {
		t.Fatalf("kill aenvd: %v", err)
	}
	st, err := store.Open(filepath.Join(n.DataDir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	var rec sandbox.Record
	err = st.Get(store.Sandboxes, id, &rec)
	st.Close()
	if err != nil || rec.Slot == 0 {
		t.Fatalf("record of %s: slot %d, %v", id, rec.Slot, err)
	}
	ns := fmt.Sprintf("adtest-%d", rec.Slot)
	if out, err := exec.Command("ip", "netns", "delete", ns).CombinedOutput(); err != nil {
		t.Fatalf("delete the slot namespace %s: %v %s", ns, err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := n.Restart(ctx, 3*time.Minute); err != nil {
		t.Fatalf("restart aenvd: %v", err)
	}
	n.waitState(t, id, "paused", time.Second)
	if pids := processesMentioning(id); len(pids) > 0 {
		t.Fatalf("VMM processes of %s still run after it was paused: %v", id, pids)
	}
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":60}`)
	if got := n.sh(t, id, `cat /dev/shm/s /home/user/s.txt`); got != "lost-slot\ndisk" {
		t.Fatalf("sandbox paused after losing its slot resumed with %q\n%s", got, n.diagnose(id))
	}
	n.counter(t, id)
}
