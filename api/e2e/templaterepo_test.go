package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/posix"
)

// repoPeer starts another node (its own data dir, network prefix and
// ports) with the repository settings env.
func repoPeer(ctx context.Context, t *testing.T, prefix string, cidr int, env ...string) *node {
	t.Helper()
	bn, err := aenvdtest.Start(ctx, aenvdtest.Options{Prefix: prefix, CIDRBase: cidr, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bn.Close() }) // after the cleanups of its sandboxes (LIFO)
	return &node{Node: bn, api: bn.API, proxy: bn.Proxy, key: bn.Key}
}

// sharesRepo is the environment of a node sharing n's posix repository.
func sharesRepo(n *node) []string {
	return []string{"AENVD_REPOSITORY_BACKEND=posix", "AENVD_REPOSITORY_DIR=" + filepath.Join(n.DataDir, "repository")}
}

// buildFromBase creates template name on n and starts a build of it from
// the base template running script; it returns the template's and build's
// ids.
func (n *node) buildFromBase(t *testing.T, name, script string) (string, string) {
	t.Helper()
	var created struct {
		TemplateID string `json:"templateID"`
		BuildID    string `json:"buildID"`
	}
	if err := json.Unmarshal(n.expect(t, http.StatusAccepted, "POST", "/v3/templates", n.key, `{"name":"`+name+`"}`), &created); err != nil {
		t.Fatal(err)
	}
	spec, _ := json.Marshal(map[string]any{"fromTemplate": "base", "steps": []map[string]any{{"type": "RUN", "args": []string{script}}}})
	n.expect(t, http.StatusAccepted, "POST", "/v2/templates/"+created.TemplateID+"/builds/"+created.BuildID, n.key, string(spec))
	return created.TemplateID, created.BuildID
}

// buildState returns a build's status ("" while the node does not answer).
func (n *node) buildState(tid, bid string) string {
	code, b, _, err := n.Call("GET", "/templates/"+tid+"/builds/"+bid+"/status", n.key, "")
	var st struct {
		Status string `json:"status"`
	}
	if err != nil || code != http.StatusOK || json.Unmarshal(b, &st) != nil {
		return ""
	}
	return st.Status
}

// TestTemplateOnAnotherNode: a template built on node A is committed to the
// repository A shares with node B (a crash of A between the template's
// ready record and its commit's queue only delays the commit: the next
// start queues it), and B, which never built it, creates sandboxes from it
// by its name, bringing layers, snapshot and record from the repository
// (a crash of B after the fetch, before the record, leaves nothing).
func TestTemplateOnAnotherNode(t *testing.T) {
	a := sharedNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	r, err := posix.Open(filepath.Join(a.DataDir, "repository"), repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const name = "moved-template"
	var tid, bid string
	a.crashAt(t, "orchestrator/repository/template-ready", func() {
		tid, bid = a.buildFromBase(t, name, "echo built-on-a > /home/user/built.txt")
		for st := a.buildState(tid, bid); st != ""; st = a.buildState(tid, bid) {
			if st == "ready" || st == "error" {
				t.Fatalf("build %s ended %s without reaching its commit's fault point", bid, st)
			}
			time.Sleep(time.Second)
		}
	})
	t.Cleanup(func() { a.call(t, "DELETE", "/templates/"+tid, a.key, "") })
	if st := a.buildState(tid, bid); st != "ready" {
		t.Fatalf("build %s after the crash: %q, want ready (its record was)", bid, st)
	}
	m, err := r.Manifest(ctx, waitManifest(ctx, t, r, "template-"+tid+"-"))
	if err != nil {
		t.Fatal(err)
	}
	if m.Kind != repo.KindTemplate || m.Parent != "base" || len(m.Rootfs) < 2 || len(m.Memory) < 1 {
		t.Fatalf("manifest %s: kind %s, parent %q, %d rootfs and %d memory layers", m.Name, m.Kind, m.Parent, len(m.Rootfs), len(m.Memory))
	}

	b := repoPeer(ctx, t, "adtpl", 93, sharesRepo(a)...)
	b.crashAt(t, "orchestrator/import/template-fetched", func() {
		_, _, _, _ = b.Call("POST", "/sandboxes", b.key, `{"templateID":"`+tid+`","timeout":120}`)
	})
	if fileExists(filepath.Join(b.DataDir, "templates", tid)) {
		t.Fatalf("an import crashed before its record left template %s's files on node B", tid)
	}
	b.expect(t, http.StatusNotFound, "GET", "/templates/"+tid, b.key, "")
	id := b.create(t, `{"templateID":"`+name+`","timeout":120}`)
	if got := b.sh(t, id, "cat /home/user/built.txt"); got != "built-on-a" {
		t.Fatalf("a sandbox of %s on node B reads %q", name, got)
	}
	var tpl struct {
		TemplateID string   `json:"templateID"`
		Names      []string `json:"names"`
	}
	if err := json.Unmarshal(b.expect(t, http.StatusOK, "GET", "/templates/"+tid, b.key, ""), &tpl); err != nil || len(tpl.Names) != 1 || tpl.Names[0] != name {
		t.Fatalf("template %s on node B: %+v %v", tid, tpl, err)
	}
	// In use on B, then removable there; A keeps its own.
	b.expect(t, http.StatusConflict, "DELETE", "/templates/"+name, b.key, "")
	b.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, b.key, "")
	b.expect(t, http.StatusNoContent, "DELETE", "/templates/"+name, b.key, "")
	a.expect(t, http.StatusOK, "GET", "/templates/"+tid, a.key, "")
}
