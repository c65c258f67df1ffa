package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/agentenv/agentenv/api/webhooks" // declares the webhooks/... fault points
	"github.com/agentenv/agentenv/internal/failpoint"
	_ "github.com/agentenv/agentenv/orchestrator"   // declares the orchestrator/... fault points of the node's verbs
	_ "github.com/agentenv/agentenv/storage/daemon" // declares the storaged/... fault points
	_ "github.com/agentenv/agentenv/warmpool"       // declares the warmpool/... fault points
)

// guestData is what a crash test writes into a sandbox before the crash:
// a multi-MiB file of random bytes and a few small files, synced, with
// their checksums as the guest computed them.
type guestData struct {
	Tag  string `json:"tag"`
	Sums string `json:"sums"`
}

// writeData writes the data set tag into the sandbox and syncs it.
func (n *node) writeData(t *testing.T, id, tag string) guestData {
	t.Helper()
	script := fmt.Sprintf(`set -e; d=/home/user/%[1]s; mkdir -p $d
head -c 6291456 /dev/urandom > $d/big
for i in 1 2 3 4 5; do echo "%[1]s small $i" > $d/small-$i; done
sync; cd $d && sha256sum big small-*`, tag)
	return guestData{Tag: tag, Sums: n.sh(t, id, script)}
}

// checkData drops the guest's page cache and checks the data set reads back
// as written, and that ext4 reported no error.
func (n *node) checkData(t *testing.T, id string, want ...guestData) {
	t.Helper()
	n.sh(t, id, `sync; echo 3 > /proc/sys/vm/drop_caches`)
	for _, d := range want {
		got := n.sh(t, id, fmt.Sprintf(`cd /home/user/%s && sha256sum big small-*`, d.Tag))
		if got != d.Sums {
			t.Fatalf("sandbox %s: data set %s after the crash:\n%s\nwant\n%s\n%s", id, d.Tag, got, d.Sums, n.diagnose(id))
		}
	}
	if errs := n.sh(t, id, `dmesg | grep -c 'EXT4-fs error' || true`); errs != "0" {
		t.Fatalf("sandbox %s: the guest's ext4 reported %s errors:\n%s", id, errs, n.sh(t, id, `dmesg | grep -i ext4 | tail -20`))
	}
}

// crashAt arms point to crash aenvd, runs trigger (which the crash cuts
// off), waits for the process to die of SIGKILL and starts it again.
func (n *node) crashAt(t *testing.T, point string, trigger func()) {
	t.Helper()
	if err := n.Arm(point, "crash"); err != nil {
		t.Fatalf("arm %s: %v", point, err)
	}
	trigger()
	st, err := n.WaitExit(2 * time.Minute)
	if err != nil {
		t.Fatalf("crash at %s: %v\n%s", point, err, n.Logs())
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("aenvd ended with %v at %s, want SIGKILL from the fault point", st, point)
	}
	n.start(t)
}

// start starts aenvd again after it ended.
func (n *node) start(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := n.Restart(ctx, 3*time.Minute); err != nil {
		t.Fatalf("restart aenvd: %v", err)
	}
}

// listed returns the sandboxes GET /sandboxes lists (running and paused).
func (n *node) listed(t *testing.T) map[string]string {
	t.Helper()
	var all []sandboxJSON
	if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/v2/sandboxes?state=running,paused", n.key, ""), &all); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range all {
		out[s.SandboxID] = s.State
	}
	return out
}

// TestSnapshotThenCrashKeepsDisk is the regression test of a lost layer
// list: a snapshot of a running sandbox seals its disk's upper into a layer
// the sandbox's disk then stacks on; that list must be durable before the
// VM continues, or after a crash the next pause builds the disk without it
// and files written before the snapshot read back as zeros.
func TestSnapshotThenCrashKeepsDisk(t *testing.T) {
	n := sharedNode(t)
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	before := n.writeData(t, id, "before")
	var snap snapshotJSON
	b := n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/snapshots", n.key, `{}`)
	if err := json.Unmarshal(b, &snap); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.call(t, "DELETE", "/snapshots/"+snap.SnapshotID, n.key, "") })
	after := n.writeData(t, id, "after")
	n.restart(t, syscall.SIGKILL)
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":60}`)
	n.checkData(t, id, before, after)
	n.checkNoOrphans(t)
}

// TestCrashMatrix kills aenvd with SIGKILL at each fault point of create,
// pause, resume, snapshot, fork, kill and compaction (and, on a node with
// the warm pool on, of a create from the pool and of the pool's refill),
// restarts it, and checks that the
// sandbox exists (but a create that never answered), resumes, holds every
// byte written before the crash once the guest's cache is dropped, that
// ext4 saw no error, and that nothing is left that no sandbox owns.
func TestCrashMatrix(t *testing.T) {
	n := sharedNode(t)
	cases := map[string]func(t *testing.T, point string){
		"orchestrator/create/":   n.crashCreate,
		"orchestrator/pause/":    n.crashPause,
		"orchestrator/resume/":   n.crashResume,
		"orchestrator/snapshot/": n.crashSnapshot,
		"orchestrator/fork/":     n.crashFork,
		"orchestrator/kill/":     n.crashKill,
		"orchestrator/compact/":  n.crashCompact,
		"orchestrator/cpupin/":   n.crashCPUPin,
		"orchestrator/resize/":   n.crashResize,
		"webhooks/delivery/":     n.crashWebhook,
	}
	covered := 0
	for prefix, run := range cases {
		for _, point := range failpoint.Names(prefix) {
			covered++
			t.Run(strings.TrimPrefix(point, "orchestrator/"), func(t *testing.T) { run(t, point) })
			n.checkNoOrphans(t)
		}
	}
	// A filesystem-only pause (memory false) and its cold resume pass
	// these points (and no capture).
	cold := map[string]func(t *testing.T, point string){
		"orchestrator/pause/recorded": n.crashColdPause, "orchestrator/pause/sealed": n.crashColdPause,
		"orchestrator/pause/paused": n.crashColdPause, "orchestrator/pause/stopped": n.crashColdPause,
		"orchestrator/resume/recorded": n.crashColdResume, "orchestrator/resume/booted": n.crashColdResume,
	}
	for point, run := range cold {
		t.Run("cold/"+strings.TrimPrefix(point, "orchestrator/"), func(t *testing.T) { run(t, point) })
		n.checkNoOrphans(t)
	}
	// A sandbox whose VMM ended unasked keeps its disks through the
	// pause's points before its commit (lifecycle.Verbs.PauseExited).
	for _, point := range []string{"orchestrator/pause/recorded", "orchestrator/pause/sealed"} {
		t.Run("exited/"+strings.TrimPrefix(point, "orchestrator/"), func(t *testing.T) { n.crashExited(t, point) })
		n.checkNoOrphans(t)
	}
	if covered < 12 {
		t.Fatalf("the matrix covered %d fault points; the orchestrator declares %v", covered, failpoint.Names("orchestrator/"))
	}
	// A create and a resume served from the warm pool of VMM processes,
	// and the pool's refill, on a node with the pool on.
	p := poolNode(t)
	pool := []struct {
		prefix, label string
		run           func(t *testing.T, point string)
	}{
		{"orchestrator/create/", "pooled", p.crashPooledCreate}, {"orchestrator/pool/", "pooled", p.crashPooledCreate},
		{"warmpool/handed", "pooled", p.crashPooledCreate}, {"warmpool/fill/", "pooled", p.crashPoolFill},
		{"orchestrator/poolresume/", "pooled-resume", p.crashPooledResume}, {"orchestrator/pool/", "pooled-resume", p.crashPooledResume},
		{"warmpool/handed", "pooled-resume", p.crashPooledResume}, {"orchestrator/resume/restored", "pooled-resume", p.crashPooledResume},
		{"sandbox/pooled/", "pooled", p.crashPooledCreate}, {"sandbox/pooled/", "pooled-resume", p.crashPooledResume},
	}
	for _, c := range pool {
		for _, point := range failpoint.Names(c.prefix) {
			t.Run(c.label+"/"+strings.TrimPrefix(point, "orchestrator/"), func(t *testing.T) { c.run(t, point) })
			p.checkNoOrphans(t)
		}
	}
	// Paused memory is flattened in the background only where VMs map
	// flattened files (no shared exports).
	f := flatNode(t)
	for _, point := range failpoint.Names("orchestrator/flatten/") {
		t.Run("flat/"+strings.TrimPrefix(point, "orchestrator/"), func(t *testing.T) { f.crashFlatten(t, point) })
		f.checkNoOrphans(t)
	}
}

// crashWebhook: a kill's webhook delivery recorded before the crash is
// sent after the restart (at least once), naming the sandbox.
func (n *node) crashWebhook(t *testing.T, point string) {
	got := make(chan string, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		select {
		case got <- string(b):
		default:
		}
	}))
	defer srv.Close()
	var hook struct {
		ID string `json:"id"`
	}
	body := fmt.Sprintf(`{"name":"crash","url":%q,"events":["sandbox.lifecycle.killed"]}`, srv.URL+"/hook")
	if err := json.Unmarshal(n.expect(t, http.StatusCreated, "POST", "/events/webhooks", n.key, body), &hook); err != nil || hook.ID == "" {
		t.Fatalf("register webhook: %v", err)
	}
	defer n.expect(t, http.StatusNoContent, "DELETE", "/events/webhooks/"+hook.ID, n.key, "")
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	n.crashAt(t, point, func() { _, _, _, _ = n.Call("DELETE", "/sandboxes/"+id, n.key, "") })
	deadline := time.After(2 * time.Minute)
	for {
		select {
		case b := <-got:
			if strings.Contains(b, `"sandboxId":"`+id+`"`) && strings.Contains(b, "sandbox.lifecycle.killed") {
				return
			}
		case <-deadline:
			t.Fatalf("the killed event of %s recorded before the crash was not delivered after the restart\n%s", id, n.Logs())
		}
	}
}

func (n *node) crashCreate(t *testing.T, point string) {
	before := n.listed(t)
	n.crashAt(t, point, func() {
		if code, b, _, err := n.Call("POST", "/sandboxes", n.key, `{"templateID":"base","timeout":120}`); err == nil {
			t.Fatalf("create answered %d %s through a crash at %s", code, b, point)
		}
	})
	after := n.listed(t)
	for id := range after {
		if _, ok := before[id]; ok {
			continue
		}
		// Once "running" is durable the sandbox exists, answered or not.
		if !strings.HasSuffix(point, "/running") {
			t.Fatalf("a create that never answered left sandbox %s (%s)", id, after[id])
		}
		n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
	}
}

// crashPause and crashResume: the sandbox also has a blank drive
// (/dev/vdb), sealed and restored with the root disk: what was written on
// it survives too.
func (n *node) crashPause(t *testing.T, point string) {
	id := n.create(t, `{"templateID":"base","timeout":300,"drives":[{"sizeMiB":16}]}`)
	data := n.writeData(t, id, "p")
	drive := n.writeDrive(t, id)
	n.crashAt(t, point, func() { _, _, _, _ = n.Call("POST", "/sandboxes/"+id+"/pause", n.key, "") })
	n.resumeAndCheck(t, id, data)
	n.checkDrive(t, id, point, drive)
}

// crashResume resumes a memory pause; only a cold resume (memory false)
// passes resume/booted.
func (n *node) crashResume(t *testing.T, point string) {
	id := n.create(t, `{"templateID":"base","timeout":300,"drives":[{"sizeMiB":16}]}`)
	data := n.writeData(t, id, "r")
	drive := n.writeDrive(t, id)
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	body := `{"timeout":60}`
	if strings.HasSuffix(point, "/booted") {
		body = `{"timeout":60,"memory":false}`
	}
	n.crashAt(t, point, func() { _, _, _, _ = n.Call("POST", "/sandboxes/"+id+"/connect", n.key, body) })
	n.resumeAndCheck(t, id, data)
	n.checkDrive(t, id, point, drive)
}

// crashColdPause and crashColdResume: the same with a filesystem-only
// pause, which a crash never turns into one with memory (none is left on
// disk while it is paused).
func (n *node) crashColdPause(t *testing.T, point string) {
	id := n.create(t, `{"templateID":"base","timeout":300,"drives":[{"sizeMiB":16}]}`)
	data := n.writeData(t, id, "cp")
	drive := n.writeDrive(t, id)
	n.crashAt(t, point, func() { _, _, _, _ = n.Call("POST", "/sandboxes/"+id+"/pause", n.key, `{"memory":false}`) })
	if n.listed(t)[id] == "paused" {
		if files := n.memoryFiles(t, id); len(files) != 0 {
			t.Fatalf("filesystem-only pause crashed at %s: memory on disk %v", point, files)
		}
	}
	n.resumeAndCheck(t, id, data)
	n.checkDrive(t, id, point, drive)
}

func (n *node) crashColdResume(t *testing.T, point string) {
	id := n.create(t, `{"templateID":"base","timeout":300,"drives":[{"sizeMiB":16}]}`)
	data := n.writeData(t, id, "cr")
	drive := n.writeDrive(t, id)
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, `{"memory":false}`)
	n.crashAt(t, point, func() { _, _, _, _ = n.Call("POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":60}`) })
	n.resumeAndCheck(t, id, data)
	n.checkDrive(t, id, point, drive)
}

// writeDrive writes 1 MiB of random bytes at the start of the sandbox's
// blank drive (/dev/vdb), synced, and returns their checksum.
func (n *node) writeDrive(t *testing.T, id string) string {
	t.Helper()
	return n.sh(t, id, `head -c 1048576 /dev/urandom > /tmp/d && dd if=/tmp/d of=/dev/vdb bs=1M oflag=direct conv=fsync 2>/dev/null && sha256sum < /tmp/d`)
}

// checkDrive reads the drive's first MiB past the guest's cache.
func (n *node) checkDrive(t *testing.T, id, point, want string) {
	t.Helper()
	if got := n.sh(t, id, `dd if=/dev/vdb bs=1M count=1 iflag=direct 2>/dev/null | sha256sum`); got != want {
		t.Fatalf("sandbox %s: the drive after the crash at %s reads %s, want %s\n%s", id, point, got, want, n.diagnose(id))
	}
}

func (n *node) crashSnapshot(t *testing.T, point string) {
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	data := n.writeData(t, id, "s")
	n.crashAt(t, point, func() { _, _, _, _ = n.Call("POST", "/sandboxes/"+id+"/snapshots", n.key, `{}`) })
	n.resumeAndCheck(t, id, data)
	later := n.writeData(t, id, "s2")
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	n.resumeAndCheck(t, id, data, later)
	n.dropSnapshotsOf(t, id)
}

func (n *node) crashFork(t *testing.T, point string) {
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	data := n.writeData(t, id, "f")
	dirsBefore := n.snapshotDirs(t)
	n.crashAt(t, point, func() { _, _, _, _ = n.Call("POST", "/sandboxes/"+id+"/fork", n.key, `{"count":1}`) })
	n.resumeAndCheck(t, id, data)
	// The hidden snapshot of the fork that never started a child is gone.
	if got := n.snapshotDirs(t); len(got) != len(dirsBefore) {
		t.Fatalf("fork interrupted at %s: snapshot directories %v before, %v after", point, dirsBefore, got)
	}
}

// crashCompact pauses and resumes a sandbox until its layer chains are
// deeper than the node's max_layers (sharedNode's maxLayers) and the merge
// that follows a pause crashes at point: the old chain stays in use, and
// every write of every round reads back.
func (n *node) crashCompact(t *testing.T, point string) {
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	data := []guestData{n.writeData(t, id, "c0")}
	if err := n.Arm(point, "crash"); err != nil {
		t.Fatalf("arm %s: %v", point, err)
	}
	for round := 1; ; round++ {
		if round > 3*maxLayers {
			t.Fatalf("%d pauses and no merge reached %s", round-1, point)
		}
		n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
		// The merge runs in the background after the pause that made a
		// chain too deep; a resume before it starts would skip it.
		if st, err := n.WaitExit(8 * time.Second); err == nil {
			if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("aenvd ended with %v at %s, want SIGKILL from the fault point", st, point)
			}
			break
		}
		n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":300}`)
		data = append(data, n.writeData(t, id, fmt.Sprintf("c%d", round)))
	}
	n.start(t)
	n.resumeAndCheck(t, id, data...)
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
}

func (n *node) snapshotDirs(t *testing.T) []string {
	t.Helper()
	return n.dataDirNames(t, "snapshots")
}

// dataDirNames lists the names in a directory of the node's data dir
// (none when it does not exist).
func (n *node) dataDirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(n.DataDir, dir))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// crashKill: a kill interrupted after "killing" was recorded is finished by
// the restart: the sandbox is gone, with everything it owned.
func (n *node) crashKill(t *testing.T, point string) {
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	n.crashAt(t, point, func() { _, _, _, _ = n.Call("DELETE", "/sandboxes/"+id, n.key, "") })
	if st, ok := n.listed(t)[id]; ok {
		t.Fatalf("a kill interrupted at %s left the sandbox %s", point, st)
	}
	n.expect(t, http.StatusNotFound, "GET", "/sandboxes/"+id, n.key, "")
}

// resumeAndCheck brings the sandbox up (whether recovery left it running
// or paused) and checks its data through E2B's SDK (crashcheck.mjs).
func (n *node) resumeAndCheck(t *testing.T, id string, data ...guestData) {
	t.Helper()
	if _, ok := n.listed(t)[id]; !ok {
		t.Fatalf("sandbox %s is gone after the crash\n%s", id, n.diagnose(id))
	}
	n.sdkCheck(t, id, data...)
}

// sdkCheck runs crashcheck.mjs with the newest E2B SDK installed here.
func (n *node) sdkCheck(t *testing.T, id string, data ...guestData) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed; the crash checks use E2B's SDK on Node.js 20+ (make setup installs it)")
	}
	_, here, _, _ := runtime.Caller(0)
	dir := filepath.Dir(here)
	v := sdkVersions[len(sdkVersions)-1]
	sdkDir := filepath.Join(dir, v.dir, "sdk-"+v.version)
	sets, _ := json.Marshal(data)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "crashcheck.mjs"))
	cmd.Env = append(os.Environ(), "E2B_API_URL="+n.api, "E2B_SANDBOX_URL="+n.proxy, "E2B_API_KEY="+n.key,
		"AENV_E2B_SDK_DIR="+sdkDir, "AENV_CHECK_ID="+id, "AENV_CHECK_SETS="+string(sets))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "crash check passed") {
		t.Fatalf("sandbox %s after the crash (E2B SDK %s): %v\n%s\n%s", id, v.version, err, out, n.diagnose(id))
	}
}

func (n *node) dropSnapshotsOf(t *testing.T, id string) {
	var listed []snapshotJSON
	_ = json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/snapshots?sandboxID="+id, n.key, ""), &listed)
	for _, s := range listed {
		n.call(t, "DELETE", "/snapshots/"+s.SnapshotID, n.key, "")
	}
}

// TestPauseFailureKeepsSandbox: a pause that fails (before or after the disk
// is sealed) leaves the sandbox running with its data, and a graceful
// shutdown whose pauses fail never kills a sandbox.
func TestPauseFailureKeepsSandbox(t *testing.T) {
	n := sharedNode(t)
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	data := n.writeData(t, id, "pf")
	for _, point := range []string{"orchestrator/pause/captured", "orchestrator/pause/sealed"} {
		if err := n.Arm(point, "error"); err != nil {
			t.Fatal(err)
		}
		code, b, _ := n.call(t, "POST", "/sandboxes/"+id+"/pause", n.key, "")
		_ = n.Arm(point, "")
		if code < 500 {
			t.Fatalf("pause with %s failing: %d %s", point, code, b)
		}
		n.waitState(t, id, "running", time.Second)
		n.checkData(t, id, data)
	}
	// The failed pauses sealed the disk and left the device on its upper:
	// a pause that succeeds seals what was written before and after them,
	// and the resume's disk comes from that seal alone.
	more := n.writeData(t, id, "pf-after")
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":300}`)
	n.checkData(t, id, data, more)
	// Graceful shutdown with every pause failing: the sandbox is not
	// killed; it runs on in the same VMM and the next start re-adopts it.
	vmmBefore := processesMentioning(id)
	if err := n.Arm("orchestrator/pause/recorded", "error"); err != nil {
		t.Fatal(err)
	}
	if err := n.Stop(syscall.SIGTERM); err == nil {
		t.Error("aenvd exited 0 although a pause failed at shutdown")
	}
	n.start(t)
	n.waitState(t, id, "running", time.Second)
	if after := processesMentioning(id); len(vmmBefore) == 0 || !slices.Equal(after, vmmBefore) {
		t.Fatalf("VMM processes of %s before the graceful restart %v, after %v", id, vmmBefore, after)
	}
	n.checkData(t, id, data)
	n.checkNoOrphans(t)
}

// TestDeleteSeesStartingSandbox: a snapshot cannot be deleted while a
// sandbox is still being created from it (the in-use check sees sandboxes
// that are starting, not only those already running).
func TestDeleteSeesStartingSandbox(t *testing.T) {
	n := sharedNode(t)
	src := n.create(t, `{"templateID":"base","timeout":120}`)
	var snap snapshotJSON
	if err := json.Unmarshal(n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+src+"/snapshots", n.key, `{}`), &snap); err != nil {
		t.Fatal(err)
	}
	if err := n.Arm("orchestrator/create/recorded", "delay:4s"); err != nil {
		t.Fatal(err)
	}
	defer n.Arm("orchestrator/create/recorded", "")
	created := make(chan string, 1)
	go func() {
		id, err := n.Create(`{"templateID":"` + snap.SnapshotID + `","timeout":120}`)
		if err != nil {
			t.Errorf("create from the snapshot: %v", err)
		}
		created <- id
	}()
	time.Sleep(1500 * time.Millisecond) // the create is past its registration, in the delay
	n.expect(t, http.StatusConflict, "DELETE", "/snapshots/"+snap.SnapshotID, n.key, "")
	id := <-created
	if id == "" {
		return
	}
	if got := n.sh(t, id, `echo ok`); got != "ok" {
		t.Fatalf("sandbox from the snapshot: %q", got)
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+src, n.key, "")
	n.expect(t, http.StatusNoContent, "DELETE", "/snapshots/"+snap.SnapshotID, n.key, "")
}
