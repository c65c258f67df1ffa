package api

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/disk/disktest"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/template"
	"github.com/agentenv/agentenv/template/catalog"

	"github.com/agentenv/agentenv/oci"
	"github.com/agentenv/agentenv/orchestrator"
)

// TestTemplateBuildAPIWithoutVMs covers the template build routes that need
// no VM: create, names, files (present, upload under the client's key), status
// and its parameters, list, alias and delete, with E2B's error bodies.
func TestTemplateBuildAPIWithoutVMs(t *testing.T) {
	dir := t.TempDir()
	st := testStore(t, dir)
	o, err := orchestrator.New(t.Context(), orchestrator.Options{DataDir: dir, Store: st, Storage: disktest.Devices(t), VCPUs: 1, MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	h := NewHandler(Options{Orchestrator: o, APIKey: testKey, DefaultTimeout: 15 * time.Second, MaxTimeout: time.Hour})
	if w := do(h, "POST", "/v3/templates", testKey, `{"name":"x"}`); w.Code != http.StatusBadRequest {
		t.Fatalf("builds not enabled: %d %s", w.Code, w.Body)
	}
	if err := o.EnableBuilds(t.Context(), template.ImageOptions{Pull: oci.Options{CacheDir: filepath.Join(dir, "oci")}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.CloseBuilds)

	expect := func(method, path, body string, want int) *httptest.ResponseRecorder {
		t.Helper()
		w := do(h, method, path, testKey, body)
		if w.Code != want {
			t.Fatalf("%s %s: %d %s, want %d", method, path, w.Code, w.Body, want)
		}
		checkError(t, w)
		return w
	}
	var created wire.TemplateRequestResponseV3
	json.Unmarshal(expect("POST", "/v3/templates", `{"name":"my-tpl","tags":["v1"],"cpuCount":2,"memoryMB":512}`, http.StatusAccepted).Body.Bytes(), &created)
	if created.TemplateID == "" || created.BuildID == "" || created.Public || len(created.Names) != 1 || created.Names[0] != "my-tpl" ||
		len(created.Aliases) != 1 || len(created.Tags) != 1 {
		t.Fatalf("created: %+v", created)
	}
	var again wire.TemplateRequestResponseV3
	json.Unmarshal(expect("POST", "/v3/templates", `{"alias":"my-tpl"}`, http.StatusAccepted).Body.Bytes(), &again)
	if again.TemplateID != created.TemplateID || again.BuildID == created.BuildID {
		t.Fatalf("a second build of the same name: %+v", again)
	}
	expect("POST", "/v3/templates", `{"name":"bad/name"}`, http.StatusBadRequest)
	expect("POST", "/v3/templates", `{"name":"ok","memoryMB":16}`, http.StatusBadRequest)
	expect("POST", "/v3/templates", ``, http.StatusBadRequest)

	tid := created.TemplateID
	data := []byte("an archive")
	sum := sha256.Sum256(data)
	hash := hex.EncodeToString(sum[:])
	var up wire.TemplateBuildFileUpload
	json.Unmarshal(expect("GET", "/templates/"+tid+"/files/"+hash, "", http.StatusCreated).Body.Bytes(), &up)
	if up.Present || up.Url == nil || !strings.HasPrefix(*up.Url, "http://example.com/templates/"+tid+"/files/"+hash+"?token=") {
		t.Fatalf("files before upload: %+v", up)
	}
	// The URL is used as it is, with no X-API-Key (E2B's SDK does so); its
	// token is for this template and hash only.
	upload, _ := strings.CutPrefix(*up.Url, "http://example.com")
	other := strings.Repeat("0", 64)
	for _, bad := range []string{"/templates/" + tid + "/files/" + hash, "/templates/" + tid + "/files/" + hash + "?token=00",
		strings.Replace(upload, hash, other, 1)} {
		if w := do(h, "PUT", bad, "", string(data)); w.Code != http.StatusUnauthorized {
			t.Fatalf("PUT %s without a key: %d %s, want 401", bad, w.Code, w.Body)
		}
	}
	if w := do(h, "PUT", upload, "", string(data)); w.Code != http.StatusCreated {
		t.Fatalf("PUT to the upload URL without a key: %d %s", w.Code, w.Body)
	}
	json.Unmarshal(expect("GET", "/templates/"+tid+"/files/"+hash, "", http.StatusCreated).Body.Bytes(), &up)
	if !up.Present {
		t.Fatalf("files after upload: %+v", up)
	}
	expect("GET", "/templates/"+tid+"/files/XYZ", "", http.StatusBadRequest)
	expect("GET", "/templates/nosuch/files/"+hash, "", http.StatusNotFound)

	// A build naming no base is refused with a clear message (and stays
	// waiting).
	w := expect("POST", "/v2/templates/"+tid+"/builds/"+created.BuildID, `{}`, http.StatusBadRequest)
	if !strings.Contains(w.Body.String(), "fromImage") {
		t.Fatalf("build without a base: %s", w.Body)
	}
	var info wire.TemplateBuildInfo
	json.Unmarshal(expect("GET", "/templates/"+tid+"/builds/"+created.BuildID+"/status", "", http.StatusOK).Body.Bytes(), &info)
	if info.Status != "waiting" || info.LogEntries == nil || info.Logs == nil || info.Reason != nil {
		t.Fatalf("status: %+v", info)
	}
	expect("GET", "/templates/"+tid+"/builds/"+created.BuildID+"/status?level=loud", "", http.StatusBadRequest)
	expect("GET", "/templates/"+tid+"/builds/"+created.BuildID+"/status?limit=101", "", http.StatusBadRequest)
	expect("GET", "/templates/"+tid+"/builds/nosuch/status", "", http.StatusNotFound)

	var list []wire.Template
	json.Unmarshal(expect("GET", "/v2/templates", "", http.StatusOK).Body.Bytes(), &list)
	// Besides the template made here, the node's builtin templates are
	// listed, waiting for their first use.
	var mine []wire.Template
	for _, tp := range list {
		if tp.TemplateID == tid {
			mine = append(mine, tp)
		} else if len(tp.Aliases) != 1 || !catalog.IsBuiltin(tp.Aliases[0]) || tp.BuildStatus != "waiting" {
			t.Fatalf("list holds %+v, neither the template made here nor a builtin waiting", tp)
		}
	}
	if len(mine) != 1 || mine[0].BuildStatus != "waiting" || mine[0].Aliases[0] != "my-tpl" || mine[0].CpuCount != 1 {
		t.Fatalf("list: %+v", list)
	}
	var alias wire.TemplateAliasResponse
	json.Unmarshal(expect("GET", "/templates/aliases/my-tpl", "", http.StatusOK).Body.Bytes(), &alias)
	if alias.TemplateID != tid {
		t.Fatalf("alias: %+v", alias)
	}
	expect("GET", "/templates/aliases/nosuch", "", http.StatusNotFound)
	expect("DELETE", "/templates/my-tpl", "", http.StatusNoContent)
	expect("DELETE", "/templates/my-tpl", "", http.StatusNotFound)
	if w := do(h, "GET", "/v2/templates", "", ""); w.Code != http.StatusUnauthorized {
		t.Fatalf("list without a key: %d", w.Code)
	}
}
