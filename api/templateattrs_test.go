package api

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/disk/disktest"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/template"

	"github.com/agentenv/agentenv/oci"
	"github.com/agentenv/agentenv/orchestrator"
)

// TestTemplatePublicStored: PATCH /templates/{id} stores public; the
// template listing, the alias lookup and a handler started afresh on the
// same store report it.
func TestTemplatePublicStored(t *testing.T) {
	dir := t.TempDir()
	st := testStore(t, dir)
	o, err := orchestrator.New(t.Context(), orchestrator.Options{DataDir: dir, Store: st, Storage: disktest.Devices(t), VCPUs: 1, MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.EnableBuilds(t.Context(), template.ImageOptions{Pull: oci.Options{CacheDir: filepath.Join(dir, "oci")}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.CloseBuilds)
	handler := func() http.Handler {
		return NewHandler(Options{Orchestrator: o, Store: st, APIKey: testKey, DefaultTimeout: 15 * time.Second, MaxTimeout: time.Hour})
	}
	h := handler()
	w := do(h, "POST", "/v3/templates", testKey, `{"name":"pub-tpl"}`)
	var created wire.TemplateRequestResponseV3
	if err := json.Unmarshal(w.Body.Bytes(), &created); w.Code != http.StatusAccepted || err != nil || created.Public {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	publicIn := func(h http.Handler) (listed, alias bool) {
		t.Helper()
		var ts []wire.Template
		json.Unmarshal(do(h, "GET", "/v2/templates", testKey, "").Body.Bytes(), &ts)
		for _, tp := range ts {
			if tp.TemplateID == created.TemplateID {
				listed = tp.Public
			}
		}
		var a wire.TemplateAliasResponse
		json.Unmarshal(do(h, "GET", "/templates/aliases/pub-tpl", testKey, "").Body.Bytes(), &a)
		return listed, a.Public
	}
	if l, a := publicIn(h); l || a {
		t.Fatalf("a new template is public (listed %v, alias %v)", l, a)
	}
	w = do(h, "PATCH", "/templates/pub-tpl", testKey, `{"public":true}`)
	var upd wire.TemplateUpdateResponse
	if err := json.Unmarshal(w.Body.Bytes(), &upd); w.Code != 200 || err != nil || len(upd.Names) != 1 || upd.Names[0] != "pub-tpl" {
		t.Fatalf("PATCH: %d %s", w.Code, w.Body)
	}
	if l, a := publicIn(h); !l || !a {
		t.Errorf("after PATCH public=true: listed %v, alias %v", l, a)
	}
	if l, a := publicIn(handler()); !l || !a {
		t.Errorf("a fresh handler on the same store: listed %v, alias %v; want the stored flag", l, a)
	}
	do(h, "PATCH", "/templates/"+created.TemplateID, testKey, `{"public":false}`)
	if l, _ := publicIn(h); l {
		t.Error("PATCH public=false by id did not take")
	}
	w = do(h, "PATCH", "/templates/nosuch", testKey, `{"public":true}`)
	checkError(t, w)
	if w.Code != http.StatusNotFound {
		t.Errorf("PATCH of an unknown template: %d, want 404", w.Code)
	}
}
