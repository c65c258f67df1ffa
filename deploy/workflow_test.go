package deploy

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The workflows run on GitHub, not here; this checks the policy they must
// keep: actions pinned to commit SHAs, read-only token, timeouts, no
// persisted credentials, and the CI and vulnerability-scan jobs present.

type workflow struct {
	Name        string            `yaml:"name"`
	On          map[string]any    `yaml:"on"`
	Permissions any               `yaml:"permissions"`
	Concurrency any               `yaml:"concurrency"`
	Env         map[string]string `yaml:"env"`
	Jobs        map[string]job    `yaml:"jobs"`
}

type job struct {
	Name           string            `yaml:"name"`
	RunsOn         any               `yaml:"runs-on"`
	TimeoutMinutes int               `yaml:"timeout-minutes"`
	Permissions    any               `yaml:"permissions"`
	Container      *jobContainer     `yaml:"container"`
	Env            map[string]string `yaml:"env"`
	Needs          any               `yaml:"needs"`
	If             string            `yaml:"if"`
	Steps          []step            `yaml:"steps"`
}

type jobContainer struct {
	Image   string `yaml:"image"`
	Options string `yaml:"options"`
}

type step struct {
	Name string            `yaml:"name"`
	Uses string            `yaml:"uses"`
	With map[string]any    `yaml:"with"`
	Run  string            `yaml:"run"`
	Env  map[string]string `yaml:"env"`
	If   string            `yaml:"if"`
}

var (
	pinnedAction = regexp.MustCompile(`^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+(/[A-Za-z0-9_./-]+)?@[0-9a-f]{40}$`)
	goRunPinned  = regexp.MustCompile(`go run \S+@v\d+\.\d+\.\d+\b`)
	goRunAny     = regexp.MustCompile(`go (run|install) \S+@\S+`)
)

func loadWorkflows(t *testing.T) map[string]workflow {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(repoRoot(t), ".github/workflows/*.y*ml"))
	if len(files) == 0 {
		t.Fatal("no workflows in .github/workflows")
	}
	out := map[string]workflow{}
	for _, f := range files {
		w, err := decodeWorkflow(mustRead(t, f))
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(f), err)
		}
		out[filepath.Base(f)] = w
	}
	return out
}

// readOnly reports whether a permissions value grants no write.
func readOnly(p any) bool {
	switch v := p.(type) {
	case string:
		return v == "read-all" || v == "{}"
	case map[string]any:
		for _, lvl := range v {
			if lvl != "read" && lvl != "none" {
				return false
			}
		}
		return true
	}
	return false
}

func TestWorkflowPolicy(t *testing.T) { checkWorkflows(t, loadWorkflows(t)) }

func decodeWorkflow(data []byte) (workflow, error) {
	var w workflow
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(&w)
	return w, err
}

func checkWorkflows(t reporter, ws map[string]workflow) {
	t.Helper()
	runs := map[string]bool{} // which required commands some job runs
	for file, w := range ws {
		perms, ok := w.Permissions.(map[string]any)
		if !ok || len(perms) != 1 || perms["contents"] != "read" {
			t.Errorf("%s: top-level permissions %v, want exactly {contents: read}", file, w.Permissions)
		}
		if _, ok := w.On["pull_request_target"]; ok {
			t.Errorf("%s: pull_request_target runs untrusted code with a privileged token", file)
		}
		if len(w.Jobs) == 0 {
			t.Errorf("%s: no jobs", file)
		}
		for name, j := range w.Jobs {
			where := file + ": job " + name
			if j.TimeoutMinutes <= 0 || j.TimeoutMinutes > 120 {
				t.Errorf("%s: timeout-minutes %d, want 1..120", where, j.TimeoutMinutes)
			}
			if j.Permissions != nil && !readOnly(j.Permissions) {
				t.Errorf("%s: permissions %v grant write", where, j.Permissions)
			}
			if j.Container != nil && !digestPinned.MatchString(j.Container.Image) {
				t.Errorf("%s: container image %q is not pinned by digest", where, j.Container.Image)
			}
			for i, s := range j.Steps {
				checkStep(t, where, i, s)
				for cmd, re := range map[string]*regexp.Regexp{
					".ci/run":     regexp.MustCompile(`(^|\s)(bash\s+)?\.ci/run\b`),
					"govulncheck": regexp.MustCompile(`golang\.org/x/vuln/cmd/govulncheck@`),
					"osv-scanner": regexp.MustCompile(`osv-scanner(/v\d+)?/cmd/osv-scanner@|osv-scanner-action`),
				} {
					if re.MatchString(s.Run) || re.MatchString(s.Uses) {
						runs[cmd] = true
					}
				}
			}
		}
	}
	for _, cmd := range []string{".ci/run", "govulncheck", "osv-scanner"} {
		if !runs[cmd] {
			t.Errorf("no workflow job runs %s", cmd)
		}
	}
}

func checkStep(t reporter, where string, i int, s step) {
	t.Helper()
	if s.Uses != "" && !strings.HasPrefix(s.Uses, "./") && !pinnedAction.MatchString(s.Uses) {
		t.Errorf("%s step %d: %s is not pinned to a 40-hex commit SHA", where, i, s.Uses)
	}
	if strings.HasPrefix(s.Uses, "actions/checkout@") {
		if v, ok := s.With["persist-credentials"]; !ok || v != false {
			t.Errorf("%s step %d: checkout without persist-credentials: false", where, i)
		}
	}
	for _, m := range goRunAny.FindAllString(s.Run, -1) {
		if !goRunPinned.MatchString(m) {
			t.Errorf("%s step %d: %q is not pinned to a version", where, i, m)
		}
	}
	if strings.Contains(s.Run, "${{ github.event") {
		t.Errorf("%s step %d: event data expanded into a shell script", where, i)
	}
}

type dependabot struct {
	Version int `yaml:"version"`
	Updates []struct {
		Ecosystem   string         `yaml:"package-ecosystem"`
		Directory   string         `yaml:"directory"`
		Directories []string       `yaml:"directories"`
		Schedule    map[string]any `yaml:"schedule"`
		Limit       int            `yaml:"open-pull-requests-limit"`
		Groups      map[string]any `yaml:"groups"`
	} `yaml:"updates"`
}

func TestDependabot(t *testing.T) {
	repo := repoRoot(t)
	var d dependabot
	dec := yaml.NewDecoder(bytes.NewReader(mustRead(t, filepath.Join(repo, ".github/dependabot.yml"))))
	dec.KnownFields(true)
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("dependabot.yml: %v", err)
	}
	if d.Version != 2 {
		t.Errorf("version %d, want 2", d.Version)
	}
	var ecos []string
	for _, u := range d.Updates {
		ecos = append(ecos, u.Ecosystem)
		if u.Schedule["interval"] == nil {
			t.Errorf("%s: no schedule interval", u.Ecosystem)
		}
		dirs := u.Directories
		if u.Directory != "" {
			dirs = append(dirs, u.Directory)
		}
		if len(dirs) == 0 {
			t.Errorf("%s: no directory", u.Ecosystem)
		}
		for _, dir := range dirs {
			if fi, err := os.Stat(filepath.Join(repo, dir)); err != nil || !fi.IsDir() {
				t.Errorf("%s: directory %s does not exist", u.Ecosystem, dir)
			}
		}
	}
	for _, want := range []string{"gomod", "npm", "github-actions", "docker"} {
		if !slices.Contains(ecos, want) {
			t.Errorf("no %s updates", want)
		}
	}
}
