package e2e

import (
	"encoding/json"
	"net/http"
	"testing"
)

// TestVMMPoolResumeAndFork: on the pool node, a resume and a fork's child
// each take a VMM waiting in the pool (their memory stacks on the base
// template's file): the pool counts a hit, the sandbox's VMM is one of the
// waiting ones, and the guest has its files and the marker it kept in
// memory from before the pause (the child, the source's).
func TestVMMPoolResumeAndFork(t *testing.T) {
	n := poolNode(t)
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	t.Cleanup(func() { n.call(t, "DELETE", "/sandboxes/"+id, n.key, "") })
	data := n.writeData(t, id, "pooled")
	n.sh(t, id, `echo kept in memory > /dev/shm/marker`)
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")

	n.takesPooled(t, id, "resume", func() string {
		n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":300}`)
		return id
	})
	n.checkData(t, id, data)
	if got := n.sh(t, id, `cat /dev/shm/marker`); got != "kept in memory" {
		t.Fatalf("resumed sandbox %s: memory marker %q", id, got)
	}
	n.sh(t, id, `echo after the resume > /home/user/after.txt; sync`)

	child := n.takesPooled(t, id, "fork", func() string {
		var kids []struct {
			Sandbox *sandboxJSON `json:"sandbox"`
		}
		b := n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/fork", n.key, `{"count":1,"timeout":300}`)
		if err := json.Unmarshal(b, &kids); err != nil || len(kids) != 1 || kids[0].Sandbox == nil {
			t.Fatalf("fork: %s (%v)", b, err)
		}
		return kids[0].Sandbox.SandboxID
	})
	t.Cleanup(func() { n.call(t, "DELETE", "/sandboxes/"+child, n.key, "") })
	n.checkData(t, child, data)
	if got := n.sh(t, child, `cat /dev/shm/marker /home/user/after.txt`); got != "kept in memory\nafter the resume" {
		t.Fatalf("fork child %s sees %q, want the source's memory marker and its file", child, got)
	}
	n.checkNoOrphans(t)
}

// takesPooled runs start (a resume or a fork returning the started
// sandbox) with the pool full and checks that it took one of the waiting
// VMMs.
func (n *node) takesPooled(t *testing.T, source, what string, start func() string) string {
	t.Helper()
	before := n.waitPoolFull(t)
	waiting := n.pooledVMMs(t)
	id := start()
	after := n.waitPoolFull(t)
	if after.Hits != before.Hits+1 {
		t.Fatalf("the %s of %s did not take a pool entry: before %+v, after %+v\n%s", what, source, before, after, n.diagnose(id))
	}
	if !n.loggedPooledPID(id, waiting) {
		t.Fatalf("the %s of %s: sandbox %s's VMM is none of the pool's %v\n%s", what, source, id, waiting, n.diagnose(id))
	}
	return id
}
