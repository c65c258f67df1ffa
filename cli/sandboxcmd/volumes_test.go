package sandboxcmd

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/api/wire"
)

// TestVolumeCommands: volume create, list and rm against the node's real
// API handler and volume store (no VM: nothing mounts the volume).
func TestVolumeCommands(t *testing.T) {
	realNode(t)
	out, err := run("volume", "create", "data", "--size-mib", "32", "-o", "json")
	var v wire.VolumeAndToken
	if err != nil || json.Unmarshal([]byte(out), &v) != nil || v.VolumeID == "" || v.Name != "data" || v.SizeMiB == nil || *v.SizeMiB != 32 {
		t.Fatalf("volume create: %v\n%s", err, out)
	}
	if _, err := run("volume", "create", "data"); err == nil || !strings.Contains(err.Error(), "taken") {
		t.Errorf("a second volume named data: %v", err)
	}
	if _, err := run("volume", "create", "bad/name"); err == nil || !strings.Contains(err.Error(), "name") {
		t.Errorf("a bad name was accepted: %v", err)
	}
	out, err = run("volume", "list")
	if err != nil || !strings.Contains(out, "VOLUME ID") || !strings.Contains(out, v.VolumeID) || !strings.Contains(out, "32") {
		t.Fatalf("volume list: %v\n%s", err, out)
	}
	if _, err := run("volume", "rm", "data"); err != nil {
		t.Fatalf("volume rm: %v", err)
	}
	out, err = run("volume", "list", "-o", "json")
	if err != nil || strings.TrimSpace(out) != "[]" {
		t.Fatalf("volume list after rm: %v\n%s", err, out)
	}
	if _, err := run("volume", "rm", v.VolumeID); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("removing a removed volume: %v", err)
	}
}

// TestVolumeFlags: --volume NAME:PATH[:ro].
func TestVolumeFlags(t *testing.T) {
	got, err := volumeMounts([]string{"a:/mnt/a", "b:/mnt/b:ro"})
	if err != nil || len(got) != 2 || got[0].Name != "a" || got[0].Path != "/mnt/a" || got[0].ReadOnly != nil ||
		got[1].Name != "b" || got[1].ReadOnly == nil || !*got[1].ReadOnly {
		t.Fatalf("volumeMounts: %+v (%v)", got, err)
	}
	for _, bad := range []string{"a", ":/x", "a:", "a:/x:rw", "a:/x:ro:y"} {
		if _, err := volumeMounts([]string{bad}); err == nil {
			t.Errorf("--volume %q was accepted", bad)
		}
	}
}
