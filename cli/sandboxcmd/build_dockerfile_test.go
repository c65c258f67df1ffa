package sandboxcmd

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/spf13/cobra"
)

// buildServer implements E2B's template build routes with file uploads;
// the build ends with final ("ready" or "error").
type buildServer struct {
	t       *testing.T
	mu      sync.Mutex
	final   string
	present map[string]bool   // hashes the node has
	uploads map[string][]byte // hash → archive
	spec    struct {
		FromImage    string `json:"fromImage"`
		FromTemplate string `json:"fromTemplate"`
		StartCmd     string `json:"startCmd"`
		ReadyCmd     string `json:"readyCmd"`
		Force        bool   `json:"force"`
		Steps        []struct {
			Type      string   `json:"type"`
			Args      []string `json:"args"`
			FilesHash string   `json:"filesHash"`
		} `json:"steps"`
	}
	started bool
}

func newBuildServer(t *testing.T, final string) *buildServer {
	s := &buildServer{t: t, final: final, present: map[string]bool{}, uploads: map[string][]byte{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v2/templates", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `[{"templateID":"t0base","aliases":["base"],"names":["base"]}]`)
	})
	mux.HandleFunc("POST /v3/templates", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(202)
		fmt.Fprint(w, `{"templateID":"tpl1","buildID":"b1","names":["web"]}`)
	})
	mux.HandleFunc("GET /templates/tpl1/files/{hash}", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		w.WriteHeader(201)
		h := r.PathValue("hash")
		if s.present[h] {
			fmt.Fprint(w, `{"present":true}`)
			return
		}
		fmt.Fprintf(w, `{"present":false,"url":"/templates/tpl1/files/%s"}`, h)
	})
	mux.HandleFunc("PUT /templates/tpl1/files/{hash}", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		sum := sha256.Sum256(b)
		if hex.EncodeToString(sum[:]) != r.PathValue("hash") || r.Header.Get("X-API-Key") != "k" || r.ContentLength != int64(len(b)) {
			t.Errorf("upload %s: body hash %x, key %q, length %d/%d", r.PathValue("hash"), sum, r.Header.Get("X-API-Key"), r.ContentLength, len(b))
		}
		s.mu.Lock()
		s.uploads[r.PathValue("hash")] = b
		s.mu.Unlock()
		w.WriteHeader(201)
	})
	mux.HandleFunc("POST /v2/templates/tpl1/builds/b1", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := json.NewDecoder(r.Body).Decode(&s.spec); err != nil {
			t.Errorf("build spec: %v", err)
		}
		s.started = true
		w.WriteHeader(202)
	})
	mux.HandleFunc("GET /templates/tpl1/builds/b1/status", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("logsOffset") == "0" {
			fmt.Fprint(w, `{"status":"building","logEntries":[{"level":"info","message":"RUN make","step":"3"},{"level":"warn","message":"slow"}]}`)
			return
		}
		fmt.Fprintf(w, `{"status":%q,"logEntries":[],"reason":{"message":"exit status 2","step":"3"}}`, s.final)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Setenv("HOME", t.TempDir())
	t.Setenv("AENV_URL", srv.URL)
	t.Setenv("AENV_API_KEY", "k")
	return s
}

func runBuild(args ...string) (string, error) {
	root := &cobra.Command{Use: "aenv", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(BuildCommand())
	root.AddCommand(Commands()...)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func tarNames(t *testing.T, b []byte) []string {
	t.Helper()
	var names []string
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
}

func TestBuildDockerfile(t *testing.T) {
	s := newBuildServer(t, "ready")
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"Dockerfile":    "FROM debian:12\nARG V=1\nLABEL x=y\nENV GREETING=hello\nWORKDIR /app\nCOPY app/ ./\nCOPY conf.yml /etc/\nCOPY again.yml /etc/conf.yml\nRUN make V=$V\nUSER user\nCMD [\"./server\", \"--port\", \"80\"]\n",
		"app/main.go":   "package main",
		"conf.yml":      "a: 1",
		"again.yml":     "a: 1",
		"ignored/x.txt": "x",
	})
	out, err := runBuild("build", dir, "--name", "web", "--build-arg", "V=2", "--memory", "1024", "--ready-cmd", "test -e /app", "--poll", "1ms", "-o", "json")
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, want := range []string{"warning: ", "LABEL ignored", "RUN make\nwarn: slow\n", `"templateID": "tpl1"`, `"status": "ready"`, "Uploaded COPY app"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	sp := s.spec
	if sp.FromImage != "debian:12" || sp.StartCmd != "./server --port 80" || sp.ReadyCmd != "test -e /app" {
		t.Errorf("spec %+v", sp)
	}
	var got []string
	hashes := map[string]string{}
	for _, st := range sp.Steps {
		got = append(got, st.Type+" "+strings.Join(st.Args, "|"))
		if st.Type == "COPY" {
			if st.FilesHash == "" || s.uploads[st.FilesHash] == nil {
				t.Errorf("COPY %v: hash %q not uploaded", st.Args, st.FilesHash)
			}
			hashes[st.Args[0]] = st.FilesHash
		}
	}
	want := []string{"USER root", "WORKDIR /", "ENV GREETING|hello", "WORKDIR /app", "COPY app|/app/||", "COPY conf.yml|/etc/||",
		"COPY again.yml|/etc/conf.yml||", "RUN export V=2; make V=$V", "USER user"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("steps:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if n := tarNames(t, s.uploads[hashes["app"]]); strings.Join(n, " ") != "app/ app/main.go" {
		t.Errorf("archive of app: %v", n)
	}

	// Again: the node has every archive now, nothing is uploaded.
	for h := range s.uploads {
		s.present[h] = true
	}
	s.uploads = map[string][]byte{}
	out, err = runBuild("build", dir, "--name", "web", "--build-arg", "V=2", "--poll", "1ms", "--no-cache")
	if err != nil {
		t.Fatalf("second build: %v\n%s", err, out)
	}
	if len(s.uploads) != 0 || !strings.Contains(out, "already on the node") || !s.spec.Force {
		t.Errorf("second build uploaded %d archives (force %v):\n%s", len(s.uploads), s.spec.Force, out)
	}
	if !strings.Contains(out, "TEMPLATE ID") || !strings.Contains(out, "tpl1") {
		t.Errorf("table output:\n%s", out)
	}
}

func TestBuildDockerfileFails(t *testing.T) {
	s := newBuildServer(t, "error")
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"Dockerfile": "FROM debian:12\nRUN false\n"})
	out, err := runBuild("build", dir, "--name", "web", "--poll", "1ms")
	if err == nil || !strings.Contains(err.Error(), "build b1 of template web failed: step 3: exit status 2") {
		t.Fatalf("failing build: %v\n%s", err, out)
	}
	if !s.started {
		t.Fatal("build not started")
	}
}

// TestBuildDockerfileBadInput: a bad Dockerfile or context fails before the
// server is asked to create anything.
func TestBuildDockerfileBadInput(t *testing.T) {
	s := newBuildServer(t, "ready")
	outside := t.TempDir()
	writeFiles(t, outside, map[string]string{"secret": "s"})
	tests := []struct {
		files map[string]string
		args  []string
		want  string
	}{
		{map[string]string{"Dockerfile": "FROM a\nHEALTHCHECK NONE\nSHELL [\"bash\"]"}, nil, "Dockerfile line 3: SHELL: not supported"},
		{map[string]string{"Dockerfile": "FROM a\nCOPY missing /x"}, nil, `Dockerfile line 2: COPY source "missing": no such file`},
		{map[string]string{"Dockerfile": "FROM a\nCOPY ../x /x"}, nil, "outside the build context"},
		{map[string]string{"Dockerfile": "FROM a\nCOPY link /x"}, nil, "outside the build context"},
		{map[string]string{"Dockerfile": "FROM a"}, []string{"--build-arg", "=x"}, "--build-arg"},
		{map[string]string{}, nil, "read the Dockerfile"},
		{map[string]string{"Dockerfile": "FROM a"}, []string{"--name", ""}, "--name is required"},
	}
	for _, tt := range tests {
		dir := t.TempDir()
		writeFiles(t, dir, tt.files)
		os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "link"))
		args := append([]string{"build", dir, "--name", "web"}, tt.args...)
		out, err := runBuild(args...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("build %v: %v, want %q\n%s", tt.files, err, tt.want, out)
		}
	}
	if s.started {
		t.Fatal("a build was started from bad input")
	}
}

func TestBuildDockerfileStdin(t *testing.T) {
	s := newBuildServer(t, "ready")
	root := &cobra.Command{Use: "aenv", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(BuildCommand())
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetIn(strings.NewReader("FROM alpine\nENTRYPOINT [\"/bin/srv\"]\nCMD [\"-v\"]\n"))
	root.SetArgs([]string{"build", "-f", "-", "--name", "x", "--start-cmd", "override", "--poll", "1ms"})
	if err := root.Execute(); err != nil {
		t.Fatalf("build from stdin: %v\n%s", err, out.String())
	}
	if s.spec.FromImage != "alpine" || s.spec.StartCmd != "override" {
		t.Fatalf("spec %+v", s.spec)
	}
}

func TestTemplateWatch(t *testing.T) {
	newBuildServer(t, "error")
	out, err := runBuild("template", "watch", "tpl1", "b1", "--poll", "1ms")
	if err == nil || !strings.Contains(err.Error(), "exit status 2") || !strings.Contains(out, "RUN make") {
		t.Fatalf("watch of a failing build: %v\n%s", err, out)
	}
}

// TestBuildDockerfileFromNodeTemplate: FROM naming one of the node's
// templates builds on it (fromTemplate), nothing pulled; another name is
// an image.
func TestBuildDockerfileFromNodeTemplate(t *testing.T) {
	for _, tc := range []struct{ from, image, template string }{
		{"base", "", "base"}, {"t0base", "", "t0base"}, {"debian:12", "debian:12", ""},
	} {
		s := newBuildServer(t, "ready")
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{"Dockerfile": "FROM " + tc.from + "\nRUN echo hi\n"})
		if out, err := runBuild("build", dir, "--name", "web", "--poll", "1ms"); err != nil {
			t.Fatalf("build FROM %s: %v\n%s", tc.from, err, out)
		}
		if s.spec.FromImage != tc.image || s.spec.FromTemplate != tc.template {
			t.Fatalf("FROM %s: build spec fromImage %q fromTemplate %q, want %q %q", tc.from, s.spec.FromImage, s.spec.FromTemplate, tc.image, tc.template)
		}
	}
}
