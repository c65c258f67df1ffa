package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/snapshot"
)

// layerFiles counts a sandbox's own sealed layers on the node: memory diffs
// (mem-<gen>.lsmt) and sealed rootfs uppers (rootfs-<gen>.lsmt), merged
// ones (<kind>-<gen>-merged.lsmt) included; merged says whether a merge of
// that kind happened.
func (n *node) layerFiles(t *testing.T, id string) (memory, rootfs int, memMerged, rootfsMerged bool) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(n.DataDir, "sandboxes", id))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`^(mem|rootfs)-\d+(-merged)?\.lsmt$`)
	for _, e := range entries {
		m := re.FindStringSubmatch(e.Name())
		switch {
		case m == nil:
		case m[1] == "mem":
			memory++
			memMerged = memMerged || m[2] != ""
		default:
			rootfs++
			rootfsMerged = rootfsMerged || m[2] != ""
		}
	}
	return memory, rootfs, memMerged, rootfsMerged
}

// checkLayerCount: after pause i a sandbox holds exactly i layers of a
// kind until its layers of that kind are merged (the shared node merges
// above maxLayers, in the background), and between 1 and i after (i+1
// while a merge has written its layer and not yet removed the old ones).
func checkLayerCount(t *testing.T, kind string, i, n int, merged bool) {
	t.Helper()
	if (!merged && n != i) || (merged && (n < 1 || n > i+1)) {
		t.Fatalf("after pause %d: %d %s layers (merged: %v), want %d, or 1..%d once merged", i, n, kind, merged, i, i)
	}
}

// TestPauseResumeCycles: 20 pause/resume cycles with writes between each
// (synced files, unsynced files, tmpfs): everything written survives, a
// long-running process keeps counting, and every pause adds exactly one
// memory layer and one rootfs layer (until merges fold them).
func TestPauseResumeCycles(t *testing.T) {
	n := sharedNode(t)
	id := n.create(t, `{"templateID":"base","timeout":900}`)
	n.sh(t, id, counterScript)
	last := n.counter(t, id)
	const cycles = 20
	for i := 1; i <= cycles; i++ {
		// f<i> is synced, u<i> may sit in the guest page cache only, and
		// m<i> lives in tmpfs (guest RAM).
		n.sh(t, id, fmt.Sprintf(`echo synced%d > /home/user/f%d && sync /home/user/f%d; echo unsynced%d > /home/user/u%d; echo mem%d > /dev/shm/m%d`, i, i, i, i, i, i, i))
		start := time.Now()
		n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
		paused := time.Since(start)
		if i == 1 {
			time.Sleep(10 * time.Second) // long enough to show an unsynced clock
		}
		n.waitState(t, id, "paused", time.Second)
		mem, disk, memMerged, diskMerged := n.layerFiles(t, id)
		checkLayerCount(t, "memory", i, mem, memMerged)
		checkLayerCount(t, "rootfs", i, disk, diskMerged)
		start = time.Now()
		n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":900}`)
		t.Logf("cycle %d: pause %s, resume %s", i, paused.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		got := n.sh(t, id, fmt.Sprintf(`for j in $(seq %d); do cat /home/user/f$j /home/user/u$j /dev/shm/m$j; done | tr '\n' ' '`, i))
		var want strings.Builder
		for j := 1; j <= i; j++ {
			fmt.Fprintf(&want, "synced%d unsynced%d mem%d ", j, j, j)
		}
		if strings.TrimSpace(got) != strings.TrimSpace(want.String()) {
			t.Fatalf("after resume %d: files read %q, want %q", i, got, want.String())
		}
		if i == 1 {
			// The guest clock stood still while paused; resume re-syncs it.
			checkClock(t, n, id)
		}
		c := n.counter(t, id)
		if c <= last {
			t.Fatalf("after resume %d: counter %d, not past %d", i, c, last)
		}
		last = c
	}
	for _, l := range strings.Split(n.Logs(), "\n") {
		if strings.Contains(l, id) && (strings.Contains(l, "memory diff captured") || strings.Contains(l, "materialized")) {
			t.Log(l)
		}
	}
}

// TestSharedMemoryImage: ten sandboxes created from one snapshot map one
// memory image file (the same inode), and /nodes counts it once.
func TestSharedMemoryImage(t *testing.T) {
	n := sharedNode(t)
	src := n.create(t, `{"templateID":"base","timeout":600}`)
	n.sh(t, src, `echo shared > /dev/shm/marker`)
	var snap snapshotJSON
	if err := json.Unmarshal(n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+src+"/snapshots", n.key, `{}`), &snap); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.call(t, "DELETE", "/snapshots/"+snap.SnapshotID, n.key, "") })
	if snap.MemoryLayers != 2 {
		t.Fatalf("snapshot of a sandbox fresh from the template has %d memory layers, want 2 (base + diff)", snap.MemoryLayers)
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+src, n.key, "")
	const count = 10
	inodes := map[[2]uint64][]string{}
	for range count {
		id := n.create(t, `{"templateID":"`+snap.SnapshotID+`","timeout":300}`)
		if got := n.sh(t, id, `cat /dev/shm/marker`); got != "shared" {
			t.Fatalf("sandbox %s from the snapshot reads %q", id, got)
		}
		dev, ino, path := memoryMapping(t, id)
		k := [2]uint64{dev, ino}
		inodes[k] = append(inodes[k], id+" "+path)
	}
	if len(inodes) != 1 {
		t.Fatalf("%d sandboxes from one snapshot map %d different memory files: %v", count, len(inodes), inodes)
	}
	checkWorkingSet(t, n)
	var nodes []struct {
		Memory struct {
			Mode   string `json:"mode"`
			Images int    `json:"images"`
			VMs    int    `json:"vms"`
		} `json:"memory"`
	}
	if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/nodes", n.key, ""), &nodes); err != nil || len(nodes) != 1 {
		t.Fatalf("/nodes: %v", err)
	}
	if m := nodes[0].Memory; m.Mode == "" || m.VMs < count || m.Images > m.VMs-count+1 {
		t.Fatalf("/nodes memory %+v: want the %d sandboxes counted as one image", m, count)
	}
}

// memoryMapping finds the guest RAM mapping of a sandbox's VMM process: the
// file mapping whose name is a memory image, or the storage daemon's
// shared export of one (disk.IsDevice: a file on its FUSE mount).
func memoryMapping(t *testing.T, id string) (dev, ino uint64, path string) {
	t.Helper()
	pids := processesMentioning(id)
	for _, pid := range pids {
		maps, err := os.ReadFile("/proc/" + pid + "/maps")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(maps), "\n") {
			f := strings.Fields(line)
			if len(f) < 6 || !strings.HasPrefix(filepath.Base(f[5]), "memory") && !disk.IsDevice(f[5]) {
				continue
			}
			var st syscall.Stat_t
			if err := syscall.Stat(f[5], &st); err != nil {
				t.Fatalf("stat %s: %v", f[5], err)
			}
			return st.Dev, st.Ino, f[5]
		}
	}
	t.Fatalf("no memory image mapping in the processes of sandbox %s (%v)", id, pids)
	return 0, 0, ""
}

// checkClock asserts the guest's wall clock reads a time between the
// host's just before and just after asking (3 s of slack for the delay of
// the resume's clock sync): unsynced, it would lag by the 10 s paused.
func checkClock(t *testing.T, n *node, id string) {
	t.Helper()
	before := time.Now()
	out := n.sh(t, id, `date +%s.%N`)
	after := time.Now()
	secs, err := strconv.ParseFloat(out, 64)
	if err != nil {
		t.Fatalf("guest date %q: %v", out, err)
	}
	guest := time.Unix(0, int64(secs*1e9))
	if guest.Before(before.Add(-3*time.Second)) || guest.After(after.Add(time.Second)) {
		t.Fatalf("guest clock %s is outside the host's [%s, %s] after resume", guest.Format(time.StampMilli),
			before.Format(time.StampMilli), after.Format(time.StampMilli))
	}
}

// checkWorkingSet: the template's memory image has a working set recorded
// (by its first create; next to its memory file "memory", or, where VMs map
// the storage daemon's export, as the snapshot directory's
// snapshot.WorkingSetFile: the same name), which later creates prefetched
// without complaint.
func checkWorkingSet(t *testing.T, n *node) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.DataDir, "templates", "base", "snapshot", snapshot.WorkingSetFile))
	if err != nil {
		t.Fatalf("no working set recorded for the template's memory: %v", err)
	}
	var ws struct {
		Size    int64 `json:"size"`
		Extents []struct {
			Off, Len int64
		} `json:"extents"`
	}
	if err := json.Unmarshal(b, &ws); err != nil || ws.Size == 0 || len(ws.Extents) == 0 {
		t.Fatalf("working set %q: %v", b[:min(len(b), 200)], err)
	}
	if strings.Contains(n.Logs(), "prefetch memory working set (ignored)") {
		t.Fatalf("a prefetch failed:\n%s", n.Logs())
	}
}

// flatNode is a node whose VMs map flattened memory files (no shared
// exports: storage.shared_memory = "none", the mode of a node without FUSE
// or ublk), shared by the tests of the background flatten.
func flatNode(t *testing.T) *node {
	t.Helper()
	nodePrereqs(t)
	flatOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		var n *aenvdtest.Node
		env := []string{"AENVD_STORAGE_SHARED_MEMORY=none", "AENVD_SANDBOX_PREFETCH=true"}
		if n, flatErr = aenvdtest.Start(ctx, aenvdtest.Options{Prefix: "adflat", CIDRBase: 109, Env: env}); flatErr == nil {
			flat = &node{Node: n, api: n.API, proxy: n.Proxy, key: n.Key}
		}
	})
	if flatErr != nil {
		t.Fatalf("start aenvd on flattened memory files: %v", flatErr)
	}
	return flat
}

var (
	flatOnce sync.Once
	flat     *node
	flatErr  error
)

// TestResumeMapsFlattenedPause (flattened memory files): after a pause, the sandbox's memory image
// (the template's memory with the pause's layer above it) is flattened in
// the background; a resume after that maps the flat file (it writes no
// layers into the VM's RAM) and the guest's memory is intact; a resume that
// comes before the flatten ends stops it and is intact too.
func TestResumeMapsFlattenedPause(t *testing.T) {
	n := flatNode(t)
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	defer n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
	sum := n.sh(t, id, `head -c 33554432 /dev/urandom > /dev/shm/flat && sha256sum < /dev/shm/flat`)
	check := func(when string) {
		t.Helper()
		if got := n.sh(t, id, `sha256sum < /dev/shm/flat`); got != sum {
			t.Fatalf("%s: tmpfs reads %q, want %q", when, got, sum)
		}
	}
	off := len(n.Logs())
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	n.waitLog(t, off, 2*time.Minute, "paused memory flattened", "sandbox="+id)
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":300}`)
	if _, _, path := memoryMapping(t, id); filepath.Base(path) != "memory.flat" || !strings.Contains(path, filepath.Join("sandboxes", id)) {
		t.Fatalf("the resumed VM maps %s, want its pause's flattened memory.flat", path)
	}
	check("resumed from the flattened pause")

	// Resumed at once: the flatten (if it started) is stopped, the layers
	// are written, the memory is the same.
	off = len(n.Logs())
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":300}`)
	check("resumed at once")
	for _, l := range strings.Split(n.Logs()[off:], "\n") {
		if strings.Contains(l, id) && strings.Contains(l, "flatten") {
			t.Log(l)
		}
	}
}

// TestFlattenAfterRestart (flattened memory files): a paused sandbox whose memory is not flattened
// when aenvd starts (its flatten was interrupted: the file is removed here)
// is flattened after the start, and its resume maps the flat file.
func TestFlattenAfterRestart(t *testing.T) {
	n := flatNode(t)
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	defer n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
	n.sh(t, id, `echo restarted > /dev/shm/flat-restart`)
	off := len(n.Logs())
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	n.waitLog(t, off, 2*time.Minute, "paused memory flattened", "sandbox="+id)
	flat, err := filepath.Glob(filepath.Join(n.DataDir, "sandboxes", id, "snapshot-*", "memory.flat"))
	if err != nil || len(flat) != 1 {
		t.Fatalf("flattened memory of the pause: %v %v", flat, err)
	}
	if err := os.Remove(flat[0]); err != nil {
		t.Fatal(err)
	}
	off = len(n.Logs())
	n.restart(t, syscall.SIGTERM)
	n.waitLog(t, off, 2*time.Minute, "paused memory flattened", "sandbox="+id)
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":300}`)
	if _, _, path := memoryMapping(t, id); path != flat[0] {
		t.Fatalf("resumed after the restart, the VM maps %s, want %s", path, flat[0])
	}
	if got := n.sh(t, id, `cat /dev/shm/flat-restart`); got != "restarted" {
		t.Fatalf("tmpfs after the resume reads %q", got)
	}
}

// crashFlatten: the pause answers, its memory is flattened in the
// background and aenvd dies right after; the resume after the restart maps
// the flat file and the sandbox holds its data.
func (n *node) crashFlatten(t *testing.T, point string) {
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	data := n.writeData(t, id, "f")
	n.crashAt(t, point, func() { n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "") })
	n.resumeAndCheck(t, id, data)
	if _, _, path := memoryMapping(t, id); filepath.Base(path) != "memory.flat" {
		t.Fatalf("resumed after a crash at %s, the VM maps %s, want the flattened memory.flat", point, path)
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
}

// waitLog waits until a log line after offset off holds msg and every one
// of has.
func (n *node) waitLog(t *testing.T, off int, within time.Duration, msg string, has ...string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, l := range strings.Split(n.Logs()[off:], "\n") {
			if strings.Contains(l, msg) && containsAll(l, has) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line %q %v within %s:\n%s", msg, has, within, n.Logs()[off:])
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func containsAll(s string, subs []string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}
