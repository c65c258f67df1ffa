package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// checkNoOrphans asserts that every VMM process, sandbox directory, storage
// device and network slot of the node belongs to a listed sandbox or, on a
// node with a warm pool (once it is full), to one of its entries.
func (n *node) checkNoOrphans(t *testing.T) {
	t.Helper()
	pool := n.waitPoolFull(t)
	entries := n.poolEntries(t)
	sbx := n.listed(t)
	running := 0
	for _, st := range sbx {
		if st == "running" {
			running++
		}
	}
	pooledVMMs := 0
	for _, pid := range processesMentioning(n.DataDir + "/") {
		cmd, _ := os.ReadFile("/proc/" + pid + "/cmdline")
		if !strings.Contains(string(cmd), "qemu-system") {
			continue
		}
		owner := ""
		for id, st := range sbx {
			if st == "running" && mentions("/proc/"+pid, id) {
				owner = id
			}
		}
		for _, e := range entries {
			if owner == "" && mentions("/proc/"+pid, filepath.Join(n.DataDir, "pool", e)+"/") {
				owner = e
				pooledVMMs++
			}
		}
		if owner == "" {
			t.Errorf("QEMU process %s belongs to no running sandbox or pool entry: %s", pid, strings.ReplaceAll(string(cmd), "\x00", " "))
		}
	}
	inPool := 0 // the entries /nodes counts ready
	if pool != nil {
		inPool = pool.Ready
	}
	if pooledVMMs != inPool || len(entries) != inPool {
		t.Errorf("the warm pool reports %d entries; %d VMM processes and the directories %v are the pool's", inPool, pooledVMMs, entries)
	}
	dirs, _ := os.ReadDir(filepath.Join(n.DataDir, "sandboxes"))
	for _, d := range dirs {
		if _, ok := sbx[d.Name()]; !ok {
			t.Errorf("sandbox directory %s has no sandbox", d.Name())
		}
	}
	devs, err := n.storaged(t).List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	pooledDevs := 0
	for _, d := range devs {
		switch {
		case d.Kind != rpc.KindRuntime || sbx[d.Owner] == "running":
		case slices.Contains(entries, d.Owner):
			pooledDevs++
		default:
			t.Errorf("storage device %d (owner %q) belongs to no running sandbox or pool entry", d.ID, d.Owner)
		}
	}
	if pooledDevs != inPool {
		t.Errorf("%d storage devices belong to the warm pool's %d entries", pooledDevs, inPool)
	}
	if slots := n.metricValue(t, "aenv_network_slots_in_use"); int(slots) != running+inPool {
		t.Errorf("%v network slots in use for %d running sandboxes and %d pool entries", slots, running, inPool)
	}
}
