package dashboardbench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/dashboard"
)

const (
	listed = 200
	key    = "e2b_benchbenchbenchbenchbenchbenchbenchbench"
)

// sandboxes are the listed sandboxes, newest first.
func sandboxes() []wire.ListedSandbox {
	now := time.Now()
	out := make([]wire.ListedSandbox, listed)
	for i := range out {
		md := map[string]string{"suite": "bench", "n": strconv.Itoa(i)}
		state := wire.Running
		if i%4 == 0 {
			state = wire.Paused
		}
		out[i] = wire.ListedSandbox{SandboxID: fmt.Sprintf("sbx%017d", i), TemplateID: "base", ClientID: "aenvd",
			StartedAt: now.Add(-time.Duration(i) * time.Second), EndAt: now.Add(time.Hour), CpuCount: 1, MemoryMB: 256,
			DiskSizeMB: 1024, State: state, EnvdVersion: "0.2.0", Metadata: &md}
	}
	return out
}

// listAPI answers the calls the sandboxes page makes.
func listAPI(list []wire.ListedSandbox) http.Handler {
	mux := http.NewServeMux()
	auth := func(h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-API-Key") != key {
				http.Error(w, `{"code":401,"message":"invalid or missing X-API-Key"}`, http.StatusUnauthorized)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			h(w, r)
		}
	}
	mux.HandleFunc("GET /v2/sandboxes", auth(func(w http.ResponseWriter, r *http.Request) {
		from, _ := strconv.Atoi(r.URL.Query().Get("nextToken"))
		to := min(from+100, len(list))
		if to < len(list) {
			w.Header().Set("X-Next-Token", strconv.Itoa(to))
		}
		_ = json.NewEncoder(w).Encode(list[from:to])
	}))
	mux.HandleFunc("GET /templates", auth(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode([]wire.Template{{TemplateID: "base", BuildID: "b1", CpuCount: 1, MemoryMB: 256, Aliases: []string{"base"}}})
	}))
	mux.HandleFunc("GET /nodes", auth(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("[]")) }))
	return dashboard.Mount(mux, nil)
}

// BenchmarkSandboxesPage200 prints the page load with 200 sandboxes listed
// as a ratio against a plain fetch of the list in the same browser.
func BenchmarkSandboxesPage200(b *testing.B) {
	if !dashboard.Built() {
		b.Skip("the dashboard's front end is not built: run make build")
	}
	_, file, _, _ := runtime.Caller(0)
	web := filepath.Join(filepath.Dir(file), "..", "..", "dashboard", "web")
	for _, p := range []string{"/usr/bin/chromium", filepath.Join(web, "node_modules", "playwright-core")} {
		if _, err := os.Stat(p); err != nil {
			b.Skipf("%s is missing: run .ci/setup.d/64-dashboard.sh", p)
		}
	}
	srv := httptest.NewServer(listAPI(sandboxes()))
	defer srv.Close()
	for b.Loop() {
		cmd := exec.Command("node", filepath.Join(web, "e2e", "pageload.mjs"))
		cmd.Dir = web
		cmd.Env = append(os.Environ(), "AENV_URL="+srv.URL, "AENV_API_KEY="+key, "AENV_LISTED="+strconv.Itoa(listed))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			b.Fatalf("pageload.mjs: %v\n%s", err, out.String())
		}
		var r struct{ Page, Ready, Fetch float64 }
		line := out.String()[strings.LastIndex(strings.TrimSpace(out.String()), "\n")+1:]
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.Fetch <= 0 {
			b.Fatalf("pageload.mjs answered %q: %v", out.String(), err)
		}
		b.ReportMetric(r.Page, "page-ms")
		b.ReportMetric(r.Fetch, "fetch-ms")
		b.ReportMetric(r.Page/r.Fetch, "page/fetch")
		b.Logf("sandboxes page with %d listed: median %.1f ms from navigation to the table drawn (%.1f ms to the page's script run); "+
			"plain fetch of the list: %.1f ms; ratio %.1f", listed, r.Page, r.Ready, r.Fetch, r.Page/r.Fetch)
	}
}
