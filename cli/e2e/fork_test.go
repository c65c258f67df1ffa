package e2e

import (
	"slices"
	"strings"
	"testing"
)

// TestForkAndSnapshots: `aenv fork --count 2` clones a running sandbox's
// state into two independent children; `aenv snapshot create|list` in table
// and json.
func TestForkAndSnapshots(t *testing.T) {
	n := node(t)
	c := forNode(t, n)
	id := startedSandbox(t, c, "base")
	c.ok("exec", id, "--", "sh", "-c", "echo parent > /tmp/mark")

	var kids []struct {
		Sandbox *struct {
			SandboxID  string `json:"sandboxID"`
			TemplateID string `json:"templateID"`
		} `json:"sandbox"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	c.okJSON(&kids, "fork", id, "--count", "2")
	if len(kids) != 2 {
		t.Fatalf("fork --count 2: %d results", len(kids))
	}
	var ids []string
	for _, k := range kids {
		if k.Sandbox == nil || k.Sandbox.SandboxID == "" || k.Sandbox.SandboxID == id {
			t.Fatalf("fork child: %+v %+v", k.Sandbox, k.Error)
		}
		kid := k.Sandbox.SandboxID
		ids = append(ids, kid)
		t.Cleanup(func() { c.run("rm", kid) })
	}
	for i, kid := range ids {
		if r := c.run("exec", kid, "--", "cat", "/tmp/mark"); r.code != 0 || r.stdout != "parent\n" {
			t.Fatalf("child %s lacks the parent's state: %s", kid, r)
		}
		c.ok("exec", kid, "--", "sh", "-c", "echo child"+string(rune('0'+i))+" > /tmp/mark")
	}
	for i, sid := range append([]string{id}, ids...) {
		want := "parent\n"
		if i > 0 {
			want = "child" + string(rune('0'+i-1)) + "\n"
		}
		if r := c.ok("exec", sid, "--", "cat", "/tmp/mark"); r.stdout != want {
			t.Fatalf("sandbox %s after the children wrote: %q, want %q (forks must be independent)", sid, r.stdout, want)
		}
	}
	listed := map[string]bool{}
	for _, s := range c.list() {
		listed[s.SandboxID] = true
	}
	if !listed[ids[0]] || !listed[ids[1]] {
		t.Fatalf("list lacks the children %v", ids)
	}
	c.ok(append([]string{"rm"}, ids...)...)

	// snapshot create (table), list (json, table, --sandbox).
	rows := tableRows(t, c.ok("snapshot", "create", id, "--name", "cli-snap").stdout, "SNAPSHOT ID", "NAMES")
	if len(rows) != 1 || len(rows[0]) != 2 || rows[0][1] != "cli-snap" {
		t.Fatalf("snapshot create: %v", rows)
	}
	snapID := rows[0][0]
	var snaps []struct {
		SnapshotID string   `json:"snapshotID"`
		Names      []string `json:"names"`
		SandboxID  string   `json:"sandboxID"`
	}
	c.okJSON(&snaps, "snapshot", "list")
	if !slices.ContainsFunc(snaps, func(s struct {
		SnapshotID string   `json:"snapshotID"`
		Names      []string `json:"names"`
		SandboxID  string   `json:"sandboxID"`
	}) bool {
		return s.SnapshotID == snapID && s.SandboxID == id && slices.Contains(s.Names, "cli-snap")
	}) {
		t.Fatalf("snapshot list -o json lacks %s: %+v", snapID, snaps)
	}
	rows = tableRows(t, c.ok("snapshot", "list", "--sandbox", id).stdout, "SNAPSHOT ID", "SANDBOX ID", "NAMES", "LIVES")
	if len(rows) != 1 || strings.Join(rows[0], " ") != snapID+" "+id+" cli-snap node" {
		t.Fatalf("snapshot list --sandbox %s: %v", id, rows)
	}
	rows = tableRows(t, c.ok("snapshot", "list", "--sandbox", "no-such-sandbox").stdout, "SNAPSHOT ID")
	if len(rows) != 0 {
		t.Fatalf("snapshots of an unknown sandbox: %v", rows)
	}
	// The sandbox kept running through the snapshot.
	if r := c.ok("exec", id, "--", "cat", "/tmp/mark"); r.stdout != "parent\n" {
		t.Fatalf("after snapshot: %s", r)
	}
}
