package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Guest scripts of the extra-drive test. /dev/vdc is a blank volume, written
// raw at block 10 (4 KiB blocks); reads bypass the guest's page cache, so
// they show what the disk holds.
const (
	driveRead  = `dd if=/dev/vdc bs=4096 skip=10 count=1 iflag=direct 2>/dev/null | tr -d '\0'`
	driveWrite = `printf '%s' | dd of=/dev/vdc bs=4096 seek=10 conv=sync,notrunc,fsync 2>/dev/null && blockdev --flushbufs /dev/vdc`
	// imageCheck mounts the read-only image drive (the base template's root
	// disk) and reads a file of it; a write to the disk must fail.
	imageCheck = `mkdir -p /mnt/img && (mountpoint -q /mnt/img || mount -o ro /dev/vdb /mnt/img) && grep -c ^ID= /mnt/img/etc/os-release && ! dd if=/dev/zero of=/dev/vdb bs=4096 count=1 oflag=direct 2>/dev/null`
)

// TestExtraDrives: a create brings a read-only image drive (/dev/vdb) and a
// blank writable volume (/dev/vdc); what is written on the volume survives a
// pause and resume; fork children see the parent's data and diverge; a
// kill -9 of aenvd keeps the drives of running sandboxes; bad drive lists
// are refused with 400; a kill leaves no device behind.
func TestExtraDrives(t *testing.T) {
	n := sharedNode(t)
	for _, body := range []string{
		`{"templateID":"base","drives":[{"sizeMiB":8},{"sizeMiB":8},{"sizeMiB":8},{"sizeMiB":8},{"sizeMiB":8}]}`,
		`{"templateID":"base","drives":[{}]}`,
		`{"templateID":"base","drives":[{"image":"base","sizeMiB":8}]}`,
		`{"templateID":"base","drives":[{"sizeMiB":0}]}`,
		`{"templateID":"base","drives":[{"sizeMiB":-1}]}`,
		`{"templateID":"base","drives":[{"sizeMiB":65537}]}`,
		`{"templateID":"base","drives":[{"sizeMiB":8,"readOnly":true}]}`,
		`{"templateID":"base","drives":[{"image":"../base"}]}`,
		`{"templateID":"base","drives":[{"volume":"x"}]}`,
	} {
		n.expect(t, http.StatusBadRequest, "POST", "/sandboxes", n.key, body)
	}
	n.expect(t, http.StatusNotFound, "POST", "/sandboxes", n.key, `{"templateID":"base","drives":[{"image":"nosuchtemplate"}]}`)

	start := time.Now()
	plain := n.create(t, `{"templateID":"base","timeout":60}`)
	tookPlain := time.Since(start)
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+plain, n.key, "")
	start = time.Now()
	id := n.create(t, `{"templateID":"base","timeout":600,"drives":[{"image":"base","readOnly":true},{"sizeMiB":64}]}`)
	t.Logf("create without drives %s, with two drives %s", tookPlain.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	// Sizes and read-only flags as the guest sees them: the image drive is
	// the template's root disk (as large as the guest's own vda), read-only;
	// vdd and vde are the empty slots.
	rootSectors := n.sh(t, id, `cat /sys/block/vda/size`)
	got := n.sh(t, id, `for d in vdb vdc vdd vde; do echo $d $(cat /sys/block/$d/size) $(cat /sys/block/$d/ro); done | tr '\n' ' '`)
	if want := "vdb " + rootSectors + " 1 vdc 131072 0 vdd 0 0 vde 0 0"; rootSectors == "0" || got != want {
		t.Fatalf("guest disks: %q, want %q", got, want)
	}
	if got := n.sh(t, id, imageCheck); got != "1" {
		t.Fatalf("image drive: %q", got)
	}
	var detail struct {
		Drives []struct {
			Device   string `json:"device"`
			Image    string `json:"image"`
			SizeMiB  int    `json:"sizeMiB"`
			ReadOnly bool   `json:"readOnly"`
		} `json:"drives"`
	}
	b := n.expect(t, http.StatusOK, "GET", "/sandboxes/"+id, n.key, "")
	if err := json.Unmarshal(b, &detail); err != nil || len(detail.Drives) != 2 ||
		detail.Drives[0].Device != "vdb" || detail.Drives[0].Image != "base" || !detail.Drives[0].ReadOnly ||
		detail.Drives[1].Device != "vdc" || detail.Drives[1].SizeMiB != 64 || detail.Drives[1].ReadOnly {
		t.Fatalf("GET /sandboxes/%s drives: %s (%v)", id, b, err)
	}
	if got := n.sh(t, id, driveRead); got != "" {
		t.Fatalf("a blank volume reads %q", got)
	}
	n.sh(t, id, fmt.Sprintf(driveWrite, "parent-v1"))

	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	n.waitState(t, id, "paused", time.Second)
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":600}`)
	if got := n.sh(t, id, driveRead); got != "parent-v1" {
		t.Fatalf("after pause and resume the volume reads %q, want parent-v1", got)
	}
	if got := n.sh(t, id, imageCheck); got != "1" {
		t.Fatalf("image drive after resume: %q", got)
	}
	n.sh(t, id, fmt.Sprintf(driveWrite, "parent-v2"))

	ids := append([]string{id}, n.forkChildren(t, id, 2)...)
	for _, kid := range ids[1:] {
		if got := n.sh(t, kid, driveRead); got != "parent-v2" {
			t.Fatalf("fork child %s: the volume reads %q, want the parent's parent-v2", kid, got)
		}
		if got := n.sh(t, kid, imageCheck); got != "1" {
			t.Fatalf("fork child %s: image drive: %q", kid, got)
		}
	}
	for i, kid := range ids {
		n.sh(t, kid, fmt.Sprintf(driveWrite, fmt.Sprintf("writer-%d", i)))
	}
	for i, kid := range ids {
		if got := n.sh(t, kid, driveRead); got != fmt.Sprintf("writer-%d", i) {
			t.Fatalf("sandbox %s: the volume reads %q after the others wrote, want writer-%d", kid, got, i)
		}
	}

	// aenvd killed: the running sandboxes are taken over with their drives'
	// devices (not reclaimed as orphans), and a pause seals the drives.
	n.restart(t, syscall.SIGKILL)
	for i, kid := range ids {
		if got := n.sh(t, kid, driveRead); got != fmt.Sprintf("writer-%d", i) {
			t.Fatalf("sandbox %s after the restart: the volume reads %q, want writer-%d", kid, got, i)
		}
	}
	n.sh(t, id, fmt.Sprintf(driveWrite, "after-restart"))
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":600}`)
	if got := n.sh(t, id, driveRead); got != "after-restart" {
		t.Fatalf("after restart, pause and resume the volume reads %q", got)
	}
	if got := n.sh(t, id, imageCheck); got != "1" {
		t.Fatalf("image drive after restart and resume: %q", got)
	}

	// A kill releases every device of the sandbox: root disk and drives.
	sd := n.storaged(t)
	owned := func() int {
		devs, err := sd.List(t.Context())
		if err != nil {
			t.Fatalf("list devices: %v", err)
		}
		c := 0
		for _, d := range devs {
			if d.Owner == id {
				c++
			}
		}
		return c
	}
	if c := owned(); c != 3 {
		t.Fatalf("the running sandbox holds %d devices, want 3 (root disk and two drives)", c)
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
	if c := owned(); c != 0 {
		t.Fatalf("%d devices of the killed sandbox are left", c)
	}
	if strings.Contains(n.Logs(), "seal drive") {
		t.Fatalf("a seal of a drive failed:\n%s", n.diagnose(id))
	}
}

// forkChildren forks count children of parent (removed when the test ends)
// and returns their ids.
func (n *node) forkChildren(t *testing.T, parent string, count int) []string {
	t.Helper()
	var kids []struct {
		Sandbox *sandboxJSON `json:"sandbox"`
	}
	b := n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+parent+"/fork", n.key, fmt.Sprintf(`{"count":%d,"timeout":300}`, count))
	if err := json.Unmarshal(b, &kids); err != nil || len(kids) != count {
		t.Fatalf("fork: %s (%v)", b, err)
	}
	var ids []string
	for i, k := range kids {
		if k.Sandbox == nil {
			t.Fatalf("fork child %d failed: %s", i, b)
		}
		kid := k.Sandbox.SandboxID
		ids = append(ids, kid)
		t.Cleanup(func() { n.call(t, "DELETE", "/sandboxes/"+kid, n.key, "") })
	}
	return ids
}
