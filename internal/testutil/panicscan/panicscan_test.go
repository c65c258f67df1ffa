package panicscan

import (
	"strings"
	"testing"
)

// TestScan checks that the restore tests' console scan finds the crash
// reports seen after restores (a panic in interrupt, a general protection
// fault, a BUG) and nothing in a clean log.
func TestScan(t *testing.T) {
	clean := "[    0.000000] Linux version 6.12\nvirtio_net virtio1 eth0: renamed\naenv-agent: ready\n"
	if got := Scan([]byte(clean)); got != "" {
		t.Fatalf("clean log reported as a crash: %q", got)
	}
	for _, first := range []string{
		"Kernel panic - not syncing: Fatal exception in interrupt",
		"Oops: general protection fault, probably for non-canonical address 0xdead: 0000 [#1] SMP NOPTI",
		"BUG: unable to handle page fault for address: ffff888000000000",
		"traps: python3[214] general protection fault ip:7f0 sp:7ff error:0",
	} {
		log := clean + first + "\nRIP: 0010:__kmalloc_node_noprof+0x10f/0x3c0\n" + clean
		got := Scan([]byte(log))
		if !strings.HasPrefix(got, first) || !strings.Contains(got, "__kmalloc_node_noprof") {
			t.Errorf("scan of a log with %q gave %q, want the report from its first line on", first, got)
		}
	}
}
