// Package dashboard serves the web dashboard: a single-page front end
// (TypeScript under web/, built by `make build` into dist/ and embedded
// here) mounted at /dashboard/ on the API port of aenvd and aenv-gateway.
//
// The page holds no secret of its own: the user signs in with the node's
// API key, which the browser keeps in sessionStorage and sends in the
// X-API-Key header of every call to the same API the SDKs use. A cookie
// is never set, so another site cannot make the browser act on the API
// (no CSRF), and every response carries a strict Content-Security-Policy
// (scripts and styles from this origin only, no inline code, no frames).
package dashboard

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed all:dist
var dist embed.FS

// Prefix is where the dashboard is mounted.
const Prefix = "/dashboard"

// CSP is the Content-Security-Policy of every dashboard response: nothing
// but this origin's own files and API, no inline script or style, no
// plugins, no framing.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// notBuilt answers /dashboard/ in a binary built before the front end.
const notBuilt = `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>AgentENV dashboard</title></head>
<body><h1>AgentENV dashboard</h1><p>The dashboard's front end was not built into this binary.
Build it with <code>make build</code> (which runs <code>npm run build</code> in dashboard/web before <code>go build</code>).</p></body></html>
`

// Built reports whether the front end is embedded (not only the placeholder).
func Built() bool {
	_, err := fs.Stat(dist, "dist/index.html")
	return err == nil
}

// Handler serves the dashboard under Prefix: /dashboard redirects to
// /dashboard/, a path naming an embedded file serves it, and any other path
// under the prefix serves index.html (the page routes by its hash).
func Handler() http.Handler {
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		panic("dashboard: embedded dist: " + err.Error()) // cannot happen: the directory is embedded
	}
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", CSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if r.URL.Path == Prefix {
			http.Redirect(w, r, Prefix+"/", http.StatusMovedPermanently)
			return
		}
		name := strings.TrimPrefix(path.Clean(strings.TrimPrefix(r.URL.Path, Prefix)), "/")
		if name == "" || name == "README" || !isFile(sub, name) {
			serveIndex(w, r, sub)
			return
		}
		if strings.HasPrefix(name, "assets/") {
			h.Set("Cache-Control", "public, max-age=31536000, immutable") // names carry a content hash
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/" + name
		files.ServeHTTP(w, r2)
	})
}

// Match reports whether a request belongs to the dashboard.
func Match(r *http.Request) bool {
	return r.URL.Path == Prefix || strings.HasPrefix(r.URL.Path, Prefix+"/")
}

// Mount returns next with the dashboard served under Prefix in front of it.
// sandboxTraffic, when set, names the requests meant for a sandbox (by the
// E2b-Sandbox-Id header or a sandbox host name): those go to next whatever
// their path, so a sandbox's own /dashboard stays reachable.
func Mount(next http.Handler, sandboxTraffic func(*http.Request) bool) http.Handler {
	d := Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if Match(r) && (sandboxTraffic == nil || !sandboxTraffic(r)) {
			d.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func isFile(fsys fs.FS, name string) bool {
	st, err := fs.Stat(fsys, name)
	return err == nil && !st.IsDir()
}

func serveIndex(w http.ResponseWriter, r *http.Request, fsys fs.FS) {
	w.Header().Set("Cache-Control", "no-cache")
	b, err := fs.ReadFile(fsys, "index.html")
	if err != nil {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(notBuilt))
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(b)
}
