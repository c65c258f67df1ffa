package e2e

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// memoryFiles lists what of a memory image the sandbox's directory holds:
// pause snapshot directories and memory layers.
func (n *node) memoryFiles(t *testing.T, id string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(n.DataDir, "sandboxes", id))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if name := e.Name(); strings.HasPrefix(name, "snapshot-") || strings.HasPrefix(name, "mem-") && strings.HasSuffix(name, ".lsmt") {
			out = append(out, name)
		}
	}
	return out
}

// bootState reads the guest's boot id and whether the sleeper started by
// startSleeper still runs (its pid is on disk, so after a boot another
// process may hold that pid: the whole command line tells, not a match in
// it, since this very script and its grep carry the words) and the tmpfs
// marker is still there.
func (n *node) bootState(t *testing.T, id string) (bootID, sleeper, marker string) {
	t.Helper()
	out := n.sh(t, id, `cat /proc/sys/kernel/random/boot_id
p=$(cat /home/user/sleeper.pid 2>/dev/null)
if [ -n "$p" ] && [ "$(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null)" = "sleep 100000 " ]; then echo alive; else echo gone; fi
cat /dev/shm/marker 2>/dev/null || echo none`)
	f := strings.Split(out, "\n")
	if len(f) != 3 {
		t.Fatalf("sandbox %s: boot state %q", id, out)
	}
	return f[0], f[1], f[2]
}

// startSleeper starts a background process and writes a tmpfs marker,
// both gone after a boot and kept by a memory resume.
func (n *node) startSleeper(t *testing.T, id string) {
	t.Helper()
	n.sh(t, id, `echo in-memory > /dev/shm/marker; setsid nohup sleep 100000 >/dev/null 2>&1 < /dev/null & echo $! > /home/user/sleeper.pid`)
}

// TestColdPause: a pause with memory false keeps only the filesystem (no
// memory image on disk) and its resume cold-boots (new boot id, processes
// and tmpfs gone, files written before the pause kept even unsynced: the
// pause flushes the guest); traffic does not auto-resume it and it cannot
// be snapshotted, and a restart keeps it so. A resume with memory false of a memory pause cold-boots
// too, leaving the memory image as it was; a memory pause and resume of
// the booted sandbox then restores it in place. autoPauseMemory false is a
// filesystem-only auto-pause and is refused with autoResume.
func TestColdPause(t *testing.T) {
	n := sharedNode(t)

	id := n.create(t, `{"templateID":"base","timeout":300,"autoPause":true,"autoResume":{"enabled":true}}`)
	n.startSleeper(t, id)
	boot0, sleeper, marker := n.bootState(t, id)
	if sleeper != "alive" || marker != "in-memory" {
		t.Fatalf("before the pause: sleeper %s, marker %s", sleeper, marker)
	}
	// Not synced by the test: the filesystem-only pause flushes it.
	n.sh(t, id, `echo kept-on-disk > /home/user/cold.txt`)
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, `{"memory":false}`)
	n.expect(t, http.StatusConflict, "POST", "/sandboxes/"+id+"/pause", n.key, `{"memory":false}`)
	if files := n.memoryFiles(t, id); len(files) != 0 {
		t.Fatalf("a filesystem-only pause left memory on disk: %v", files)
	}
	if code := n.proxyGet(t, id, "49983", "/health", ""); code == http.StatusNoContent {
		t.Fatalf("traffic auto-resumed a sandbox paused without memory")
	}
	n.waitState(t, id, "paused", time.Second)
	n.expect(t, http.StatusConflict, "POST", "/sandboxes/"+id+"/snapshots", n.key, `{}`)
	// A restart keeps it paused, still without memory.
	n.restart(t, syscall.SIGKILL)
	n.waitState(t, id, "paused", time.Second)
	if files := n.memoryFiles(t, id); len(files) != 0 {
		t.Fatalf("after a restart, memory on disk: %v", files)
	}

	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":300}`)
	boot1, sleeper, marker := n.bootState(t, id)
	if boot1 == boot0 || sleeper != "gone" || marker != "none" {
		t.Fatalf("resume of a filesystem-only pause: boot id %s (before %s), sleeper %s, marker %s; want a new boot", boot1, boot0, sleeper, marker)
	}
	if got := n.sh(t, id, `cat /home/user/cold.txt`); got != "kept-on-disk" {
		t.Fatalf("file written before the filesystem-only pause reads %q", got)
	}

	// A memory pause resumed with memory false: a boot, the image untouched.
	n.startSleeper(t, id)
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, `{"memory":true}`)
	image := n.memoryFiles(t, id)
	if len(image) == 0 {
		t.Fatal("a memory pause left no memory image")
	}
	n.expect(t, http.StatusCreated, "POST", "/v2/sandboxes/"+id+"/connect", n.key, `{"timeout":300,"memory":false}`)
	boot2, sleeper, marker := n.bootState(t, id)
	if boot2 == boot1 || sleeper != "gone" || marker != "none" {
		t.Fatalf("resume with memory false: boot id %s (before %s), sleeper %s, marker %s; want a new boot", boot2, boot1, sleeper, marker)
	}
	if got := n.memoryFiles(t, id); strings.Join(got, ",") != strings.Join(image, ",") {
		t.Fatalf("resume with memory false changed the memory image: %v, was %v", got, image)
	}

	// The booted sandbox pauses with memory and resumes in place.
	n.startSleeper(t, id)
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/resume", n.key, `{"timeout":300}`)
	boot3, sleeper, marker := n.bootState(t, id)
	if boot3 != boot2 || sleeper != "alive" || marker != "in-memory" {
		t.Fatalf("memory resume of a booted sandbox: boot id %s (want %s), sleeper %s, marker %s", boot3, boot2, sleeper, marker)
	}

	for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
		n.expect(t, http.StatusBadRequest, "POST", path, n.key,
			`{"templateID":"base","timeout":60,"autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":true}}`)
	}

	// The timeout's auto-pause with autoPauseMemory false keeps no memory.
	auto := n.create(t, `{"templateID":"base","timeout":3,"autoPause":true,"autoPauseMemory":false}`)
	n.waitState(t, auto, "paused", 2*time.Minute)
	if files := n.memoryFiles(t, auto); len(files) != 0 {
		t.Fatalf("the filesystem-only auto-pause left memory on disk: %v", files)
	}
}
