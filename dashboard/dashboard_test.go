package dashboard

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func get(t *testing.T, h http.Handler, path string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestHandlerServesPageWithStrictHeaders(t *testing.T) {
	h := Mount(http.NotFoundHandler(), nil)
	w := get(t, h, "/dashboard/")
	if w.Code != http.StatusOK {
		t.Fatalf("GET /dashboard/: %d", w.Code)
	}
	csp := w.Header().Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'none'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q", csp, want)
		}
	}
	if strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "unsafe-eval") {
		t.Errorf("CSP allows inline code: %q", csp)
	}
	if w.Header().Get("X-Content-Type-Options") != "nosniff" || w.Header().Get("Set-Cookie") != "" {
		t.Errorf("headers: %v", w.Header())
	}
	body := w.Body.String()
	if !strings.Contains(body, "AgentENV") {
		t.Errorf("page body: %q", body)
	}
	if Built() && !strings.Contains(body, `<script type="module" src="/dashboard/assets/`) {
		t.Errorf("built page loads no script: %q", body)
	}
	if !Built() && !strings.Contains(body, "make build") {
		t.Errorf("placeholder page does not say how to build: %q", body)
	}
	// A deep link (the page routes by hash, but a reload of any path works).
	if w := get(t, h, "/dashboard/sandboxes/x"); w.Code != http.StatusOK || w.Body.String() != body {
		t.Errorf("deep link: %d", w.Code)
	}
}

func TestHandlerRoutes(t *testing.T) {
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	sandbox := func(r *http.Request) bool { return r.Header.Get("E2b-Sandbox-Id") != "" }
	h := Mount(api, sandbox)
	if w := get(t, h, "/dashboard"); w.Code != http.StatusMovedPermanently || w.Header().Get("Location") != "/dashboard/" {
		t.Errorf("GET /dashboard: %d %q", w.Code, w.Header().Get("Location"))
	}
	if w := get(t, h, "/sandboxes"); w.Code != http.StatusTeapot {
		t.Errorf("GET /sandboxes went to the dashboard: %d", w.Code)
	}
	if w := get(t, h, "/dashboardx"); w.Code != http.StatusTeapot {
		t.Errorf("GET /dashboardx went to the dashboard: %d", w.Code)
	}
	if w := get(t, h, "/dashboard/", "E2b-Sandbox-Id", "abc"); w.Code != http.StatusTeapot {
		t.Errorf("sandbox traffic to /dashboard/ went to the dashboard: %d", w.Code)
	}
	r := httptest.NewRequest(http.MethodPost, "/dashboard/", nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /dashboard/: %d", w.Code)
	}
	if w := get(t, h, "/dashboard/../../etc/passwd"); w.Code != http.StatusOK || strings.Contains(w.Body.String(), "root:") {
		t.Errorf("path escape: %d", w.Code)
	}
}
