package e2e

import (
	"strings"
	"testing"
)

// TestVolumeCommands: `aenv volume create|list|rm` and `aenv start
// --volume`: a file written through one sandbox's mount is read back
// through a read-only mount of the next; a mounted volume cannot be
// removed.
func TestVolumeCommands(t *testing.T) {
	n := node(t)
	c := forNode(t, n)
	var v struct {
		VolumeID string `json:"volumeID"`
		Name     string `json:"name"`
		SizeMiB  int    `json:"sizeMiB"`
	}
	c.okJSON(&v, "volume", "create", "cli-vol", "--size-mib", "64")
	if v.VolumeID == "" || v.Name != "cli-vol" || v.SizeMiB != 64 {
		t.Fatalf("volume create: %+v", v)
	}
	t.Cleanup(func() { c.run("volume", "rm", v.VolumeID) })
	c.fails([]string{"taken"}, "volume", "create", "cli-vol")
	start := func(mount string) string {
		var s struct {
			SandboxID string `json:"sandboxID"`
		}
		c.okJSON(&s, "start", "base", "-d", "--timeout", "5m", "--volume", mount)
		if s.SandboxID == "" {
			t.Fatalf("start --volume %s: no sandbox id", mount)
		}
		t.Cleanup(func() { c.run("rm", s.SandboxID) })
		return s.SandboxID
	}
	writer := start("cli-vol:/mnt/v")
	c.ok("exec", writer, "--", "sh", "-c", "echo through-the-cli > /mnt/v/f")
	rows := tableRows(t, c.ok("volume", "list").stdout, "VOLUME ID", "NAME", "SIZE MIB", "MOUNTED BY")
	found := false
	for _, r := range rows {
		if len(r) == 4 && r[0] == v.VolumeID {
			found = r[1] == "cli-vol" && r[2] == "64" && r[3] == writer
		}
	}
	if !found {
		t.Fatalf("volume list lacks cli-vol of 64 MiB mounted by %s: %v", writer, rows)
	}
	c.fails([]string{"mounted by sandbox"}, "volume", "rm", "cli-vol")
	c.ok("rm", writer)

	reader := start("cli-vol:/data:ro")
	if r := c.ok("exec", reader, "--", "cat", "/data/f"); r.stdout != "through-the-cli\n" {
		t.Fatalf("the read-only mount reads %q", r.stdout)
	}
	if r := c.run("exec", reader, "--", "touch", "/data/g"); r.code == 0 || !strings.Contains(r.stderr+r.stdout, "Read-only") {
		t.Fatalf("a write to the read-only mount: %s", r)
	}
	c.ok("rm", reader)
	c.ok("volume", "rm", "cli-vol")
	if out := c.ok("volume", "list", "-o", "json").stdout; strings.Contains(out, v.VolumeID) {
		t.Fatalf("volume list after rm: %s", out)
	}
}
