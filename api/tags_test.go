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

// TestTemplateTags: E2B's tag routes over the stored attributes: a
// creation tag is listed, assign by name:tag, remove, errors.
func TestTemplateTags(t *testing.T) {
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
	h := NewHandler(Options{Orchestrator: o, Store: st, APIKey: testKey, DefaultTimeout: 15 * time.Second, MaxTimeout: time.Hour})
	expect := func(method, path, body string, want int) []byte {
		t.Helper()
		w := do(h, method, path, testKey, body)
		checkError(t, w)
		if w.Code != want {
			t.Fatalf("%s %s %s: %d %s, want %d", method, path, body, w.Code, w.Body, want)
		}
		return w.Body.Bytes()
	}
	var created wire.TemplateRequestResponseV3
	json.Unmarshal(expect("POST", "/v3/templates", `{"name":"tagged","tags":["v1"]}`, http.StatusAccepted), &created)
	tags := func() map[string]string {
		var out []wire.TemplateTag
		json.Unmarshal(expect("GET", "/templates/tagged/tags", "", 200), &out)
		m := map[string]string{}
		for _, tg := range out {
			m[tg.Tag] = tg.BuildID
		}
		return m
	}
	if got := tags(); len(got) != 1 || got["v1"] != created.BuildID {
		t.Fatalf("tags after create %v, want v1 -> %s", got, created.BuildID)
	}
	var as wire.AssignedTemplateTags
	json.Unmarshal(expect("POST", "/templates/tags", `{"target":"tagged:v1","tags":["stable","prod"]}`, 201), &as)
	if as.BuildID != created.BuildID || len(as.Tags) != 2 {
		t.Fatalf("assigned %+v", as)
	}
	if got := tags(); len(got) != 3 || got["stable"] != created.BuildID || got["prod"] != created.BuildID {
		t.Fatalf("tags %v", got)
	}
	expect("DELETE", "/templates/tags", `{"name":"tagged","tags":["v1","prod"]}`, 204)
	if got := tags(); len(got) != 1 || got["stable"] == "" {
		t.Fatalf("after removing v1 and prod: %v", got)
	}
	expect("DELETE", "/templates/tags", `{"name":"tagged","tags":["v1"]}`, 404)
	expect("POST", "/templates/tags", `{"target":"tagged:nosuch","tags":["x"]}`, 404)
	expect("POST", "/templates/tags", `{"target":"tagged","tags":["a b"]}`, 400)
	expect("POST", "/templates/tags", `{"target":"tagged","tags":[]}`, 400)
	expect("POST", "/templates/tags", `{"target":"nosuch","tags":["x"]}`, 404)
	expect("GET", "/templates/nosuch/tags", "", 404)
}
