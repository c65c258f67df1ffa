package sandboxcmd

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// fakeBuilds implements E2B's documented template build routes: the build
// logs two lines over two polls and ends with final.
func fakeBuilds(t *testing.T, final string) {
	t.Helper()
	var polls atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v3/templates", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Name     string `json:"name"`
			MemoryMB int    `json:"memoryMB"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		if req.Name != "py" || req.MemoryMB != 1024 {
			t.Errorf("create template %+v", req)
		}
		w.WriteHeader(202)
		fmt.Fprint(w, `{"templateID":"tpl1","buildID":"b1","names":["py"]}`)
	})
	mux.HandleFunc("POST /v2/templates/tpl1/builds/b1", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ FromImage string }
		_ = json.NewDecoder(r.Body).Decode(&req)
		if req.FromImage != "python:3.13" {
			t.Errorf("build %+v", req)
		}
		w.WriteHeader(202)
	})
	mux.HandleFunc("GET /templates/tpl1/builds/b1/status", func(w http.ResponseWriter, r *http.Request) {
		off := r.URL.Query().Get("logsOffset")
		switch polls.Add(1) {
		case 1:
			if off != "0" {
				t.Errorf("first poll offset %s", off)
			}
			fmt.Fprint(w, `{"status":"building","logEntries":[{"message":"pulling image"}]}`)
		default:
			if off != "1" {
				t.Errorf("second poll offset %s", off)
			}
			fmt.Fprintf(w, `{"status":%q,"logEntries":[{"message":"snapshot taken"}],"reason":{"message":"disk full"}}`, final)
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Setenv("HOME", t.TempDir())
	t.Setenv("AENV_URL", srv.URL)
	t.Setenv("AENV_API_KEY", "k")
}

func TestTemplateBuild(t *testing.T) {
	fakeBuilds(t, "ready")
	out, err := run("template", "build", "py", "--from-image", "python:3.13", "--memory", "1024", "--poll", "10ms", "-o", "json")
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	if !strings.Contains(out, "pulling image\nsnapshot taken\n") {
		t.Fatalf("build log not followed in order:\n%s", out)
	}
	var res struct{ TemplateID, BuildID, Status string }
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &res); err != nil || res.TemplateID != "tpl1" || res.Status != "ready" {
		t.Fatalf("build -o json %v:\n%s", err, out)
	}
}

func TestTemplateBuildFails(t *testing.T) {
	fakeBuilds(t, "error")
	_, err := run("template", "build", "py", "--from-image", "python:3.13", "--memory", "1024", "--poll", "10ms")
	if err == nil || !strings.Contains(err.Error(), "disk full") || !strings.Contains(err.Error(), "build b1 of template py failed") {
		t.Fatalf("failed build: %v", err)
	}
}

func TestTemplateBuildUnsupported(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(404)
		fmt.Fprintf(w, `{"code":404,"message":"no route %s"}`, r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	t.Setenv("HOME", t.TempDir())
	t.Setenv("AENV_URL", srv.URL)
	t.Setenv("AENV_API_KEY", "k")
	_, err := run("template", "build", "py", "--from-image", "x")
	if err == nil || !strings.Contains(err.Error(), "cannot build templates yet") {
		t.Fatalf("unsupported build: %v", err)
	}
}

// TestBuildFollowDrainsPages: a build that is ready with more log than one
// page is followed to the last line.
func TestBuildFollowDrainsPages(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v3/templates", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(202)
		fmt.Fprint(w, `{"templateID":"t","buildID":"b"}`)
	})
	mux.HandleFunc("POST /v2/templates/t/builds/b", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(202) })
	mux.HandleFunc("GET /templates/t/builds/b/status", func(w http.ResponseWriter, r *http.Request) {
		var entries []string
		switch r.URL.Query().Get("logsOffset") {
		case "0":
			for i := range 100 {
				entries = append(entries, fmt.Sprintf(`{"message":"line %d"}`, i))
			}
		case "100":
			entries = append(entries, `{"message":"the last line"}`)
		}
		fmt.Fprintf(w, `{"status":"ready","logEntries":[%s]}`, strings.Join(entries, ","))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Setenv("HOME", t.TempDir())
	t.Setenv("AENV_URL", srv.URL)
	t.Setenv("AENV_API_KEY", "k")
	out, err := run("template", "build", "x", "--from-image", "i", "--poll", "1ms")
	if err != nil || !strings.Contains(out, "line 99\nthe last line\n") {
		t.Fatalf("paged log: %v\n%s", err, out)
	}
}
